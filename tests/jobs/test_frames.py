"""The wire protocol as types: every frame kind is the exact JSON text clients have always read, its
text is made once, a frame read back is sent again as it was stored, and every progress step the
server reports is a member of `ProgressStep`."""

from __future__ import annotations

import ast
import json
import typing
from pathlib import Path
from typing import Any

import pytest
import websockets

from fedresearch.core.events import ProgressStep
from fedresearch.jobs import frames as frames_module
from fedresearch.jobs.frames import (
    ChatFrame,
    ErrorFrame,
    Frame,
    LogsFrame,
    PathFrame,
    ReportFrame,
    WireFrame,
    decode,
    error_frames,
)
from fedresearch.jobs.local_store import LocalJobStore
from fedresearch.jobs.store import Job, JobStatus
from tests.conftest import make_settings, run_task

ROOT = Path(__file__).resolve().parents[2]
TEXT = '文献 “fusion” \u2028 ✓ \\ "quoted"\n'  # not ASCII, a JSON escape, a line separator
FILES = {"md": "reports/a.md", "pdf": "reports/a.pdf", "docx": "reports/a.docx", "html": "reports/a.html"}

# each frame kind built typed, and the dict the server built for it before frames were typed: its
# JSON text (json.dumps, ensure_ascii=False) is what the wire carries, byte for byte
KINDS: list[tuple[WireFrame, dict[str, Any]]] = [
    (
        LogsFrame(content=ProgressStep.retriever_done, output=TEXT, metadata={"n": [1, 2.5, None], "ok": True}),
        {"type": "logs", "content": "retriever_done", "output": TEXT, "metadata": {"n": [1, 2.5, None], "ok": True}},
    ),
    (
        LogsFrame(content=ProgressStep.warning, output="Task already running. Please wait."),
        {"type": "logs", "content": "warning", "output": "Task already running. Please wait.", "metadata": None},
    ),
    (ReportFrame(output=f"# {TEXT}\n\n"), {"type": "report", "output": f"# {TEXT}\n\n"}),
    (PathFrame(output=FILES), {"type": "path", "output": FILES}),
    (ErrorFrame(output=TEXT), {"type": "error", "content": "error", "output": TEXT}),
    (
        ChatFrame(content=TEXT, metadata={"searched": True}),
        {"type": "chat", "content": TEXT, "role": "assistant", "metadata": {"searched": True}},
    ),
    (ChatFrame(content="Ask"), {"type": "chat", "content": "Ask", "role": "assistant", "metadata": None}),
]


@pytest.mark.parametrize(("frame", "before"), KINDS)
def test_every_frame_kind_is_the_json_text_it_always_was_and_reads_back_the_same(
    frame: WireFrame, before: dict[str, Any]
) -> None:
    assert frame.text == json.dumps(before, ensure_ascii=False)
    back = decode(frame.text)
    assert type(back) is type(frame) and back == frame and back.text == frame.text


def test_the_cases_cover_every_kind_of_the_union() -> None:
    union, _ = typing.get_args(Frame)  # Annotated[union, discriminator]
    assert {type(frame) for frame, _ in KINDS} == set(typing.get_args(union))


def test_the_texts_are_pinned_byte_for_byte() -> None:
    """Literal texts, so that no change to how frames are encoded passes unseen."""
    error, logs = error_frames("boom ✓", {"research_id": "r1"})
    assert error.text == '{"type": "error", "content": "error", "output": "boom ✓"}'
    assert logs.text == '{"type": "logs", "content": "error", "output": "boom ✓", "metadata": {"research_id": "r1"}}'
    assert error_frames("x")[1].text == '{"type": "logs", "content": "error", "output": "x", "metadata": null}'
    assert PathFrame(output={"md": "reports/a.md"}).text == '{"type": "path", "output": {"md": "reports/a.md"}}'
    assert ChatFrame(content="a").text == '{"type": "chat", "content": "a", "role": "assistant", "metadata": null}'


def test_a_frame_read_back_is_sent_as_it_was_stored() -> None:
    """A job's frames kept by an earlier version (a logs frame without `metadata`, say) replay unchanged."""
    stored = '{"type": "logs", "content": "planning", "output": "sub-questions"}'
    frame = decode(stored)
    assert frame == LogsFrame(content=ProgressStep.planning, output="sub-questions") and frame.text is stored


