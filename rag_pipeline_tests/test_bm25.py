"""BM25 in Postgres against an oracle: on a few thousand chunks with a Zipfian vocabulary and lengths that vary,
the lexical list's top 50 equals textbook BM25 (k1 = 1.2, b = 0.75) computed here, from the same tokens, for
rare, common, mixed and only-very-common queries, with broad and very selective labels, and after deletions; in a
new database and in one upgraded from the last release before the SQL baseline."""

import math
import random
from collections import Counter

import numpy as np
import pytest
from pgvector import HalfVector
from psycopg import sql

from rag_pipeline import store
from rag_pipeline.domain import ids

K1, B = 1.2, 0.75
FAKE_MODEL = ids.ModelIdentity("torch", "m", "sha256:m")  # these tests write their own vectors
TOP = 50
CHUNKS = 2500
RARE_LABEL_EVERY = 40  # 2.5% of the chunks: a very selective caller


def _vocabulary(rng: random.Random, size: int) -> list[str]:
    consonants, vowels = "bcdfghjklmnprstvz", "aeiou"
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(rng.randint(2, 4))))
    return sorted(words)


@pytest.fixture(scope="module")
def corpus_db(request, pg_admin_url, template_url):
    """The corpus in a new database, or built in one the last release before the SQL baseline left (its BM25
    structures written by that release's functions and triggers) and then migrated by this one."""
    import uuid

    import psycopg

    from rag_pipeline.store.database import connect, migrate
    from rag_pipeline_tests.conftest import legacy_migrate

    name = f"bm25_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as admin:
        template = sql.SQL(" TEMPLATE rag_test_template") if request.param == "new" else sql.SQL("")
        admin.execute(sql.SQL("CREATE DATABASE {}{}").format(sql.Identifier(name), template))
    url = psycopg.conninfo.make_conninfo(pg_admin_url, dbname=name)
    if request.param == "upgraded":
        legacy_migrate(url)
    conn = connect(url, autocommit=True)
    rng = random.Random(7)
    vocabulary = _vocabulary(rng, 3000)
    weights = [1 / (rank + 1) ** 1.1 for rank in range(len(vocabulary))]  # Zipf
    texts = [" ".join(rng.choices(vocabulary, weights, k=rng.randint(10, 160))) for _ in range(CHUNKS)]
    vectors = np.random.default_rng(7).normal(size=(CHUNKS, 8)).astype(np.float32)
    with conn.transaction():
        conn.execute("INSERT INTO sources (name, root, include_patterns, freshness_sla_seconds)"
                     " VALUES ('s', '/nonexistent', '{}', 60)")
        conn.execute("""INSERT INTO documents (doc_id, source, rel_path, fingerprint, size_bytes, modified_at,
                                               acl_labels, status) VALUES ('d', 's', 'd.md', 'f', 1, now(), '{staff}', 'indexed')""")
        version = store.versions.ensure_active(conn, FAKE_MODEL, 8, "c", "p", K1, B)
        with conn.cursor().copy(sql.SQL(
            "COPY {} (chunk_id, owner_chunk_id, doc_id, ordinal, text, prefix, section_path, page_start, page_end,"
            " content_type, acl_labels, embedding_input_sha, embedding) FROM STDIN").format(
                sql.Identifier(version.table_name))) as copy:
            for i, (text, vector) in enumerate(zip(texts, vectors, strict=True)):
                labels = ["rare", "staff"] if i % RARE_LABEL_EVERY == 0 else ["staff"]
                copy.write_row((f"c{i:05d}", f"c{i:05d}", "d", i, text, "", "", 1, 1, "prose", labels, f"s{i}",
                                HalfVector(vector)))
    with conn.transaction():
        store.versions.reweight_bm25(conn, version, K1, B)  # as the index stage does after a first build
    if request.param == "upgraded":
        assert "000_baseline.sql" not in migrate(url)  # recognised as at the baseline, not run
    yield conn, version, vocabulary
    conn.close()
    with psycopg.connect(pg_admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _reference(conn, version, query: str, labels: set[str]) -> list[str]:
    """Textbook BM25 over the same tokens (term strings, not the engine's hashed ids), ties by chunk id."""
    table = sql.Identifier(version.table_name)
    rows = conn.execute(sql.SQL(
        "SELECT t.chunk_id, t.acl_labels, l.term, l.tf FROM {} t, rag_lexemes(t.text_config, t.prefix || ' ' || t.text) l"
    ).format(table)).fetchall()
    tf: dict[str, Counter] = {}
    allowed: dict[str, bool] = {}
    for chunk_id, acl, term, count in rows:
        tf.setdefault(chunk_id, Counter())[term] += count
        allowed[chunk_id] = bool(set(acl) & labels)
    every = {r[0] for r in conn.execute(sql.SQL("SELECT chunk_id FROM {}").format(table)).fetchall()}
    n = len(every)
    avgdl = sum(sum(c.values()) for c in tf.values()) / n
    df = Counter(term for counts in tf.values() for term in counts)
    terms = {r[0] for cfg in ("english", "simple") for r in conn.execute(
        "SELECT term FROM rag_lexemes(%s::regconfig, %s)", (cfg, query)).fetchall()}
    terms = {t for t in terms if df[t] > 0}
    idf = {t: math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) for t in terms}
    scores = {}
    for chunk_id, counts in tf.items():
        if not allowed[chunk_id] or not terms & counts.keys():
            continue
        length = sum(counts.values())
        scores[chunk_id] = sum(idf[t] * counts[t] * (K1 + 1) / (counts[t] + K1 * (1 - B + B * length / avgdl))
                               for t in terms if t in counts)
    return [c for c, _ in sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:TOP]]


