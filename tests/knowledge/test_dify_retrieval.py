"""POST /retrieval as Dify calls it: errors, probes, scores, filters and tenancy, over real HTTP."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Literal

import aiohttp
import pytest
from pydantic import BaseModel

from fedresearch.knowledge.conditions import MetadataCondition
from fedresearch.library.facade import Library
from fedresearch.library.ingest import ingest
from tests.conftest import EXAMPLES, make_settings

KEYS = "admin-key:*,alice-key:alice,bob-key:bob"


@pytest.fixture
async def dify(tmp_path, fakes, start_server, encoder, monkeypatch):
    monkeypatch.setenv("PAPERS_KB_KEY", "papers-only-key")
    bases = tmp_path / "knowledge.toml"
    bases.write_text(
        """
[knowledge_bases.papers]
user_id = "alice"
retrievers = ["internal_biblio", "internal_highlight"]
top_k = 3
api_keys = ["env:PAPERS_KB_KEY"]

[knowledge_bases.papers_and_web]
user_id = "alice"
retrievers = ["internal_biblio", "tavily"]
weights = { tavily = 0.8 }

[knowledge_bases.bobs]
user_id = "bob"
retrievers = ["internal_biblio", "internal_highlight"]

[knowledge_bases.web_only]
user_id = "alice"
retrievers = ["tavily"]
timeout_s = 0.5

