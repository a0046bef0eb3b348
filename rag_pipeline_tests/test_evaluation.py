"""Golden-set evaluation: exact metric values on hand-made results, and the shipped golden set end to end."""

import json
import os
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from dagster import DagsterInstance

from rag_pipeline.defs.runs import run_ingest
from rag_pipeline.retrieval.evaluation import (
    GoldDoc,
    GoldenSetError,
    GoldQuestion,
    QuestionResult,
    evaluate,
    floor_sweep,
    load_golden,
    paired_differences,
    regressions,
    report_table,
    score_question,
)
from rag_pipeline.retrieval.search import SearchHit, SearchOptions
from rag_pipeline_tests.conftest import GOLDEN


def _hit(path: str, start: int, end: int | None = None, chunk_id: str = "c") -> SearchHit:
    return SearchHit(chunk_id, "d", "s", path, start, end or start, "", "prose", "text", "", 0.1, 1, 1)


def test_metrics_on_known_rankings():
    question = GoldQuestion("q", "?", True, "table", (GoldDoc("a.pdf", (2, 3)),))
    result = score_question(question, [_hit("b.pdf", 1), _hit("a.pdf", 2), _hit("a.pdf", 2), _hit("a.pdf", 3)], k=4)
    assert result.hit == 1.0 and result.recall == 1.0
    assert result.reciprocal_rank == pytest.approx(0.5)
    # gains 0, 1, 0 (same page again), 1; ideal: two gold pages at ranks 1 and 2
    expected = (1 / 1.584962500721156 + 1 / 2.321928094887362) / (1 + 1 / 1.584962500721156)
    assert result.ndcg == pytest.approx(expected)
    partial = score_question(question, [_hit("a.pdf", 3)], k=4)
    assert partial.recall == 0.5 and partial.reciprocal_rank == 1.0
    spanning = score_question(question, [_hit("a.pdf", 1, 4)], k=4)
    assert spanning.recall == 1.0  # a chunk spanning pages 1-4 covers both gold pages
    by_id = GoldQuestion("q", "?", True, "x", gold_chunk_ids=("wanted",))
    assert score_question(by_id, [_hit("z", 1, chunk_id="wanted")], k=1).hit == 1.0
    unanswerable = GoldQuestion("u", "?", False, "unanswerable")
    assert score_question(unanswerable, [], k=3).abstained is True
    assert score_question(unanswerable, [_hit("a.pdf", 1)], k=3).abstained is False


def test_golden_set_validation(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "q1", "question": "?", "answerable": True}) + "\n")
    with pytest.raises(GoldenSetError, match="no gold"):
        load_golden(bad)
    for labels in ("staff", []):  # a string would be one label by accident; an empty list, no labels at all
        bad.write_text(json.dumps({"id": "q1", "question": "?", "gold": [{"doc": "a.md"}], "labels": labels}) + "\n")
        with pytest.raises(GoldenSetError, match="labels must be a non-empty list"):
            load_golden(bad)
    shipped = load_golden(GOLDEN)
    assert len(shipped) >= 40
    assert sum(not q.answerable for q in shipped) >= 5
    assert {"table", "multi_page"} <= {q.slice for q in shipped}
    assert any(len(g.pages) > 1 for q in shipped for g in q.gold)