# Each list is checked on a new database and on one upgraded from the last release before the SQL baseline; the
# shallow-read test on a new one only (test_sql_layout compares the two list for list, shallow reads included).
BOTH_DATABASES = pytest.mark.parametrize("corpus_db", ["new", "upgraded"], indirect=True)
NEW_DATABASE = pytest.mark.parametrize("corpus_db", ["new"], indirect=True)


def _overlap(got: list[str], expected: list[str]) -> float:
    return len(set(got) & set(expected)) / len(expected) if expected else float(not got)


def _queries(vocabulary: list[str]) -> dict[str, str]:
    rng = random.Random(11)
    common, middle, rare = vocabulary[:15], vocabulary[100:600], vocabulary[1500:]
    return {
        "one rare word": rng.choice(rare),
        "two mid words": " ".join(rng.sample(middle, 2)),
        "mixed": " ".join([*rng.sample(common, 2), *rng.sample(middle, 2), rng.choice(rare)]),
        "only very common words": " ".join(rng.sample(common, 3)),
        "a long question": "please tell me, as an analyst would, about " + " ".join(rng.sample(middle + rare, 6)),
    }


@BOTH_DATABASES
@pytest.mark.parametrize("labels", [("staff",), ("rare",)], ids=["broad labels", "very selective labels"])
@pytest.mark.parametrize(("few_rows", "term_sets"), [(0, True), (0, False), (store.search.FEW_ROWS, True)],
                         ids=["term sets", "impact-ordered postings", "labelled rows"])
def test_the_bm25_list_equals_textbook_bm25(corpus_db, labels, few_rows, term_sets):
    conn, version, vocabulary = corpus_db
    for name, query in _queries(vocabulary).items():
        expected = _reference(conn, version, query, set(labels))
        got = store.search.bm25_ranking(conn, version, query, labels, TOP, max_terms=64, few_rows=few_rows,
                                        term_sets=term_sets)
        assert len(got.chunk_ids) == len(expected), (name, len(got.chunk_ids), len(expected))
        assert _overlap(got.chunk_ids, expected) >= 0.95, (name, query)


@NEW_DATABASE
@pytest.mark.parametrize("labels", [("staff",), ("rare",)], ids=["broad labels", "very selective labels"])
@pytest.mark.parametrize("depth", [10, 60])
def test_shallow_reads_bound_rescore_and_deepen_to_the_same_list(corpus_db, labels, depth):
    """Postings read only a few deep: most chunks are known by their bounds alone, the threshold decides which are
    scored exactly, and the terms behind the bound are read deeper; the list is still textbook BM25's."""
    conn, version, vocabulary = corpus_db
    for name, query in _queries(vocabulary).items():
        expected = _reference(conn, version, query, set(labels))
        got = store.search.bm25_ranking(conn, version, query, labels, TOP, depth=depth, max_terms=64, few_rows=0,
                                        term_sets=False)
        assert len(got.chunk_ids) == len(expected), (name, len(got.chunk_ids), len(expected))
        assert _overlap(got.chunk_ids, expected) >= 0.95, (name, query)