[knowledge_bases.papers_notes]
user_id = "alice"
retrievers = ["internal_highlight"]
api_keys = ["env:PAPERS_KB_KEY"]
"""
    )
    settings = make_settings(tmp_path, fakes, api_keys=KEYS, knowledge_bases=bases)
    library = Library(settings.library_dir, encoder=encoder)
    ingest(library, "alice", [EXAMPLES])
    secret = tmp_path / "bob.md"
    secret.write_text("# Bob's lab\n\nOur unpublished rank fusion trick weights the top result by three.\n")
    ingest(library, "bob", [secret])
    server = await start_server(settings)
    async with aiohttp.ClientSession() as session:

        async def call(body, key="alice-key", path="/retrieval", raw=None):
            headers = {"Authorization": key if key is None or " " in key else f"Bearer {key}"} if key else {}
            data = raw if raw is not None else json.dumps(body)
            async with session.post(server.url + path, data=data, headers=headers) as response:
                text = await response.text()
                return response.status, json.loads(text) if text else None, text

        call.fakes = fakes  # type: ignore[attr-defined]
        yield call


def body(query="reciprocal rank fusion", knowledge_id="papers", **setting):
    return {
        "knowledge_id": knowledge_id,
        "query": query,
        "retrieval_setting": {"top_k": setting.get("top_k", 3), "score_threshold": setting.get("threshold", 0.0)},
        **({"metadata_condition": setting["condition"]} if "condition" in setting else {}),
    }


async def test_records_have_dify_shape_sorted_and_cut(dify):
    status, answer, _ = await dify(body(top_k=2))
    assert status == 200
    records = answer["records"]
    assert len(records) == 2
    assert records[0]["score"] >= records[1]["score"]
    for record in records:
        assert set(record) == {"content", "score", "title", "metadata"}
        assert isinstance(record["metadata"], dict) and 0.0 <= record["score"] <= 1.0
        assert record["metadata"]["href"] and record["metadata"]["retrievers"]
    assert records[0]["metadata"]["doi"] == "10.1145/1571941.1572114"


async def test_top_k_null_uses_the_knowledge_base_default(dify):
    request = body()
    request["retrieval_setting"]["top_k"] = None
    status, answer, _ = await dify(request)
    assert status == 200 and len(answer["records"]) == 3


async def test_threshold_keeps_strong_matches_and_drops_weak_ones(dify):
    _, strong, _ = await dify(body("reciprocal rank fusion of rankings", threshold=0.5))
    assert strong["records"] and all(r["score"] >= 0.5 for r in strong["records"])
    _, weak_all, _ = await dify(body("chocolate cake with strawberries", threshold=0.0))
    _, weak_cut, _ = await dify(body("chocolate cake with strawberries", threshold=0.5))
    assert weak_all["records"] and weak_cut["records"] == []


async def test_registration_probes(dify):
    assert (await dify(None, key=None, raw=b""))[:2] == (200, {"records": []})
    probe = {"knowledge_id": "", "query": "", "retrieval_setting": {"top_k": 2, "score_threshold": 0.5}}
    assert (await dify(probe))[:2] == (200, {"records": []})
    assert (await dify(None, raw=b""))[:2] == (200, {"records": []})
    status, answer, _ = await dify(probe, key="wrong-key")
    assert status == 403 and answer["error_code"] == 1002


async def test_error_codes_and_keys_never_echoed(dify):
    status, answer, text = await dify(body(), key=None)
    assert (status, answer["error_code"]) == (403, 1001)
    status, answer, text = await dify(body(), key="Basic alice-key")
    assert (status, answer["error_code"]) == (403, 1001) and "alice-key" not in text
    status, answer, text = await dify(body(), key="sk-secret-wrong")
    assert (status, answer["error_code"]) == (403, 1002) and "sk-secret-wrong" not in text
    status, answer, _ = await dify(body(knowledge_id="nope"))
    assert (status, answer["error_code"]) == (404, 2001)
    status, answer, _ = await dify(None, raw=b"{not json")
    assert status == 400
    status, answer, _ = await dify({"knowledge_id": "papers", "retrieval_setting": {"top_k": 3}})
    assert status == 400 and "query" in answer["error_msg"]
    status, answer, _ = await dify(body(top_k="many"))
    assert status == 400 and "retrieval_setting.top_k" in answer["error_msg"]
    bad = {"logical_operator": "and", "conditions": [{"name": "year", "comparison_operator": "near", "value": 1}]}
    status, answer, _ = await dify(body(condition=bad))
    assert status == 400 and "near" in answer["error_msg"]


async def test_double_slash_path_from_a_trailing_slash_endpoint(dify):
    status, answer, _ = await dify(body(), path="//retrieval")
    assert status == 200 and answer["records"]


async def test_library_plus_web_federation(dify):
    status, answer, _ = await dify(body("rank fusion combines lexical and dense retrieval", "papers_and_web", top_k=10))
    assert status == 200
    found = {name for record in answer["records"] for name in record["metadata"]["retrievers"]}
    assert found == {"internal_biblio", "tavily"}
    web = [r for r in answer["records"] if "tavily" in r["metadata"]["retrievers"]]
    assert web[0]["metadata"]["href"].startswith("https://example.org/tavily/")
    assert all(r["score"] <= 0.8 for r in web)  # tavily weighs 0.8 of the largest weight: its scores are scaled


async def test_metadata_condition_over_http(dify):
    condition = {
        "logical_operator": "and",
        "conditions": [
            {"name": ["year"], "comparison_operator": "≥", "value": "2019"},
            {"name": "authors", "comparison_operator": "contains", "value": "khattab"},
        ],
    }
    status, answer, _ = await dify(body("passage retrieval with BERT", condition=condition, top_k=10))
    assert status == 200 and answer["records"]
    assert all("Omar Khattab" in r["metadata"]["authors"] for r in answer["records"])
    either = {
        "logical_operator": "or",
        "conditions": [
            {"name": "year", "comparison_operator": "<", "value": 1980},
            {"name": "year", "comparison_operator": ">", "value": 2022},
        ],
    }
    _, answer, _ = await dify(body("retrieval", condition=either, top_k=10))
    assert answer["records"] and all(
        r["metadata"]["year"] < 1980 or r["metadata"]["year"] > 2022 for r in answer["records"]
    )


async def test_cross_tenant(dify):
    status, answer, _ = await dify(body(knowledge_id="papers"), key="papers-only-key")
    assert status == 200 and answer["records"]
    # another tenant's knowledge base answers exactly as an unknown id: ids cannot be probed
    status, answer, _ = await dify(body(knowledge_id="papers_and_web"), key="papers-only-key")
    assert (status, answer["error_code"]) == (404, 2001)
    status, answer, _ = await dify(body(knowledge_id="bobs"), key="alice-key")
    assert (status, answer) == (404, (await dify(body(knowledge_id="nope"), key="alice-key"))[1])
    status, answer, _ = await dify(body("unpublished rank fusion trick", top_k=10), key="alice-key")
    assert all("unpublished" not in r["content"] for r in answer["records"])
    status, answer, _ = await dify(body("unpublished rank fusion trick", "bobs", top_k=10), key="bob-key")
    assert any("unpublished" in r["content"] for r in answer["records"])
    status, answer, _ = await dify(body(knowledge_id="bobs"), key="admin-key")
    assert status == 200


async def test_one_key_serves_every_knowledge_base_that_lists_it(dify):
    for knowledge_id in ("papers", "papers_notes"):
        status, answer, _ = await dify(body(knowledge_id=knowledge_id), key="papers-only-key")
        assert status == 200 and answer["records"], knowledge_id


RECORD = {
    "year": 2020,
    "date": "2021-03-04",
    "authors": ["Omar Khattab", "Matei Zaharia"],
    "type": "biblio",
    "doi": "10.1145/3397271.3401075",
    "tags": ["dense retrieval"],
    "title": "ColBERT",
    "note": "",
}


@pytest.mark.parametrize(
    ("name", "operator", "value", "expected"),
    [
        ("title", "contains", "colb", True),
        ("title", "contains", "bm25", False),
        ("authors", "not contains", "smith", True),
        ("authors", "not contains", "khattab", False),
        ("doi", "start with", "10.1145", True),
        ("doi", "start with", "10.18653", False),
        ("doi", "end with", "3401075", True),
        ("doi", "end with", "999", False),
        ("type", "is", "biblio", True),
        ("type", "is", "Biblio", False),
        ("type", "is not", "highlight", True),
        ("type", "is not", "biblio", False),
        ("note", "empty", None, True),
        ("title", "empty", None, False),
        ("missing", "empty", None, True),
        ("title", "not empty", None, True),
        ("note", "not empty", None, False),
        ("type", "in", ["biblio", "file"], True),
        ("type", "in", "highlight,file", False),
        ("type", "not in", ["highlight"], True),
        ("type", "not in", ["biblio"], False),
        ("year", "=", "2020", True),
        ("year", "=", 2021, False),
        ("year", "≠", 2021, True),
        ("year", "≠", 2020.0, False),
        ("year", "!=", 2021, True),
        ("year", ">", 2019, True),
        ("year", ">", 2020, False),
        ("year", "<", 2021, True),
        ("year", "<", "2020", False),
        ("year", "≥", 2020, True),
        ("year", "≥", 2021, False),
        ("year", ">=", 2020, True),
        ("year", "≤", 2020, True),
        ("year", "≤", 2019, False),
        ("year", "<=", 2019, False),
        ("date", "before", "2021-12-31", True),
        ("date", "before", "2021-01-01", False),
        ("date", "after", "2020", True),
        ("year", "after", "2021-06-01", False),
        ("year", "before", 2021, True),
        (["missing", "title"], "contains", "bert", True),
        ("year", ">", "not a number", False),
        ("date", "before", 1640908800, True),  # 2021-12-31 in Unix seconds, as Dify's date picker sends
        ("date", "before", 1609459200, False),  # 2021-01-01
        ("date", "after", 1609459200, True),
        ("year", "after", 1622505600, False),  # 2021-06-01
        ("year", "before", "1609459200", True),
        ("title", "contains", None, True),  # a condition without a value is skipped, as Dify's filter does
        ("title", "is", None, True),
    ],
)
def test_every_operator_both_ways(name, operator, value, expected):
    condition = MetadataCondition.model_validate(
        {"conditions": [{"name": name, "comparison_operator": operator, "value": value}]}
    )
    assert condition.holds(RECORD) is expected


def test_logical_operators():
    yes = {"name": "type", "comparison_operator": "is", "value": "biblio"}
    no = {"name": "type", "comparison_operator": "is", "value": "file"}
    assert MetadataCondition.model_validate({"logical_operator": "or", "conditions": [yes, no]}).holds(RECORD)
    assert not MetadataCondition.model_validate({"logical_operator": "and", "conditions": [yes, no]}).holds(RECORD)
    assert MetadataCondition.model_validate({"logical_operator": None, "conditions": []}).holds(RECORD)
    assert MetadataCondition.model_validate({"logical_operator": "or", "conditions": None}).holds(RECORD)


# --- Dify's own client, replayed -------------------------------------------------------------------
# The shapes below re-declare, field for field, the pydantic models Dify's code builds and reads
# (langgenius/dify: api/core/rag/entities/metadata_entities.py, citation_metadata.py,
# context_entities.py, api/core/rag/models/document.py); Dify itself is not imported.

DifyOperator = Literal[
    "contains", "not contains", "start with", "end with", "is", "is not", "empty", "not empty", "in", "not in",
    "=", "≠", ">", "<", "≥", "≤", "before", "after",
]  # fmt: skip


class DifyCondition(BaseModel):
    name: str
    comparison_operator: DifyOperator
    value: str | Sequence[str] | Sequence[int] | Sequence[float] | int | float | None = None


class DifyMetadataCondition(BaseModel):
    logical_operator: Literal["and", "or"] | None = "and"
    conditions: list[DifyCondition] | None = None


class DifyRetrievalSourceMetadata(BaseModel):
    position: int | None = None
    dataset_id: str | None = None
    dataset_name: str | None = None
    document_id: str | None = None
    document_name: str | None = None
    data_source_type: str | None = None
    segment_id: str | None = None
    retriever_from: str | None = None
    score: float | None = None
    content: str | None = None
    page: int | None = None
    doc_metadata: dict[str, Any] | None = None
    title: str | None = None


class DifyDocumentContext(BaseModel):
    content: str
    score: float | None = None


class DifyDocument(BaseModel):
    page_content: str
    metadata: dict[str, Any] | None = {}
    provider: str | None = "dify"


def dify_request_params(query: str, knowledge_id: str, parameters: dict[str, Any], condition: Any) -> dict[str, Any]:
    """ExternalDatasetService.fetch_external_knowledge_retrieval's request body, step for step."""
    enabled = parameters.get("score_threshold_enabled") or False
    params: dict[str, Any] = {
        "retrieval_setting": {
            "top_k": parameters.get("top_k"),
            "score_threshold": parameters.get("score_threshold", 0.0) if enabled else 0.0,
        },
        "query": query,
        "knowledge_id": knowledge_id,
    }
    if condition:
        params["metadata_condition"] = condition.model_dump()
    return params


