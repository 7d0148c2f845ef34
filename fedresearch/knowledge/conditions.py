"""Dify's `metadata_condition`, applied to each record's metadata.

Operators (Dify External Knowledge API): contains, not contains, start with, end with, is, is not,
empty, not empty, in, not in, =, ≠, >, <, ≥, ≤, before, after. Text operators ignore case; `is`
is exact; numbers compare as numbers; `before`/`after` compare ISO dates or years. A condition
whose `name` is a list holds when any named field satisfies it; a list-valued field (authors,
tags, retrievers) satisfies it when any element does (and `not ...` when no element does).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

_ALIASES = {
    "!=": "≠",
    ">=": "≥",
    "<=": "≤",
    "==": "=",
    "not_contains": "not contains",
    "start_with": "start with",
    "end_with": "end with",
    "is_not": "is not",
    "not_empty": "not empty",
    "not_in": "not in",
}


def _text(value: Any) -> str:
    return str(value).casefold()


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _date(value: Any) -> date | None:
    if isinstance(value, datetime):
        return value.date()
    if isinstance(value, date):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < 10000:
        return date(int(value), 1, 1)
    text = str(value or "").strip()
    if len(text) == 4 and text.isdigit():
        return date(int(text), 1, 1)
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).date()
    except ValueError:
        return None


def _listed(value: Any) -> list[Any]:
    if isinstance(value, list | tuple | set):
        return list(value)
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return [value]


def _is_empty(value: Any) -> bool:
    return value is None or value == "" or value == [] or value == {}


def _compare(number_test: Callable[[float, float], bool]) -> Callable[[Any, Any], bool]:
    def test(field: Any, value: Any) -> bool:
        a, b = _number(field), _number(value)
        return a is not None and b is not None and number_test(a, b)

    return test


def _dates(date_test: Callable[[date, date], bool]) -> Callable[[Any, Any], bool]:
    def test(field: Any, value: Any) -> bool:
        a, b = _date(field), _date(value)
        return a is not None and b is not None and date_test(a, b)

    return test


def _equal(field: Any, value: Any) -> bool:
    a, b = _number(field), _number(value)
    if a is not None and b is not None:
        return a == b
    return str(field) == str(value)


# Positive tests on one scalar; negations are derived so lists behave ("no element matches").
_POSITIVE: dict[str, Callable[[Any, Any], bool]] = {
    "contains": lambda field, value: _text(value) in _text(field),
    "start with": lambda field, value: _text(field).startswith(_text(value)),
    "end with": lambda field, value: _text(field).endswith(_text(value)),
    "is": _equal,
    "in": lambda field, value: any(_equal(field, option) for option in _listed(value)),
    "=": _compare(lambda a, b: a == b),
    ">": _compare(lambda a, b: a > b),
    "<": _compare(lambda a, b: a < b),
    "≥": _compare(lambda a, b: a >= b),
    "≤": _compare(lambda a, b: a <= b),
    "before": _dates(lambda a, b: a < b),
    "after": _dates(lambda a, b: a > b),
}
_NEGATED = {"not contains": "contains", "is not": "is", "not in": "in", "≠": "="}
OPERATORS = (*_POSITIVE, *_NEGATED, "empty", "not empty")


class Condition(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: list[str]
    comparison_operator: str
    value: Any = None

    @field_validator("name", mode="before")
    @classmethod
    def _names(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("comparison_operator", mode="before")
    @classmethod
    def _known(cls, value: Any) -> Any:
        operator = _ALIASES.get(str(value).strip(), str(value).strip())
        if operator not in OPERATORS:
            raise ValueError(f"unknown operator {value!r}; known: {', '.join(OPERATORS)}")
        return operator

    def holds(self, metadata: dict[str, Any]) -> bool:
        return any(self._holds_for(metadata.get(name)) for name in self.name)

    def _holds_for(self, field: Any) -> bool:
        operator = self.comparison_operator
        if operator in ("empty", "not empty"):
            return _is_empty(field) == (operator == "empty")
        if field is None:
            return operator in _NEGATED
        values = field if isinstance(field, list | tuple) else [field]
        if operator in _NEGATED:
            test = _POSITIVE[_NEGATED[operator]]
            return not any(test(item, self.value) for item in values)
        return any(_POSITIVE[operator](item, self.value) for item in values)


class MetadataCondition(BaseModel):
    model_config = ConfigDict(extra="ignore")

    logical_operator: Literal["and", "or"] = "and"
    conditions: list[Condition] = Field(default_factory=list)

    @field_validator("logical_operator", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return "and" if value is None else str(value).strip().lower()

    def holds(self, metadata: dict[str, Any]) -> bool:
        if not self.conditions:
            return True
        results = (condition.holds(metadata) for condition in self.conditions)
        return all(results) if self.logical_operator == "and" else any(results)
