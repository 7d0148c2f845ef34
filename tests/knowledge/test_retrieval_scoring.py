"""/retrieval's scores under load: records the shared encoder cannot reach by the deadline keep a
capped score of their own, so an answer never waits on, or goes without, them."""

from __future__ import annotations

import time

import pytest

from fedresearch.core.models import FusedResult
from fedresearch.federation.runner import Deps
from fedresearch.knowledge.retrieval import calibrated_scores
from fedresearch.library.facade import Library
from tests.conftest import make_settings


def web_record(i: int, score: float) -> FusedResult:
    return FusedResult(
        key=f"k{i}",
        href=f"https://example.org/{i}",
        title=f"Result {i} on reciprocal rank fusion",
        body=f"Reciprocal rank fusion combines rankings from several retrievers, result {i}.",
        score=0.01,
        retrievers=["tavily"],
        ranks={"tavily": i + 1},
        source_scores={"tavily": score},
        kinds=["web"],
    )


@pytest.fixture
def deps(tmp_path, encoder):
    return Deps(session=None, settings=make_settings(tmp_path), library=Library(tmp_path / "lib", encoder=encoder))  # type: ignore[arg-type]


def test_records_are_scored_by_cosine_before_the_deadline(deps, encoder):
    records = [web_record(i, 0.99) for i in range(3)]
    scores = calibrated_scores("reciprocal rank fusion", records, deps, {}, ["tavily"], time.monotonic() + 60)
    query = encoder.encode(["reciprocal rank fusion"])[0]
    texts = [f"{r.title}\n{r.body}" for r in records]
    assert scores == pytest.approx([float(v @ query) for v in encoder.encode(texts)], abs=1e-5)


def test_past_the_deadline_records_keep_their_own_score_capped_at_the_lowest_cosine(deps):
    scored = [web_record(0, 0.99)]
    cosine = calibrated_scores("reciprocal rank fusion", scored, deps, {}, ["tavily"], None)[0]
    late = [web_record(0, 0.99), web_record(1, 0.99), web_record(2, 0.2)]
    scores = calibrated_scores("reciprocal rank fusion", late, deps, {}, ["tavily"], time.monotonic() - 1)
    # the first is cached from before (its cosine); the others were not embedded
    assert scores[0] == pytest.approx(cosine) and scores[1] == pytest.approx(cosine) and scores[2] == 0.2
    assert deps.library.text_vectors([f"{late[1].title}\n{late[1].body}"], time.monotonic() - 1) == [None]