def dify_context(records: list[dict[str, Any]]) -> list[DifyRetrievalSourceMetadata]:
    """DatasetRetrieval: records -> Document(provider="external") -> RetrievalSourceMetadata."""
    sources = []
    for record in records:
        document = DifyDocument(
            page_content=record.get("content"), metadata=record.get("metadata"), provider="external"
        )
        assert document.metadata is not None
        document.metadata.update(score=record.get("score"), title=record.get("title"), dataset_id="ds-1")
        DifyDocumentContext(content=document.page_content, score=document.metadata.get("score"))
        sources.append(
            DifyRetrievalSourceMetadata(
                dataset_id=document.metadata.get("dataset_id"),
                document_id=document.metadata.get("document_id") or document.metadata.get("title"),
                document_name=document.metadata.get("title"),
                data_source_type="external",
                retriever_from="dev",
                score=document.metadata.get("score"),
                content=document.page_content,
            )
        )
    return sources


JAN_2020 = int(datetime(2020, 1, 1, tzinfo=UTC).timestamp())


async def test_dify_chat_path_reads_our_records(dify):
    params = dify_request_params("reciprocal rank fusion", "papers", {"top_k": 4}, None)
    status, answer, _ = await dify(params)
    assert status == 200 and answer["records"]
    sources = dify_context(answer["records"])
    assert all(isinstance(source.document_id, str) and source.document_id for source in sources)
    for record in answer["records"]:
        for key, value in record["metadata"].items():
            if key == "id" or key.endswith("_id"):
                assert isinstance(value, str), (key, value)


