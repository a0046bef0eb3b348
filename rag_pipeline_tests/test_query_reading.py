"""Queries as analysts write them: instructions about the answer weigh nothing, short names and aliases meet the
documents' names, a configured vocabulary maps metric names to the lines that hold them; pages support their
chunks; a reranker behind an endpoint (a local HTTP server speaking the Cohere/TEI and OpenAI chat APIs)."""

from __future__ import annotations

import json
import logging

import pytest
from dagster import DagsterInstance

from rag_pipeline.config import ConfigError, QueryConfig, RerankerConfig, RoutingConfig, load_settings
from rag_pipeline.defs.runs import run_ingest
from rag_pipeline.endpoints.chat import EndpointError
from rag_pipeline.endpoints.rerank import EndpointReranker
from rag_pipeline.retrieval.query import load_synonyms, prepare
from rag_pipeline.retrieval.search import SearchOptions, search
from rag_pipeline_tests.chat_server import JsonServer

FINANCIAL = QueryConfig(synonyms_file="builtin:financial_statements")


def test_instructions_about_the_answer_are_left_out_and_the_question_is_kept():
    asked = ("Answer the following question as if you are an equity research analyst and have lost internet "
             "connection. What is the FY2019 working capital of Acme? Round your answer to two decimal places. "
             "If working capital is not a useful metric for a company like this, then state that and explain why. "
             "Give a response by relying on the details shown in the balance sheet.")
    prepared = prepare(asked, QueryConfig())
    assert prepared.dense == ("What is the FY2019 working capital of Acme? Give a response by relying on the "
                              "details shown in the balance sheet.")
    assert len(prepared.dropped) == 3
    # a query made only of instruction-like sentences is kept whole: something must be ranked
    assert prepare("Round your answer to two decimals.", QueryConfig()).dense == "Round your answer to two decimals."
    # patterns are configuration: none, and nothing is dropped
    assert prepare(asked, QueryConfig(instruction_patterns=())).dense == asked


def test_a_vocabulary_maps_metric_names_to_the_lines_that_hold_them():
    prepared = prepare("What was Nike's capex in fiscal 2019?", FINANCIAL)
    assert "purchases of property plant and equipment" in prepared.expansions
    assert prepared.lexical.startswith("What was Nike's capex in fiscal 2019?")
    assert "purchases of property plant and equipment" in prepared.lexical
    assert prepared.dense.lower() == prepared.lexical.lower()  # what is added is lower-cased in the lexical text
    quick = prepare("Is the quick ratio of P&G healthy?", FINANCIAL)
    assert {"total current assets", "accounts receivable"} <= set(quick.expansions)
    assert prepare("P&L of the firm", FINANCIAL).expansions[0] == "statements of income"
    # whole words only: "capexes" and "scapex" are not "capex"
    assert not prepare("scapex", FINANCIAL).expansions
    assert prepare("capex", QueryConfig(synonyms_file="builtin:financial_statements", expand_dense=False)).dense \
        == "capex"


def test_aliases_say_the_names_they_stand_for_in_their_own_case():
    config = QueryConfig(aliases={"KO": ["Coca-Cola"], "P&G": ["Procter & Gamble"], "jpm": ["JPMorgan Chase"]})
    assert prepare("KO dividends in 2017", config).aliases == ("Coca-Cola",)
    assert prepare("ko dividends", config).aliases == ()  # capitals must match: "ko" is not "KO"
    # the alias and what it adds in lower case: a capitalised word of the lexical text is a name the index must hold
    # (abstention reads them), and one the configuration resolves is not
    assert prepare("What did P&G pay?", config).lexical == "What did p&g pay? procter & gamble"
    assert prepare("JPM net revenue", config).aliases == ("JPMorgan Chase",)  # a lower-case alias matches any case


def test_a_bad_vocabulary_or_pattern_is_refused_with_its_key(tmp_path):
    bad = tmp_path / "synonyms.yaml"
    bad.write_text("- when: [capex]\n  add: []\n")
    with pytest.raises(ConfigError, match="synonyms_file: .* entry 1 must be"):
        load_synonyms(bad)
    bad.write_text("capex: purchases\n")
    with pytest.raises(ConfigError, match="must hold a list"):
        load_synonyms(bad)
    config = tmp_path / "rag.yaml"
    config.write_text("retrieval:\n  query:\n    instruction_patterns: ['(unclosed']\n")
    with pytest.raises(ConfigError, match="retrieval.query.instruction_patterns"):
        load_settings(config)
    config.write_text("retrieval:\n  query:\n    synonyms_file: builtin:nonesuch\n")
    with pytest.raises(ConfigError, match="builtin:financial_statements"):
        load_settings(config)
    config.write_text("retrieval:\n  query:\n    synonyms_file: builtin:financial_statements\n")
    assert load_settings(config).retrieval.query.synonyms_file.name == "financial_statements.yaml"


