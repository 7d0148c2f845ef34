"""Number sources in order of first citation; References list exactly the cited ones, each a full
entry in the report's citation style (report/styles.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from fedresearch.core.citation_styles import DEFAULT_STYLE
from fedresearch.core.identifiers import is_url
from fedresearch.core.models import FusedResult
from fedresearch.report.bibliography import citation_of
from fedresearch.report.markup import link_target
from fedresearch.report.styles import entries


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


def reference_entries(
    references: Sequence[Reference], style: str | None = None, language: str = "en"
) -> list[tuple[Reference, str]]:
    """Each reference with its entry, one line of Markdown in `style` (APA when None); a web page
    is cited as read today."""
    today = datetime.now(UTC).date()
    citations = [citation_of(reference.source, accessed=today) for reference in references]
    return list(zip(references, entries(citations, style or DEFAULT_STYLE, language), strict=True))