async def test_dify_manual_filter_shapes(dify):
    # the date picker sends Unix seconds; a condition left empty keeps value null and is skipped
    condition = DifyMetadataCondition(
        logical_operator="and",
        conditions=[
            DifyCondition(name="year", comparison_operator="after", value=JAN_2020),
            DifyCondition(name="authors", comparison_operator="contains", value=None),
        ],
    )
    params = dify_request_params("passage retrieval with BERT", "papers", {"top_k": 10}, condition)
    assert params["metadata_condition"]["conditions"][1]["value"] is None
    status, answer, _ = await dify(params)
    assert status == 200 and answer["records"]
    assert all(record["metadata"]["year"] > 2020 for record in answer["records"])
    before = DifyMetadataCondition(
        conditions=[DifyCondition(name="year", comparison_operator="before", value=JAN_2020)]
    )
    _, answer, _ = await dify(dify_request_params("retrieval", "papers", {"top_k": 10}, before))
    assert answer["records"] and all(record["metadata"]["year"] < 2020 for record in answer["records"])
    dify_context(answer["records"])


async def test_dify_model_defaults_and_skipped_conditions(dify):
    unfiltered = (await dify(dify_request_params("rank fusion", "papers", {"top_k": 5}, None)))[1]["records"]
    empty = DifyMetadataCondition()  # conditions: null, Dify's model default
    status, answer, _ = await dify(dify_request_params("rank fusion", "papers", {"top_k": 5}, empty))
    assert status == 200 and answer["records"] == unfiltered
    all_null = DifyMetadataCondition(
        logical_operator="or", conditions=[DifyCondition(name="year", comparison_operator="=", value=None)]
    )
    _, answer, _ = await dify(dify_request_params("rank fusion", "papers", {"top_k": 5}, all_null))
    assert answer["records"] == unfiltered
    listed = {"conditions": [{"name": ["missing", "type"], "comparison_operator": "is", "value": "highlight"}]}
    _, answer, _ = await dify(body("rank fusion", top_k=5, condition=listed))
    assert answer["records"] and all(r["metadata"]["type"] == "highlight" for r in answer["records"])


