"""Number sources in order of first citation; References list exactly the cited ones."""

from __future__ import annotations

from dataclasses import dataclass, field

from fedresearch.core.identifiers import is_url
from fedresearch.core.models import FusedResult
from fedresearch.report.markup import link_target


@dataclass(frozen=True)
class Reference:
    number: int
    title: str
    link: str
    retrievers: list[str]
    source: FusedResult

    @property
    def target(self) -> str:
        return link_target(self.link)


@dataclass
class Citations:
    _numbers: dict[str, int] = field(default_factory=dict)
    references: list[Reference] = field(default_factory=list)

    def cite(self, source: FusedResult) -> int:
        number = self._numbers.get(source.key)
        if number is None:
            number = len(self.references) + 1
            self._numbers[source.key] = number
            self.references.append(
                Reference(number, display_title(source), source.href, list(source.retrievers), source)
            )
        return number


def display_title(source: FusedResult) -> str:
    title = " ".join(source.title.split()) or (source.href if is_url(source.href) else "Untitled")
    return title.replace("[", "(").replace("]", ")")