# --- on a real index -------------------------------------------------------------------------------------------

FILINGS = {
    "GLOBEXCHEMICAL_2019_10K.md": (
        "# Globex Chemical annual report 2019\n\n## Item 7. Management's discussion\n\nSales of coatings rose in "
        "2019 on higher volumes in Europe and better prices.\n\n## Consolidated Statements of Cash Flows\n\n"
        "| (in millions) | 2019 | 2018 |\n|---|---|---|\n| Net cash provided by operating activities | 812 | 790 |\n"
        "| Purchases of property, plant and equipment | (214) | (198) |\n| Dividends paid | (90) | (85) |\n"),
    "UMBRAENERGY_2019_10K.md": (
        "# Umbra Energy annual report 2019\n\n## Item 7. Management's discussion\n\nPipeline volumes rose in 2019 "
        "as new storage came online.\n\n## Consolidated Statements of Cash Flows\n\n| (in millions) | 2019 | 2018 |\n"
        "|---|---|---|\n| Net cash provided by operating activities | 1,412 | 1,300 |\n"
        "| Purchases of property, plant and equipment | (655) | (610) |\n| Dividends paid | (120) | (118) |\n"),
    # two more companies: with two documents no name is rare enough to name one (routing's idf)
    "NORTHWINDFOODS_2019_10K.md": (
        "# Northwind Foods annual report 2019\n\n## Item 7. Management's discussion\n\nFrozen meals sold more in "
        "2019 as two new plants opened.\n"),
    "KESTRELAVIONICS_2019_10K.md": (
        "# Kestrel Avionics annual report 2019\n\n## Item 7. Management's discussion\n\nFlight computers were "
        "delivered late in 2019 after a supplier's fire.\n"),
}


@pytest.fixture
def filings(tmp_path, make_settings, db):
    root = tmp_path / "filings"
    root.mkdir()
    for name, text in FILINGS.items():
        (root / name).write_text(text)
    # the sidecar names Umbra's ticker: a document's own aliases reach routing like its title does
    (root / "UMBRAENERGY_2019_10K.md.meta.json").write_text(json.dumps({"aliases": ["UMBR"]}))
    settings = make_settings([{"name": "filings", "root": str(root), "acl_labels": ["analysts"]}])
    with DagsterInstance.ephemeral() as instance:
        assert run_ingest(settings, instance=instance)["success"]
    return db


def test_a_sidecar_alias_and_a_configured_alias_route_to_their_company(filings):
    question = "What were {} capital expenditures in FY2019?"
    # four documents: one rare name is worth an idf of 1.2, under the default min_score meant for real collections
    small = RoutingConfig(min_score=1.0)
    plain = SearchOptions(query=QueryConfig(synonyms_file="builtin:financial_statements"), routing=small)
    top = search(filings, question.format("UMBR's"), ["analysts"], k=1, options=plain)[0]
    assert top.path == "UMBRAENERGY_2019_10K.md" and "(655)" in top.text
    configured = SearchOptions(query=QueryConfig(synonyms_file="builtin:financial_statements",
                                                 aliases={"GXC": ["Globex Chemical"]}), routing=small)
    top = search(filings, question.format("GXC's"), ["analysts"], k=1, options=configured)[0]
    assert top.path == "GLOBEXCHEMICAL_2019_10K.md" and "(214)" in top.text


def test_pages_are_fused_like_chunks_and_blend_into_each_hit(filings):
    query = "purchases of property plant and equipment dividends sales volumes"
    alone = search(filings, query, ["analysts"], k=50, mode="sparse", options=SearchOptions(page_weight=0.0))
    assert all(h.score == pytest.approx(1 / (60 + h.sparse_rank)) for h in alone)
    # the BM25 list ranks pages by their best chunk in it; a page's fused score is 1 / (60 + that rank)
    best: dict[tuple[str, int], int] = {}
    for hit in alone:
        page = (hit.doc_id, hit.page_start)
        best[page] = min(best.get(page, hit.sparse_rank), hit.sparse_rank)
    assert len(best) < len(alone)  # some page has several chunks
    page_rank = {page: 1 + sum(other < rank for other in best.values()) for page, rank in best.items()}
    for weight in (0.5, 1.0):
        blended = search(filings, query, ["analysts"], k=50, mode="sparse", options=SearchOptions(page_weight=weight))
        assert {h.chunk_id for h in blended} == {h.chunk_id for h in alone}
        for hit in blended:
            page_score = 1 / (60 + page_rank[(hit.doc_id, hit.page_start)])
            assert hit.score == pytest.approx((1 - weight) * 1 / (60 + hit.sparse_rank) + weight * page_score)
        assert [h.score for h in blended] == sorted((h.score for h in blended), reverse=True)
    # ranking pages (weight 1): a page's chunks come together, best page first, a long page gains nothing by length
    pages = [(h.doc_id, h.page_start) for h in search(filings, query, ["analysts"], k=50, mode="sparse",
                                                     options=SearchOptions(page_weight=1.0))]
    assert pages == sorted(pages, key=lambda page: page_rank[page])