@BOTH_DATABASES
@pytest.mark.parametrize("labels", [("staff",), ("rare",)], ids=["broad labels", "very selective labels"])
@pytest.mark.parametrize("depth", [10, 60, 4000])
def test_the_impact_path_is_exactly_the_direct_ranking(corpus_db, labels, depth):
    """The pruned path (postings read a few deep, bounds, a threshold, deeper reads) against every readable row
    scored by the same weights: the same chunks in the same order with the same scores, for many queries. Unlike
    the textbook comparison above this has no tolerance, so a bound that drops one chunk at the cut fails it.
    (A query of only very common terms is ranked directly on both sides: one of the 30.)"""
    conn, version, vocabulary = corpus_db
    rng = random.Random(depth)
    queries = [*_queries(vocabulary).values(),
               *(" ".join(rng.sample(vocabulary[:2000], rng.randint(2, 8))) for _ in range(25))]
    for query in queries:
        for want in (1, 10, TOP):
            pruned = store.search.bm25_ranking(conn, version, query, labels, want, depth=depth, max_terms=64,
                                               few_rows=0, term_sets=False)
            direct = store.search.bm25_ranking(conn, version, query, labels, want, depth=depth, max_terms=64,
                                               few_rows=10**9)
            assert pruned.chunk_ids == direct.chunk_ids, (query, want)
            assert pruned.scores == pytest.approx(direct.scores, rel=1e-9), (query, want)


@BOTH_DATABASES
@pytest.mark.parametrize("labels", [("staff",), ("rare",)], ids=["broad labels", "very selective labels"])
def test_the_term_set_path_is_exactly_the_direct_ranking(corpus_db, labels):
    """The chunks holding enough of the terms, from the term-set index, scored exactly: the same chunks in the same
    order with the same scores as every readable row scored directly, whether tau starts high (several rounds, levels
    lowered when too few come back), near the answer, or at the lowest level (every chunk with a query term)."""
    conn, version, vocabulary = corpus_db
    rng = random.Random(5)
    queries = [*_queries(vocabulary).values(),
               *(" ".join(rng.sample(vocabulary[:2000], rng.randint(2, 6))) for _ in range(20))]
    settled = Counter()
    for query in queries:
        terms = conn.execute("SELECT array_agg(term_id ORDER BY term_id), array_agg(idf ORDER BY term_id),"
                             " array_agg(df ORDER BY term_id) FROM rag.query_terms(%s, %s, 64)",
                             (version.version_id, query)).fetchone()
        qvec = conn.execute("SELECT format('{%%s}/1000000000', string_agg(format('%%s:%%s', i, f), ',' ORDER BY i))"
                            "::sparsevec FROM unnest(%s::integer[], %s::double precision[]) AS u(i, f)",
                            (terms[0], terms[1])).fetchone()[0]
        reach, everything = conn.execute("SELECT rag.label_rows(%s, %s), rag.total_rows(%s)",
                                         (version.version_id, list(labels), version.version_id)).fetchone()
        for want in (1, 10, TOP):
            direct = store.search.bm25_ranking(conn, version, query, labels, want, max_terms=64, few_rows=10**9)
            for start in (0.01, 8, 10**6):
                done, chunk_ids, scores = conn.execute(
                    "SELECT * FROM rag.bm25_by_term_sets(%s, %s, %s, %s, %s::sparsevec, %s, %s, %s, %s, %s, 1e12)",
                    (version.version_id, *terms, qvec, list(labels), want, reach, everything, start)).fetchone()
                settled[done] += 1
                if done:
                    assert (chunk_ids or []) == direct.chunk_ids, (query, want, start)
                    assert [float(s) for s in scores or []] == pytest.approx(direct.scores, rel=1e-9), (query, want)
    assert settled[True] >= 0.8 * sum(settled.values()), settled  # nearly every query is answered this way


