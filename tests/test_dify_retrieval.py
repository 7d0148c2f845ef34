"""POST /retrieval as Dify calls it: errors, probes, scores, filters and tenancy, over real HTTP."""

from __future__ import annotations

import json

import aiohttp
import pytest

from fedresearch.knowledge.conditions import MetadataCondition
from fedresearch.library.embedded import Library
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
    status, answer, _ = await dify(body(knowledge_id="papers_and_web"), key="papers-only-key")
    assert (status, answer["error_code"]) == (403, 1002)
    status, answer, _ = await dify(body(knowledge_id="bobs"), key="alice-key")
    assert (status, answer["error_code"]) == (403, 1002)
    status, answer, _ = await dify(body("unpublished rank fusion trick", top_k=10), key="alice-key")
    assert all("unpublished" not in r["content"] for r in answer["records"])
    status, answer, _ = await dify(body("unpublished rank fusion trick", "bobs", top_k=10), key="bob-key")
    assert any("unpublished" in r["content"] for r in answer["records"])
    status, answer, _ = await dify(body(knowledge_id="bobs"), key="admin-key")
    assert status == 200


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
