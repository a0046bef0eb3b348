"""Hybrid search on the real index: ACL inside the SQL, no unlabelled path, filtered HNSW still fills k."""

import re

import pytest
from dagster import DagsterInstance
from psycopg import sql

from rag_pipeline import store
from rag_pipeline.config import RoutingConfig
from rag_pipeline.defs.runs import run_ingest
from rag_pipeline.embedding.locations import ModelUnavailableError
from rag_pipeline.retrieval.search import SearchError, SearchOptions, search
from rag_pipeline.text.identity import file_name_words


@pytest.fixture
def indexed(make_settings, corpus, db):
    settings = make_settings([{"name": "sample", "root": str(corpus), "acl_labels": ["staff"]}])
    with DagsterInstance.ephemeral() as instance:
        assert run_ingest(settings, instance=instance)["success"]
    return db


QUERIES = [
    "how long does the robot battery last",
    "revenue of the welding arm business last quarter",
    "what do I do if my laptop is stolen",
    "hotel budget when travelling to London",
    "who do I contact about payroll",
]


@pytest.mark.parametrize("mode", ["hybrid", "dense", "sparse"])
def test_results_never_leave_the_callers_labels(indexed, mode):
    doc_labels = dict(indexed.execute("SELECT doc_id, acl_labels FROM documents").fetchall())
    for labels in (["staff"], ["finance"], ["staff", "finance"], ["nobody"]):
        for query in QUERIES:
            for hit in search(indexed, query, labels, k=20, mode=mode):
                assert set(doc_labels[hit.doc_id]) & set(labels), (query, labels, hit.path)


def test_labels_decide_what_is_visible(indexed):
    query = "revenue of the welding arm business last quarter"
    staff = search(indexed, query, "staff", k=20)
    finance = search(indexed, query, "finance", k=5)
    assert all(not hit.path.startswith("finance/") for hit in staff)
    assert finance and finance[0].path == "finance/q3-report.pdf" and finance[0].page_start == 1
    assert search(indexed, query, ["nobody"]) == []


def test_hybrid_finds_the_answer_and_reports_both_ranks(indexed):
    # each chunk alone, and no document routing (the FAQ's title names the robot): its score is its lists' RRF
    hits = search(indexed, "how long does the robot battery last", ["staff"], k=3,
                  options=SearchOptions(page_weight=0.0, routing=RoutingConfig(enabled=False)))
    assert hits[0].path == "products/nw200-faq.html"
    assert "nine hours" in hits[0].text
    assert hits[0].dense_rank is not None and hits[0].sparse_rank is not None
    assert hits[0].score == pytest.approx(1 / (60 + hits[0].dense_rank) + 1 / (60 + hits[0].sparse_rank))
    assert hits == sorted(hits, key=lambda h: -h.score)
    # retrieval.rrf_k is the rank offset of every list
    steep = search(indexed, "how long does the robot battery last", ["staff"], k=3,
                   options=SearchOptions(page_weight=0.0, rrf_k=5.0, routing=RoutingConfig(enabled=False)))
    assert steep[0].score == pytest.approx(1 / (5 + steep[0].dense_rank) + 1 / (5 + steep[0].sparse_rank))
    # the contextual prefix, returned apart from the text, names the document; its title is read from its first
    # heading only, so by its file's words (rag_pipeline.text.identity.prefix_name)
    assert hits[0].document["title"] and hits[0].prefix.startswith(file_name_words(hits[0].path))


def test_there_is_no_unlabelled_search(indexed):
    for labels in ([], "", " , ", None):
        with pytest.raises(SearchError, match="labels"):
            search(indexed, "battery", labels)
    with pytest.raises(SearchError):
        search(indexed, "battery", ["staff"], mode="magic")