@NEW_DATABASE
def test_the_term_set_path_leaves_what_it_cannot_settle_cheaply(corpus_db):
    """Over 10 terms (2^n sets), or a level estimated above the cap: not settled, and rag.bm25_ranking ranks it
    over the postings instead, to the same list."""
    conn, version, vocabulary = corpus_db
    query = " ".join(vocabulary[200:214])
    terms = conn.execute("SELECT array_agg(term_id ORDER BY term_id), array_agg(idf ORDER BY term_id),"
                         " array_agg(df ORDER BY term_id) FROM rag.query_terms(%s, %s, 64)",
                         (version.version_id, query)).fetchone()
    assert len(terms[0]) > 10
    for term_ids, idfs, dfs, cap in ((terms[0], terms[1], terms[2], 1e12),
                                     (terms[0][:3], terms[1][:3], terms[2][:3], 0)):
        done = conn.execute("SELECT settled FROM rag.bm25_by_term_sets(%s, %s, %s, %s, '{1:1}/1000000000', "
                            "%s, 10, %s, %s, 8, %s)", (version.version_id, term_ids, idfs, dfs, ["staff"], CHUNKS,
                                                        CHUNKS, cap)).fetchone()[0]
        assert done is False
    by_postings = store.search.bm25_ranking(conn, version, query, ("staff",), 10, max_terms=64, few_rows=0,
                                            term_sets=False)
    assert store.search.bm25_ranking(conn, version, query, ("staff",), 10, max_terms=64, few_rows=0) == by_postings


@BOTH_DATABASES
def test_deletions_and_inserts_keep_the_counters_true(corpus_db):
    conn, version, vocabulary = corpus_db
    table = sql.Identifier(version.table_name)
    conn.execute(sql.SQL("DELETE FROM {} WHERE ordinal %% 10 = 3").format(table), ())
    state = store.versions.bm25_state(conn, version)
    rows = store.versions.row_count(conn, version)
    assert state.rows_counted == state.rows_weighted == rows == CHUNKS - CHUNKS // 10
    # No re-weighting after the deletions: the weights still use the build's average length, and the list stays
    # within the tolerance of textbook BM25 on the live corpus.
    for name, query in _queries(vocabulary).items():
        expected = _reference(conn, version, query, {"staff"})
        got = store.search.bm25_ranking(conn, version, query, ("staff",), TOP, max_terms=64, few_rows=0)
        assert _overlap(got.chunk_ids, expected) >= 0.95, name
    postings = sql.Identifier(f"{version.table_name}_postings")
    orphans = conn.execute(sql.SQL("SELECT count(*) FROM {} p WHERE NOT EXISTS (SELECT 1 FROM {} t"
                                   " WHERE t.lexical_id = p.lexical_id)").format(postings, table)).fetchone()[0]
    assert orphans == 0


def test_identifiers_are_matched_as_typed(db):
    version = store.versions.ensure_active(db, FAKE_MODEL, 8, "c", "p")
    db.execute("INSERT INTO sources (name, root, include_patterns, freshness_sla_seconds) VALUES ('s', '/x', '{}', 1)")
    db.execute("""INSERT INTO documents (doc_id, source, rel_path, fingerprint, size_bytes, modified_at, acl_labels,
                                         status) VALUES ('d', 's', 'd.md', 'f', 1, now(), '{staff}', 'indexed')""")
    texts = ["The company filed its 10-K for FY2019 under § 240.13a-15.", "Form 10 and a k of paper.",
             "pg_stat_activity shows one row per server process.", "Statistics on activity of the pg server."]
    for i, text in enumerate(texts):
        db.execute(sql.SQL(
            "INSERT INTO {} (chunk_id, owner_chunk_id, doc_id, ordinal, text, prefix, section_path, page_start,"
            " page_end, content_type, acl_labels, embedding_input_sha, embedding)"
            " VALUES (%s, %s, 'd', %s, %s, '', '', 1, 1, 'prose', '{{staff}}', 's', %s)").format(
                sql.Identifier(version.table_name)), (f"c{i}", f"c{i}", i, text, HalfVector([0.1] * 8)))
    for query, best in (("10-K", "c0"), ("fy2019 filing", "c0"), ("240.13a-15", "c0"), ("pg_stat_activity", "c2")):
        assert store.search.bm25_ranking(db, version, query, ("staff",), 2).chunk_ids[0] == best, query


def _bm25_structures(conn, version) -> dict[str, object]:
    """Everything a version's BM25 holds, in an order-free form, and the postings' index definitions."""
    def rows(query: str, *names: str) -> list[tuple]:
        return conn.execute(sql.SQL(query).format(*(sql.Identifier(version.table_name + n) for n in names))).fetchall()

    return {
        "postings": rows("SELECT term_id, lexical_id, tf, weight FROM {} ORDER BY 1, 2", "_postings"),
        "weights": rows("SELECT lexical_id, len, vec::text FROM {} ORDER BY 1", "_bm25docs"),
        "df": rows("SELECT term_id, sum(df) FROM {} GROUP BY 1 HAVING sum(df) <> 0 ORDER BY 1", "_bm25_df"),
        "totals": rows("SELECT sum(chunks), sum(total_len) FROM {}", "_bm25_totals"),
        "params": rows("SELECT k1, b, avgdl, configs::text FROM {}", "_bm25_params"),
        "indexes": sorted(r[0] for r in conn.execute(
            "SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = %s::regclass",
            (f"{version.table_name}_postings",)).fetchall()),
        "key": conn.execute("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = %s::regclass"
                            " AND contype = 'p'", (f"{version.table_name}_postings",)).fetchall(),
    }