@pytest.mark.parametrize(
    "text",
    [
        '{"type": "logs", "content": "no_such_step", "output": "x", "metadata": null}',
        '{"type": "telemetry", "output": "x"}',
        '{"type": "path", "output": "reports/a.md"}',
        '{"type": "report", "output": "x"',  # torn
        "[]",
    ],
)
def test_text_that_is_no_frame_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        decode(text)


def test_frames_never_change_once_made() -> None:
    frame = ReportFrame(output="x")
    with pytest.raises(ValueError):
        frame.output = "y"  # type: ignore[misc]


async def test_a_frames_text_is_made_once_for_the_store_and_every_send(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[object] = []

    class Counted(json.JSONEncoder):
        def encode(self, o: Any) -> str:
            made.append(o)
            return super().encode(o)

    monkeypatch.setattr(frames_module, "_ENCODER", Counted(ensure_ascii=False))
    store = LocalJobStore(tmp_path)
    await store.create(Job("0" * 32, "alice", "q", status=JobStatus.running))
    frame = LogsFrame(content=ProgressStep.fetching, output=TEXT)
    await store.append("0" * 32, frame)
    sent = [frame.text for _ in range(3)]  # three sockets following the job
    (kept,) = await store.frames("0" * 32)
    await store.finish("0" * 32, JobStatus.completed)  # the job's file gets the frame's text
    monkeypatch.undo()
    frame_dumps = [value for value in made if isinstance(value, dict) and value.get("type") == "logs"]
    assert len(frame_dumps) == 1 and kept is frame and sent == [frame.text] * 3
    line = (tmp_path / f"{'0' * 32}.job.jsonl").read_text(encoding="utf-8").split("\n")[1]
    assert line == f'{{"frame": {frame.text}}}'


def _steps_named(node: ast.Call) -> list[ast.expr]:
    """The step a ProgressEvent(...) or LogsFrame(...) call names, as written."""
    name = node.func.id if isinstance(node.func, ast.Name) else None
    if name == "ProgressEvent":
        return node.args[:1] + [kw.value for kw in node.keywords if kw.arg == "step"]
    if name == "LogsFrame":
        return [kw.value for kw in node.keywords if kw.arg == "content"]
    return []


def test_every_step_the_code_emits_is_a_member_of_progress_step() -> None:
    named: list[str] = []
    for path in sorted((ROOT / "fedresearch").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            for step in _steps_named(node):
                where = f"{path.relative_to(ROOT)}:{step.lineno}"
                if isinstance(step, ast.Attribute) and isinstance(step.value, ast.Name):
                    if step.value.id == "ProgressStep":
                        assert step.attr in ProgressStep.__members__, where
                        named.append(step.attr)
                        continue
                    if step.value.id == "event" and step.attr == "step":
                        continue  # a ProgressEvent's step, typed ProgressStep
                raise AssertionError(f"{where}: a step not named as a ProgressStep member")
    # every member is emitted somewhere (error by error_frames), and so is each step DESIGN.md names
    designed = {"starting_research", "planning", "retriever_started", "retriever_done", "retriever_failed"}
    designed |= {"retriever_skipped", "fetching", "merging", "writing_report", "verification", "error", "warning"}
    assert set(named) == set(ProgressStep.__members__) and designed <= set(named)
    assert all(step.value == step.name for step in ProgressStep)  # the wire says the member's name


async def test_every_logs_frame_of_a_task_names_a_progress_step(tmp_path, fakes, start_server) -> None:
    server = await start_server(make_settings(tmp_path, fakes))
    async with websockets.connect(server.ws_url) as ws:
        frames = await run_task(ws, {"task": "rank fusion", "headers": {"retrievers": "tavily,google,bing"}})
        frames += await run_task(ws, {"task": "rank fusion", "headers": {"retrievers": "tavily,google"}})
    steps = [frame["content"] for frame in frames if frame["type"] == "logs"]
    assert {"error", "starting_research", "retriever_done", "report_written"} <= set(steps)
    assert all(step in ProgressStep.__members__ for step in steps)