class RerankServer(JsonServer):
    """POST /rerank (Cohere's answer, or TEI's with `tei=True`) and /chat/completions (a listwise ranking): the
    passages that hold `favourite` rank first."""

    def __init__(self, favourite: str, tei: bool = False):
        self.favourite, self.tei = favourite, tei
        super().__init__()

    def reply(self, path, body):
        if path == "/rerank":
            scores = [(i, 1.0 if self.favourite in text else 0.1 / (i + 1)) for i, text in enumerate(body["texts"])]
            items = [{"index": i, ("score" if self.tei else "relevance_score"): s} for i, s in scores]
            return items if self.tei else {"results": sorted(items, key=lambda x: -x["relevance_score"])}
        prompt = body["messages"][0]["content"]
        numbers = [n for n in range(1, 100) if f"[{n}] " in prompt]
        liked = [n for n in numbers if self.favourite in prompt.split(f"[{n}] ", 1)[1].split("\n\n[", 1)[0]]
        return {"choices": [{"message": {"role": "assistant", "content": " > ".join(f"[{n}]" for n in liked)}}]}


@pytest.mark.parametrize(("protocol", "tei"), [("rerank", False), ("rerank", True), ("chat", False)])
def test_an_endpoint_reranker_orders_the_fused_top_n(filings, protocol, tei):
    server = RerankServer("Pipeline volumes", tei=tei)
    try:
        config = RerankerConfig(endpoint=server.url, protocol=protocol, endpoint_model="m", top_n=20,
                                max_retries=1, timeout_seconds=5)
        query = "what happened to sales and volumes in 2019"
        reranked = search(filings, query, ["analysts"], k=3, options=SearchOptions(reranker=config))
        assert "Pipeline volumes" in reranked[0].text and reranked[0].rerank_score is not None
        path, body = server.requests[-1]
        if protocol == "rerank":
            assert path == "/rerank" and body["query"] == query and body["model"] == "m"
            assert len(body["documents"]) == len(search(filings, query, ["analysts"], k=20))
        else:
            assert path == "/chat/completions" and query in body["messages"][0]["content"]
    finally:
        server.stop()


def test_a_failing_reranker_is_retried_then_leaves_the_fused_order(filings, caplog):
    server = RerankServer("Pipeline volumes")
    try:
        config = RerankerConfig(endpoint=server.url, top_n=10, max_retries=1, timeout_seconds=5)
        server.fail_next = 1  # one 503, then an answer: the retry gets it
        assert search(filings, "pipeline volumes", ["analysts"], k=2, options=SearchOptions(reranker=config))[0] \
            .rerank_score is not None
        assert server.calls == 2
        server.fail_next = 10
        fused = search(filings, "sales volumes", ["analysts"], k=3)
        with caplog.at_level(logging.WARNING):
            kept = search(filings, "sales volumes", ["analysts"], k=3, options=SearchOptions(reranker=config))
        assert [h.chunk_id for h in kept] == [h.chunk_id for h in fused]
        assert all(h.rerank_score is None for h in kept)
        assert "fused order stands" in caplog.text and "HTTP 503" in caplog.text
        with pytest.raises(EndpointError, match="HTTP 503"):
            EndpointReranker(config).scores("q", ["a", "b"])
    finally:
        server.stop()


def test_reranker_settings_are_checked():
    with pytest.raises(ValueError, match="not both"):
        RerankerConfig(model="/some/folder", endpoint="http://localhost:1")
    with pytest.raises(ValueError, match="endpoint_model"):
        RerankerConfig(endpoint="http://localhost:1", protocol="chat")
    with pytest.raises(ValueError, match="http"):
        RerankerConfig(endpoint="localhost:1")