async def test_condition_bounds_are_clear_errors(dify):
    many = {"conditions": [{"name": "year", "comparison_operator": ">", "value": i} for i in range(65)]}
    status, answer, _ = await dify(body(condition=many))
    assert status == 400 and "conditions" in answer["error_msg"]
    huge = {"conditions": [{"name": "title", "comparison_operator": "in", "value": ["x"] * 300}]}
    status, answer, _ = await dify(body(condition=huge))
    assert status == 400 and "at most 256 values" in answer["error_msg"]
    long = {"conditions": [{"name": "title", "comparison_operator": "contains", "value": "x" * 5000}]}
    status, answer, _ = await dify(body(condition=long))
    assert status == 400 and "1000 characters" in answer["error_msg"]


async def test_partial_answers_and_503_when_nothing_answered(dify):
    dify.fakes["tavily"].behaviour.delay_s = 4.5  # past the base's 3.5 s
    status, answer, _ = await dify(body("rank fusion", "papers_and_web", top_k=10))
    assert status == 200 and answer["records"]  # the library answered in time; tavily is dropped
    assert all(record["metadata"]["retrievers"] == ["internal_biblio"] for record in answer["records"])
    status, answer, text = await dify(body("rank fusion", "web_only"))
    assert status == 503 and answer["error_code"] == 503
    assert "tavily" in answer["error_msg"] and "0.5 s" in answer["error_msg"]
    dify.fakes["tavily"].behaviour.delay_s = 0.0
    dify.fakes["tavily"].behaviour.mode = "500"
    status, answer, text = await dify(body("rank fusion", "web_only"))
    assert status == 503 and "tavily" in answer["error_msg"]
    assert "tvly" not in text  # the upstream key never shows
