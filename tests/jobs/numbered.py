"""Frames that say their number, for checking that followers get every frame once, in order."""

from __future__ import annotations

from fedresearch.core.events import ProgressStep
from fedresearch.jobs.frames import Frame, LogsFrame


def job_id(n: int) -> str:
    return f"{n:032x}"


def numbered(n: int) -> LogsFrame:
    """A frame that says its number, and some text that ASCII cannot."""
    return LogsFrame(content=ProgressStep.fetching, output="文献 ✓", metadata={"n": n})


def number_of(frame: Frame) -> int:
    assert isinstance(frame, LogsFrame) and frame.metadata is not None
    return int(frame.metadata["n"])