@BOTH_DATABASES
def test_a_rebuild_writes_what_the_triggers_wrote(corpus_db):
    """The set-based rebuild (bulk loads, the reindex step) against the triggers' row-by-row writes and a re-weight:
    the same postings with the same weights, weight vectors, counters and parameters, and the postings' key and
    indexes made again as they were (the rebuild drops them for the load)."""
    conn, version, _ = corpus_db
    with conn.transaction():
        store.versions.reweight_bm25(conn, version, K1, B)
    written = _bm25_structures(conn, version)
    assert len(written["postings"]) > CHUNKS * 10 and len(written["indexes"]) == 2 and written["key"]
    with conn.transaction():
        store.versions.rebuild_bm25(conn, version)
    rebuilt = _bm25_structures(conn, version)
    for name, before in written.items():
        assert rebuilt[name] == before, name


def _bm25_by_chunk(conn, version) -> dict[str, list[tuple]]:
    """A version's BM25 structures keyed by chunk id (row keys differ between versions holding the same rows)."""
    def rows(query: str, *names: str) -> list[tuple]:
        return conn.execute(sql.SQL(query).format(*(sql.Identifier(version.table_name + n) for n in names))).fetchall()

    return {
        "postings": rows("SELECT t.chunk_id, p.term_id, p.tf, p.weight FROM {} p JOIN {} t USING (lexical_id) "
                         "ORDER BY 1, 2", "_postings", ""),
        "weights": rows("SELECT t.chunk_id, d.len, d.vec::text FROM {} d JOIN {} t USING (lexical_id) ORDER BY 1",
                        "_bm25docs", ""),
        "df": rows("SELECT term_id, sum(df) FROM {} GROUP BY 1 HAVING sum(df) <> 0 ORDER BY 1", "_bm25_df"),
        "totals": rows("SELECT sum(chunks), sum(total_len) FROM {}", "_bm25_totals"),
        "params": rows("SELECT k1, b, avgdl FROM {}", "_bm25_params"),
        "indexes": sorted(r[0].replace(version.table_name, "index_vN") for r in conn.execute(
            "SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = %s::regclass",
            (f"{version.table_name}_postings",)).fetchall()),
    }


@NEW_DATABASE
def test_a_version_no_search_reads_is_reweighted_by_writing_its_postings_again(corpus_db):
    """The active version is re-weighted in place (searches go on); a version being built has its postings written
    again from their term frequencies, keys and indexes built after them. Both give the same postings, weights,
    counters and parameters for the same rows, and the rewritten version keeps its key and indexes."""
    conn, active, _ = corpus_db
    columns = sql.SQL("chunk_id, owner_chunk_id, doc_id, ordinal, text, prefix, section_path, page_start, page_end, "
                      "content_type, acl_labels, embedding_input_sha, embedding")
    with conn.transaction():
        building = store.versions.create_version(conn, FAKE_MODEL, 8, "c", "p", K1, B)
        conn.execute(sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} ORDER BY chunk_id DESC").format(
            sql.Identifier(building.table_name), columns, columns, sql.Identifier(active.table_name)))
    assert building.status == "building"

    def files() -> list[int]:  # a rewritten (truncated) table gets a new file, an updated one keeps its own
        return [conn.execute("SELECT pg_relation_filenode(%s::regclass)", (f"{v.table_name}_postings",)).fetchone()[0]
                for v in (active, building)]

    before = files()
    with conn.transaction():
        store.versions.reweight_bm25(conn, active, K1, B)
        store.versions.reweight_bm25(conn, building, K1, B)
    after = files()
    assert after[0] == before[0] and after[1] != before[1]
    in_place, rewritten = _bm25_by_chunk(conn, active), _bm25_by_chunk(conn, building)
    assert len(rewritten["postings"]) > CHUNKS * 10 and len(rewritten["indexes"]) == 2
    for name, expected in in_place.items():
        assert rewritten[name] == expected, name