def test_filtered_dense_search_fills_k_when_few_chunks_match(indexed):
    """10,000 chunks of which 2% carry a label: HNSW iterative scan must still return a full k."""
    version = store.versions.active_version(indexed)
    table = sql.Identifier(version.table_name)
    with indexed.transaction():
        indexed.execute(
            "INSERT INTO documents (doc_id, source, rel_path, fingerprint, size_bytes, modified_at, acl_labels, status)"
            " VALUES ('bulk', 'sample', 'bulk.md', 'f', 1, now(), '{staff}', 'indexed')"
        )
        indexed.execute(
            sql.SQL(
                """INSERT INTO {} (chunk_id, owner_chunk_id, doc_id, ordinal, text, prefix, section_path, page_start, page_end,
                                   content_type, acl_labels, embedding_input_sha, embedding)
                   SELECT 'bulk-' || i, 'bulk-' || i, 'bulk', i, 'synthetic chunk ' || i, '', '', 1, 1, 'prose',
                          CASE WHEN i %% 50 = 0 THEN ARRAY['rare'] ELSE ARRAY['staff'] END, md5(i::text),
                          (SELECT array_agg(random() - 0.5) FROM generate_series(1, %s) WHERE i > 0)::halfvec
                   FROM generate_series(1, 10000) AS i"""
            ).format(table),
            (version.dimensions,),
        )
    assert indexed.execute(sql.SQL("SELECT count(*) FROM {} WHERE 'rare' = ANY(acl_labels)").format(table)
                           ).fetchone()[0] == 200
    hits = search(indexed, "synthetic chunk", ["rare"], k=10, mode="dense")
    assert len(hits) == 10
    assert all(hit.chunk_id.startswith("bulk-") for hit in hits)
    plan = "\n".join(
        r[0] for r in indexed.execute(
            sql.SQL("EXPLAIN SELECT chunk_id FROM {} ORDER BY embedding <=> %s::halfvec LIMIT 10").format(table),
            ("[" + ",".join(["0.1"] * version.dimensions) + "]",),
        ).fetchall()
    )
    assert "hnsw" in plan


