"""A throwaway adapter, written the way every adapter is: one module, pure steps, an `About`.

It searches GPT-Researcher's `custom` retriever contract (GET ?query= answering [{url, raw_content}]),
declares itself scholarly, and reads one per-request key of its own; it has no operator settings, so
its `About` names none (the default settings class, `UpstreamSettings`, has no fields).
"""

from __future__ import annotations

from typing import Any

from fedresearch.core.models import SearchResult
from fedresearch.federation.contract import (
    About,
    Answer,
    Hits,
    HttpAnswer,
    HttpRequest,
    RetrieverSkipped,
    SearchOptions,
    http_error,
)

about = About(
    website="https://lab.example", kind="scholarly", needs_key=True, needs_user=False, credentials=("lab_token",)
)


class LabSearch:
    name = "lab"
    label = "Lab search"
    about = about

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.seen_credentials: list[dict[str, str]] = []

    def missing_setup(self) -> str | None:
        return "send headers.lab_token"

    def build_request(self, options: SearchOptions) -> HttpRequest:
        self.seen_credentials.append(dict(options.credentials))
        token = options.credential("lab_token")
        if token is None:
            raise RetrieverSkipped("no lab token: send headers.lab_token")
        return HttpRequest(
            "GET", f"{self.base_url}/search", params={"query": options.query}, headers={"x-token": token}
        )

    def parse_response(self, answer: Answer, options: SearchOptions) -> Hits:
        assert isinstance(answer, HttpAnswer)
        items: list[dict[str, Any]] = answer.payload
        return Hits([SearchResult(href=i["url"], body=i["raw_content"], retriever=self.name, rank=1) for i in items])

    def describe_error(self, answer: HttpAnswer) -> str:
        return http_error(self.label, answer)
