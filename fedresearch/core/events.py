"""Progress events: what the pipeline tells whoever is listening (the server turns them into frames)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ProgressEvent:
    step: str
    output: str
    metadata: dict[str, Any] | None = field(default=None)


Emit = Callable[[ProgressEvent], Awaitable[None]]


async def discard(_: ProgressEvent) -> None:
    return None
