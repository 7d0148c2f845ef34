"""A crash of our own code fails the test that reaches it, even where the server goes on.

The server logs an exception it did not expect with its traceback and keeps serving (a task ends
with "internal error", a socket drops the frame, an adapter's crash becomes a failed retriever), so
a test that checks only what the client sees could pass over a bug. Every record logged at ERROR
with a traceback by fedresearch's loggers during a test fails it, unless the test is marked
`@pytest.mark.tracebacks` (it provokes one on purpose and says so).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


class _Tracebacks(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and (record.name == "fedresearch" or record.name.startswith("fedresearch.")):
            self.records.append(record)


@pytest.fixture(autouse=True)
def no_unexpected_tracebacks(request: pytest.FixtureRequest) -> Iterator[None]:
    handler = _Tracebacks()
    root = logging.getLogger()  # every fedresearch logger propagates here
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
    if not handler.records or request.node.get_closest_marker("tracebacks") is not None:
        return
    said = "\n".join(f"{r.name}: {r.getMessage()} ({r.exc_info[1]!r})" for r in handler.records if r.exc_info)
    pytest.fail(f"our code logged {len(handler.records)} traceback(s):\n{said}", pytrace=False)
