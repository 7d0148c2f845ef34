"""The frames the server sends (GPT-Researcher's WebSocket protocol, docs/protocol.md): one model for each
`type`, the union `Frame` of them all, and their JSON text, made in one place (`WireFrame.text`).
A job's frames go through its store (store.py) to every follower; chat frames go to their socket
alone. The text is what json.dumps(ensure_ascii=False) makes of the frame's fields in their order,
the text GPT-Researcher's clients have always read: pydantic's own JSON has no spaces after `:`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from fedresearch.core.events import ProgressStep

# json.dumps(value, ensure_ascii=False) makes an encoder for each call: 0.6 µs of a frame's 3
_ENCODER = json.JSONEncoder(ensure_ascii=False)


class WireFrame(BaseModel):
    """A frame as the server sends it; it never changes once made. Its JSON text is made once, the
    first time it is asked for (by the Redis job store as the frame is emitted, else by the first
    socket that sends it or the job's file), and kept: the job's file or Redis stores that text and
    every socket sends it, where each encoded the frame again (the job file's copy alone was 1.6% of
    the server's GIL samples under bench load)."""

    model_config = ConfigDict(frozen=True)
    # a slot, neither a field nor a private attribute: equality and the encoding ignore it
    __slots__ = ("_text",)
    if TYPE_CHECKING:
        _text: str | None

    def model_post_init(self, context: Any, /) -> None:
        # set whenever pydantic makes a frame: reading a slot never set is a miss that pydantic's
        # __getattr__ answers, 1.6 µs a frame
        object.__setattr__(self, "_text", None)  # frozen: its __setattr__ refuses

    @property
    def text(self) -> str:
        """The frame's JSON text on the wire, made once."""
        text: str | None = getattr(self, "_text", None)  # None too for a copy (model_copy sets no slot)
        if text is None:
            # its fields in their order, as they are: model_dump would first copy each value (0.8 µs)
            text = _ENCODER.encode(vars(self))
            object.__setattr__(self, "_text", text)
        return text


class LogsFrame(WireFrame):
    """A step of the task (`content`), said for a person (`output`), with its details."""

    type: Literal["logs"] = "logs"
    content: ProgressStep
    output: str
    metadata: dict[str, Any] | None = None


class ReportFrame(WireFrame):
    """A chunk of the report, ending on a paragraph's end; the chunks in order are the whole report."""

    type: Literal["report"] = "report"
    output: str


class PathFrame(WireFrame):
    """A task's last frame: where its saved files are, each format's URL path from the server's origin."""

    type: Literal["path"] = "path"
    output: dict[str, str]


class ErrorFrame(WireFrame):
    """An error, always followed by a `logs` frame that says it too (`error_frames`)."""

    type: Literal["error"] = "error"
    content: Literal["error"] = "error"
    output: str


class ChatFrame(WireFrame):
    """The answer to a `chat` command."""

    type: Literal["chat"] = "chat"
    content: str
    role: Literal["assistant"] = "assistant"
    metadata: dict[str, Any] | None = None


Frame = Annotated[LogsFrame | ReportFrame | PathFrame | ErrorFrame | ChatFrame, Field(discriminator="type")]

_FRAME: TypeAdapter[Frame] = TypeAdapter(Frame)


def decode(text: str) -> Frame:
    """A frame read back from where a job's frames are kept; its text is the one it was kept as, so
    it is sent again as it was first sent. ValueError (pydantic's ValidationError) when `text` is no frame."""
    frame = _FRAME.validate_json(text)
    object.__setattr__(frame, "_text", text)
    return frame


def error_frames(message: str, metadata: dict[str, Any] | None = None) -> list[Frame]:
    """An error as a job's frames say it: GPT-Researcher's page shows only logs frames, so both ways."""
    return [ErrorFrame(output=message), LogsFrame(content=ProgressStep.error, output=message, metadata=metadata)]
