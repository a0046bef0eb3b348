"""Golden-set evaluation of retrieval: hit@k, recall@k, MRR and nDCG@k per slice, abstention on unanswerables.

Golden set: JSON Lines, one question per line:
  {"id": "q1", "question": "...", "answerable": true, "slice": "table",
   "gold": [{"doc": "relative/path/in/source.pdf", "pages": [12, 13]}], "gold_chunk_ids": ["..."],
   "labels": ["finance"]}
A question's own `labels` (optional) are the ACL labels it is asked with; a question without them is asked with the
evaluation's labels (`checks.golden_labels`, `eval --labels`). So one set can hold questions for several audiences.
A retrieved chunk is relevant when its id is a gold chunk id, or it belongs to a gold document and its page
span overlaps a gold page (a gold entry without pages accepts any page of the document).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

from rag_pipeline import store
from rag_pipeline.retrieval.search import SearchHit, SearchOptions, search
from rag_pipeline.store.versions import IndexVersion


class GoldenSetError(ValueError):
    """A golden set that cannot be used as it is; the message names the file and line."""


@dataclass(frozen=True)
class GoldDoc:
    doc: str
    pages: tuple[int, ...] = ()


@dataclass(frozen=True)
class GoldQuestion:
    id: str
    question: str
    answerable: bool
    slice: str
    gold: tuple[GoldDoc, ...] = ()
    gold_chunk_ids: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()  # asked with these labels; empty: the evaluation's

    def asked_with(self, labels: Sequence[str] | str) -> Sequence[str] | str:
        return self.labels or labels

    def units(self) -> set[tuple[str, ...]]:
        """What a perfect retrieval covers: every gold (document, page) and every gold chunk id."""
        units: set[tuple[str, ...]] = {("chunk", c) for c in self.gold_chunk_ids}
        for g in self.gold:
            units |= {("page", g.doc, str(p)) for p in g.pages} if g.pages else {("doc", g.doc)}
        return units

    def covered_by(self, hit: SearchHit) -> set[tuple[str, ...]]:
        covered: set[tuple[str, ...]] = set()
        if hit.chunk_id in self.gold_chunk_ids:
            covered.add(("chunk", hit.chunk_id))
        for g in self.gold:
            if hit.path != g.doc:
                continue
            if not g.pages:
                covered.add(("doc", g.doc))
            covered |= {("page", g.doc, str(p)) for p in g.pages if hit.page_start <= p <= hit.page_end}
        return covered


def _question_labels(value: Any) -> tuple[str, ...]:
    """A question's labels: a list of strings (a string would be one label by accident, so it is refused)."""
    if not isinstance(value, list) or not value or not all(isinstance(label, str) and label.strip() for label in value):
        raise ValueError(f"labels must be a non-empty list of non-empty strings (leave the key out for the "
                         f"evaluation's labels), got {value!r}")
    return tuple(dict.fromkeys(label.strip() for label in value))