def test_shipped_golden_set_on_the_sample_corpus(make_settings, corpus, db):
    settings = make_settings([{"name": "sample", "root": str(corpus), "acl_labels": ["staff"]}])
    with DagsterInstance.ephemeral() as instance:
        assert run_ingest(settings, instance=instance)["success"]
    questions = load_golden(GOLDEN)
    reports = {mode: evaluate(db, questions, ["staff", "finance"], k=3, mode=mode) for mode in ("dense", "sparse")}
    for report in reports.values():
        assert set(report.metrics) >= {"overall", "prose", "table", "finance", "multi_page", "unanswerable"}
        assert 0.0 <= report.metrics["overall"]["ndcg@k"] <= 1.0
    assert reports["dense"].metrics["overall"]["recall@k"] >= 0.9
    # Questions are paraphrased: keyword matching alone must not solve the set.
    assert reports["sparse"].metrics["overall"]["recall@k"] < 0.95
    # The finance questions carry their own labels, so the shipped golden_labels ([staff]) measure them too...
    finance = [q for q in questions if q.slice == "finance"]
    assert finance and all(q.labels == ("finance",) for q in finance)
    assert evaluate(db, finance, ["staff"], k=3, mode="dense").metrics["overall"]["hit@k"] >= 0.8
    # ...and without the finance label they cannot be answered: the ACL holds in evaluation too.
    staff_only = evaluate(db, [replace(q, labels=()) for q in finance], ["staff"], k=3, mode="dense")
    assert staff_only.metrics["overall"]["hit@k"] == 0.0
    floor = evaluate(db, questions, ["staff", "finance"], k=3, mode="dense", options=SearchOptions(min_similarity=0.35))
    assert floor.metrics["unanswerable"]["abstention"] > 0.0
    assert "Δ hit@k" in report_table([reports["dense"], reports["sparse"]])
    # The floor sweep: a higher floor answers fewer questions, and abstains more on unanswerable ones.
    points = floor_sweep(db, questions, ["staff", "finance"], [0.0, 0.35, 0.9], k=3, mode="dense")
    assert [p.floor for p in points] == [0.0, 0.35, 0.9]
    assert points[0].recall == reports["dense"].metrics["overall"]["recall@k"]
    assert points[0].recall >= points[1].recall >= points[2].recall
    assert points[0].abstention <= points[1].abstention <= points[2].abstention == 1.0


def _results(recalls: list[float]) -> list[QuestionResult]:
    return [QuestionResult(f"q{i}", "all", True, hit=float(r > 0), recall=r, reciprocal_rank=r, ndcg=r)
            for i, r in enumerate(recalls)]


def test_one_flipped_question_is_noise_and_a_real_fall_is_not():
    reference = _results([1.0] * 42)
    one_flipped = _results([1.0] * 41 + [0.0])
    (recall,) = [d for d in paired_differences(reference, one_flipped) if d.metric == "recall@k"]
    assert recall.difference == pytest.approx(-1 / 42, abs=1e-4) and not recall.significant
    assert recall.ci_low < 0 <= recall.ci_high
    assert regressions(reference, one_flipped, tolerance=0.02) == []  # larger than the tolerance, but noise
    ten_lost = _results([1.0] * 32 + [0.0] * 10)
    (recall,) = [d for d in paired_differences(reference, ten_lost) if d.metric == "recall@k"]
    assert recall.significant and recall.ci_high < 0
    assert [r.difference.metric for r in regressions(reference, ten_lost, tolerance=0.02)] == ["recall@k", "ndcg@k"]
    assert regressions(reference, ten_lost, tolerance=0.5) == []  # real, but within a generous tolerance
    same = paired_differences(reference, reference)
    assert all(d.p_value == 1.0 and d.ci_low == d.ci_high == d.difference == 0 and not d.significant for d in same)


PG_MANUAL = Path("/usr/share/doc/postgresql-doc-15/html")
needs_pg_manual = pytest.mark.skipif(not PG_MANUAL.is_dir() and not os.environ.get("CI"),
                                     reason="Debian's postgresql-doc-15 is not installed (.ci/run installs it)")


@needs_pg_manual
def test_the_pg_manual_golden_set_is_answered_by_its_gold_pages(tmp_path):
    """Every answerable question's evidence is on its gold pages, every gold page is in the corpus the script
    builds, and the set has the slices it claims."""
    import html
    import re

    from scripts.make_pg_manual_corpus import build

    corpus = {p.name for p in build(PG_MANUAL, tmp_path / "corpus")}
    questions = load_golden(Path(__file__).resolve().parent.parent / "golden" / "pg_manual.jsonl")
    raw = {json.loads(line)["id"]: json.loads(line) for line in
           (Path(__file__).resolve().parent.parent / "golden" / "pg_manual.jsonl").read_text().splitlines()}
    slices = Counter(q.slice for q in questions)
    assert len(questions) >= 150 and set(slices) == {"exact_term", "paraphrase", "table", "multi_page", "unanswerable"}
    assert slices["unanswerable"] >= 10 and slices["multi_page"] >= 10
    for question in questions:
        if not question.answerable:
            continue
        assert {g.doc for g in question.gold} <= corpus, question.id
        text = " ".join(re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", (PG_MANUAL / g.doc).read_text())))
                        for g in question.gold)
        assert all(evidence in text for evidence in raw[question.id]["evidence"]), question.id
    assert all(len(q.gold) >= 2 for q in questions if q.slice == "multi_page")