@pytest.fixture(scope="module")
def tiny_cross_encoder(tmp_path_factory):
    """A real (if untrained) cross-encoder, built and saved here: no reranker weights can be downloaded."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from rag_pipeline.embedding.locations import resolve_model

    folder = tmp_path_factory.mktemp("cross-encoder")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("all-MiniLM-L6-v2").location)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, num_labels=1)
    BertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_the_reranker_reorders_the_fused_top_n(indexed, tiny_cross_encoder):
    from sentence_transformers import CrossEncoder

    from rag_pipeline.config import RerankerConfig

    query = "how long does the robot battery last"
    # no per-document cap: it counts the k asked for, which differs between the two searches
    uncapped = RoutingConfig(max_share=1.0)
    fused = search(indexed, query, ["staff"], k=8, options=SearchOptions(routing=uncapped))
    reranked = search(indexed, query, ["staff"], k=3, options=SearchOptions(
        routing=uncapped, reranker=RerankerConfig(model=tiny_cross_encoder, top_n=8)))
    assert len(reranked) == 3 and all(h.rerank_score is not None for h in reranked)
    scores = CrossEncoder(str(tiny_cross_encoder)).predict(
        [(query, f"{h.prefix}\n{h.text}" if h.prefix else h.text) for h in fused])
    # ties keep the fused order
    expected = [h.chunk_id for _, h in sorted(zip(scores, fused, strict=True), key=lambda p: -p[0])]
    assert [h.chunk_id for h in reranked] == expected[:3]
    assert all(h.rerank_score is None for h in fused)  # off by default
    with pytest.raises(ModelUnavailableError, match="does not exist"):
        search(indexed, query, ["staff"], options=SearchOptions(reranker=RerankerConfig(model="/nonexistent/reranker")))


@pytest.fixture(scope="module")
def share_db(pg_admin_url, template_url):
    """12,000 chunks: 5,200 readable by `rare` only (a 43% share, over the 5,000 rows below which any caller is
    ranked exactly), 6,800 by `staff` only."""
    import uuid

    import psycopg

    from rag_pipeline.domain import ids
    from rag_pipeline.store.database import connect

    name = f"share_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE rag_test_template").format(sql.Identifier(name)))
    conn = connect(psycopg.conninfo.make_conninfo(pg_admin_url, dbname=name), autocommit=True)
    with conn.transaction():
        conn.execute("INSERT INTO sources (name, root, include_patterns, freshness_sla_seconds)"
                     " VALUES ('s', '/nonexistent', '{}', 60)")
        conn.execute("INSERT INTO documents (doc_id, source, rel_path, fingerprint, size_bytes, modified_at, acl_labels,"
                     " status) VALUES ('d', 's', 'd.md', 'f', 1, now(), '{rare,staff}', 'indexed')")
        version = store.versions.ensure_active(conn, ids.ModelIdentity("torch", "m", "sha256:m"), 8, "c", "p", 1.2, 0.75)
        conn.execute("SELECT setseed(0.5)")
        conn.execute(sql.SQL(
            """INSERT INTO {} (chunk_id, owner_chunk_id, doc_id, ordinal, text, prefix, section_path, page_start,
                               page_end, content_type, acl_labels, embedding_input_sha, embedding)
               SELECT format('c%s', lpad(i::text, 5, '0')), format('c%s', lpad(i::text, 5, '0')), 'd', i,
                      'word' || (i % 97), '', '', 1, 1, 'prose',
                      CASE WHEN i <= 5200 THEN ARRAY['rare'] ELSE ARRAY['staff'] END, md5(i::text),
                      (SELECT array_agg(random() - 0.5) FROM generate_series(1, 8) WHERE i > 0)::halfvec
               FROM generate_series(1, 12000) AS i""").format(sql.Identifier(version.table_name)))
    conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(version.table_name)))  # as the vacuum policy does
    yield conn, version
    conn.close()
    with psycopg.connect(pg_admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.mark.parametrize(("labels", "exact"), [(["rare"], True), (["staff"], False)],
                         ids=["a 43% share: exact", "a 57% share: HNSW"])
def test_the_dense_list_is_exact_when_the_labels_reach_a_small_share(share_db, labels, exact):
    """Over 5,000 rows, a caller whose share s of the rows makes an exact scan cheaper than a filtered HNSW walk
    (reach^2 < 75 x candidates x rows) gets its rows ranked exactly; a broader one walks HNSW. Seen in the plan the
    search function ran, and the exact list equals a brute-force ranking."""
    import numpy as np
    from pgvector import HalfVector

    conn, version = share_db
    table = version.table_name
    query = np.random.default_rng(3).normal(size=8).astype(np.float32)
    notices: list[str] = []
    conn.add_notice_handler(lambda diagnostic: notices.append(diagnostic.message_primary or ""))
    for statement in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0", "SET auto_explain.log_analyze = on",
                      "SET auto_explain.log_nested_statements = on", "SET auto_explain.log_level = notice"):
        conn.execute(statement)
    try:
        got = [r[0] for r in conn.execute(
            "SELECT chunk_id FROM rag.search_version(%s, %s, 'unused', %s, 10, 'dense', '{}')",
            (version.version_id, HalfVector(query), labels)).fetchall()]
    finally:
        conn.execute("SET auto_explain.log_min_duration = -1")
    plan = next(n for n in notices if "(embedding <=> $1) + 0" in n)
    hnsw_walked = re.search(rf"Index Scan using {table}_hnsw on {table}[^\n]*\(actual time", plan) is not None
    assert hnsw_walked is not exact, plan
    assert len(got) == 10
    if exact:
        rows = conn.execute(sql.SQL("SELECT chunk_id, embedding FROM {} WHERE acl_labels && %s").format(
            sql.Identifier(table)), (labels,)).fetchall()
        vectors = np.array([r[1].to_list() for r in rows], dtype=np.float32)
        distance = 1 - vectors @ query / (np.linalg.norm(vectors, axis=1) * np.linalg.norm(query))
        expected = [rows[i][0] for i in sorted(range(len(rows)), key=lambda i: (round(float(distance[i]), 5), rows[i][0]))]
        assert got == expected[:10]


@pytest.mark.parametrize(("operator_value", "expected"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_the_query_path_loads_torch_with_passive_openmp_threads_unless_the_operator_says(operator_value, expected):
    """Spinning OpenMP threads take the cores the database backend needs between two queries; the setting only
    works when it is in the environment before torch loads, so the search path must set it first."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if operator_value:
        env["OMP_WAIT_POLICY"] = operator_value
    probe = ("import os, sys; import rag_pipeline.retrieval.search, rag_pipeline.cli; "
             "loaded = 'torch' in sys.modules; import torch; print(loaded, os.environ['OMP_WAIT_POLICY'])")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", expected]