def load_golden(path: Path) -> list[GoldQuestion]:
    questions: list[GoldQuestion] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            question = GoldQuestion(
                id=str(raw["id"]),
                question=str(raw["question"]),
                answerable=bool(raw.get("answerable", True)),
                slice=str(raw.get("slice", "all")),
                gold=tuple(GoldDoc(g["doc"], tuple(int(p) for p in g.get("pages", ()))) for g in raw.get("gold", ())),
                gold_chunk_ids=tuple(raw.get("gold_chunk_ids", ())),
                labels=_question_labels(raw["labels"]) if "labels" in raw else (),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise GoldenSetError(f"{path}:{number}: {exc}") from exc
        if question.answerable and not question.units():
            raise GoldenSetError(f"{path}:{number}: answerable question {question.id} has no gold")
        if not question.answerable and question.units():
            raise GoldenSetError(f"{path}:{number}: unanswerable question {question.id} has gold")
        questions.append(question)
    if len({q.id for q in questions}) != len(questions):
        raise GoldenSetError(f"{path}: duplicate question ids")
    return questions


@dataclass
class QuestionResult:
    id: str
    slice: str
    answerable: bool
    hit: float = 0.0
    recall: float = 0.0
    reciprocal_rank: float = 0.0
    ndcg: float = 0.0
    abstained: bool = False
    retrieved: list[str] = field(default_factory=list)


def score_question(question: GoldQuestion, hits: Sequence[SearchHit], k: int) -> QuestionResult:
    result = QuestionResult(question.id, question.slice, question.answerable,
                            retrieved=[f"{h.path}#p{h.page_start}-{h.page_end}" for h in hits[:k]])
    if not question.answerable:
        result.abstained = not hits
        return result
    units = question.units()
    covered: set[tuple[str, ...]] = set()
    gains = []
    for rank, hit in enumerate(hits[:k], 1):
        reached = question.covered_by(hit)
        if reached and not result.reciprocal_rank:
            result.reciprocal_rank = 1.0 / rank
        # Gain only for gold not covered yet: a second chunk of the same page adds nothing (nDCG stays <= 1).
        gains.append(1.0 if reached - covered else 0.0)
        covered |= reached
    result.hit = 1.0 if covered else 0.0
    result.recall = len(covered & units) / len(units)
    dcg = sum(g / math.log2(rank + 1) for rank, g in enumerate(gains, 1))
    ideal = sum(1 / math.log2(rank + 1) for rank in range(1, min(k, len(units)) + 1))
    result.ndcg = dcg / ideal if ideal else 0.0
    return result


@dataclass
class EvalReport:
    version: int
    model: str
    mode: str
    k: int
    questions: int
    metrics: dict[str, dict[str, float]]  # slice (and "overall") -> metric -> value
    results: list[QuestionResult]


def aggregate(results: Sequence[QuestionResult]) -> dict[str, dict[str, float]]:
    groups: dict[str, list[QuestionResult]] = defaultdict(list)
    for r in results:
        groups["overall"].append(r)
        groups[r.slice].append(r)
    metrics: dict[str, dict[str, float]] = {}
    for name, members in sorted(groups.items()):
        answerable = [r for r in members if r.answerable]
        unanswerable = [r for r in members if not r.answerable]
        entry: dict[str, float] = {"questions": float(len(members))}
        if answerable:
            for metric, attribute in (("hit@k", "hit"), ("recall@k", "recall"), ("mrr", "reciprocal_rank"),
                                      ("ndcg@k", "ndcg")):
                entry[metric] = round(sum(getattr(r, attribute) for r in answerable) / len(answerable), 4)
        if unanswerable:
            entry["abstention"] = round(sum(r.abstained for r in unanswerable) / len(unanswerable), 4)
        metrics[name] = entry
    return metrics


def evaluate(
    conn: psycopg.Connection,
    questions: Sequence[GoldQuestion],
    labels: Sequence[str] | str,
    *,
    k: int = 10,
    mode: str = "hybrid",
    version: IndexVersion | None = None,
    options: SearchOptions | None = None,
) -> EvalReport:
    version = version or store.versions.active_version(conn)
    if version is None:
        raise GoldenSetError("there is no active index version to evaluate")
    results = [
        score_question(q, search(conn, q.question, q.asked_with(labels), k=k, mode=mode, version=version,
                                 options=options), k)
        for q in questions
    ]
    return EvalReport(version.version_id, version.embedding_model, mode, k, len(questions), aggregate(results), results)


METRIC_ORDER = ("hit@k", "recall@k", "mrr", "ndcg@k", "abstention")
# The metrics a candidate may not lose against a reference: the promotion gate and retrieval_quality.
GATED_METRICS = ("recall@k", "ndcg@k")
# Per-question values of each aggregated metric (QuestionResult attributes).
METRIC_ATTRIBUTES = {"hit@k": "hit", "recall@k": "recall", "mrr": "reciprocal_rank", "ndcg@k": "ndcg"}
SIGNIFICANCE = 0.05  # a difference is called real when a paired permutation test gives p below this
RESAMPLES = 10_000


@dataclass(frozen=True)
class PairedDifference:
    """One metric of a candidate against a reference on the same answerable questions."""

    metric: str
    reference: float
    candidate: float
    difference: float  # candidate - reference
    ci_low: float  # 95% bootstrap confidence interval of the difference
    ci_high: float
    p_value: float  # two-sided paired permutation (sign-flip) test
    questions: int

    @property
    def significant(self) -> bool:
        return self.p_value < SIGNIFICANCE

    def describe(self) -> str:
        return (f"{self.metric} {self.reference:.4f} -> {self.candidate:.4f} ({self.difference:+.4f}, 95% CI "
                f"{self.ci_low:+.4f}..{self.ci_high:+.4f}, p={self.p_value:.3f}, n={self.questions})")


def paired_differences(
    reference: Sequence[QuestionResult], candidate: Sequence[QuestionResult], *, seed: int = 0
) -> list[PairedDifference]:
    """Per metric, the paired difference over the answerable questions both evaluations asked, with a bootstrap
    confidence interval and a permutation p-value: one flipped question in 42 is noise, not a regression."""
    by_id = {r.id: r for r in reference if r.answerable}
    pairs = [(by_id[c.id], c) for c in candidate if c.answerable and c.id in by_id]
    differences = []
    for index, (metric, attribute) in enumerate(METRIC_ATTRIBUTES.items()):
        rng = np.random.default_rng([seed, index])  # a metric's resamples do not depend on the metrics before it
        a = np.array([getattr(r, attribute) for r, _ in pairs], dtype=float)
        b = np.array([getattr(c, attribute) for _, c in pairs], dtype=float)
        if not len(pairs):
            continue
        delta = b - a
        observed = float(delta.mean())
        if delta.any():
            means = delta[rng.integers(0, len(delta), size=(RESAMPLES, len(delta)))].mean(axis=1)
            flipped = (delta * rng.choice((-1.0, 1.0), size=(RESAMPLES, len(delta)))).mean(axis=1)
            p_value = float((np.sum(np.abs(flipped) >= abs(observed) - 1e-12) + 1) / (RESAMPLES + 1))
        else:  # no question moved (an unchanged index, every refresh): every resample is 0, what follows is exact
            means, p_value = np.zeros(1), 1.0
        differences.append(PairedDifference(
            metric, round(float(a.mean()), 4), round(float(b.mean()), 4), round(observed, 4),
            round(float(np.percentile(means, 2.5)), 4), round(float(np.percentile(means, 97.5)), 4),
            round(p_value, 4) if observed else 1.0, len(pairs)))
    return differences


@dataclass(frozen=True)
class Regression:
    difference: PairedDifference
    tolerance: float

    def __str__(self) -> str:
        return f"{self.difference.describe()} fell by more than {self.tolerance} and the fall is significant"


def regressions(
    reference: Sequence[QuestionResult], candidate: Sequence[QuestionResult], tolerance: float
) -> list[Regression]:
    """Gated metrics that fell by more than `tolerance` with a difference the paired test calls real."""
    return [Regression(d, tolerance) for d in paired_differences(reference, candidate)
            if d.metric in GATED_METRICS and d.difference < -tolerance and d.significant]


def results_from_json(rows: Sequence[dict[str, Any]]) -> list[QuestionResult]:
    return [QuestionResult(**row) for row in rows]


@dataclass(frozen=True)
class FloorPoint:
    floor: float
    recall: float  # recall@k of the answerable questions with this floor
    hit: float
    abstention: float  # share of unanswerable questions answered with nothing


def floor_sweep(
    conn: psycopg.Connection,
    questions: Sequence[GoldQuestion],
    labels: Sequence[str] | str,
    floors: Sequence[float],
    *,
    k: int = 10,
    mode: str = "hybrid",
    version: IndexVersion | None = None,
    options: SearchOptions | None = None,
) -> list[FloorPoint]:
    """Recall and abstention for each score floor, from one search per question: a deeper list is fetched and
    each floor drops the hits below it before the cut at k, as `retrieval.min_similarity` would."""
    options = options or SearchOptions()
    unfloored = replace(options, min_similarity=None)
    fetched = [(q, search(conn, q.question, q.asked_with(labels), k=3 * k, mode=mode, version=version,
                          options=unfloored))
               for q in questions]
    points = []
    for floor in floors:
        results = [score_question(q, [h for h in hits if h.similarity is None or h.similarity >= floor][:k], k)
                   for q, hits in fetched]
        overall = aggregate(results)["overall"]
        points.append(FloorPoint(floor, overall.get("recall@k", 0.0), overall.get("hit@k", 0.0),
                                 overall.get("abstention", 0.0)))
    return points


def report_table(reports: Sequence[EvalReport]) -> str:
    """One Markdown table: a row per slice, a column per metric and report (with deltas for two reports)."""
    header = ["slice", "n"]
    for report in reports:
        header += [f"{m} v{report.version}/{report.mode}" for m in METRIC_ORDER]
    if len(reports) == 2:
        header += [f"Δ {m}" for m in METRIC_ORDER]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in reports[0].metrics:
        row: list[Any] = [name, int(reports[0].metrics[name]["questions"])]
        for report in reports:
            row += [report.metrics.get(name, {}).get(m, "") for m in METRIC_ORDER]
        if len(reports) == 2:
            a, b = reports[0].metrics.get(name, {}), reports[1].metrics.get(name, {})
            row += [round(b[m] - a[m], 4) if m in a and m in b else "" for m in METRIC_ORDER]
        lines.append("| " + " | ".join(str(cell) for cell in row) + " |")
    return "\n".join(lines)
