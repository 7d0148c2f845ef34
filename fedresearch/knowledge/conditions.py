"""Dify's `metadata_condition`, applied to each record's metadata.

Operators (Dify External Knowledge API): contains, not contains, start with, end with, is, is not,
empty, not empty, in, not in, =, ≠, >, <, ≥, ≤, before, after. Text operators ignore case; `is`
is exact; numbers compare as numbers; `before`/`after` compare instants: Unix seconds (what Dify's
date picker sends), ISO dates or years. A condition whose value is null is skipped, as Dify's own
filter skips it, except `empty` / `not empty`; `conditions: null` means no condition. A condition
whose `name` is a list holds when any named field satisfies it; a list-valued field (authors,
tags, retrievers) satisfies it when any element does (and `not ...` when no element does).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, date, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# bounds on what one request may ask to evaluate (each condition runs against every candidate)
MAX_CONDITIONS = 64
MAX_NAMES = 16
MAX_VALUES = 256
MAX_TEXT = 1000

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


def _instant(value: Any) -> float | None:
    """Unix seconds (UTC) of a date: what Dify's date picker sends (`date.unix()`), an ISO date or
    datetime, or a year (a number below 10000 is a year, not 1970 plus seconds)."""
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day, tzinfo=UTC).timestamp()
    number = _number(value)
    if number is not None and math.isfinite(number):
        return datetime(int(number), 1, 1, tzinfo=UTC).timestamp() if 0 < number < 10000 else number
    try:
        return _instant(datetime.fromisoformat(str(value or "").strip().replace("Z", "+00:00")))
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


def _dates(instant_test: Callable[[float, float], bool]) -> Callable[[Any, Any], bool]:
    def test(field: Any, value: Any) -> bool:
        a, b = _instant(field), _instant(value)
        return a is not None and b is not None and instant_test(a, b)

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

    name: list[Annotated[str, Field(max_length=MAX_TEXT)]] = Field(min_length=1, max_length=MAX_NAMES)
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

    @field_validator("value")
    @classmethod
    def _bounded(cls, value: Any) -> Any:
        items = value if isinstance(value, list) else [value]
        if len(items) > MAX_VALUES:
            raise ValueError(f"at most {MAX_VALUES} values in one condition")
        if any(isinstance(item, dict | list) for item in items):
            raise ValueError("a value is a string, a number, null or a list of those")
        if any(len(str(item)) > MAX_TEXT for item in items):
            raise ValueError(f"a value is at most {MAX_TEXT} characters")
        return value

    @property
    def skipped(self) -> bool:
        """Dify's own filter skips a condition left without a value (manual mode left empty)."""
        return self.value is None and self.comparison_operator not in ("empty", "not empty")

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
    conditions: list[Condition] = Field(default_factory=list, max_length=MAX_CONDITIONS)

    @field_validator("conditions", mode="before")
    @classmethod
    def _null_conditions(cls, value: Any) -> Any:
        return [] if value is None else value  # Dify's model default

    @field_validator("logical_operator", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return "and" if value is None else str(value).strip().lower()

    @property
    def active(self) -> list[Condition]:
        return [condition for condition in self.conditions if not condition.skipped]

    def holds(self, metadata: dict[str, Any]) -> bool:
        conditions = self.active
        if not conditions:
            return True
        results = (condition.holds(metadata) for condition in conditions)
        return all(results) if self.logical_operator == "and" else any(results)
