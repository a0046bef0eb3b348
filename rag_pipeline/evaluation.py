"""Golden-set evaluation of retrieval: hit@k, recall@k, MRR and nDCG@k per slice, abstention on unanswerables.

Golden set: JSON Lines, one question per line:
  {"id": "q1", "question": "...", "answerable": true, "slice": "table",
   "gold": [{"doc": "relative/path/in/source.pdf", "pages": [12, 13]}], "gold_chunk_ids": ["..."]}
A retrieved chunk is relevant when its id is a gold chunk id, or it belongs to a gold document and its page
span overlaps a gold page (a gold entry without pages accepts any page of the document).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from rag_pipeline.retrieval import SearchHit, SearchOptions, search
from rag_pipeline.store import versions
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
    version = version or versions.active_version(conn)
    if version is None:
        raise GoldenSetError("there is no active index version to evaluate")
    results = [
        score_question(q, search(conn, q.question, labels, k=k, mode=mode, version=version, options=options), k)
        for q in questions
    ]
    return EvalReport(version.version_id, version.embedding_model, mode, k, len(questions), aggregate(results), results)


METRIC_ORDER = ("hit@k", "recall@k", "mrr", "ndcg@k", "abstention")
# The metrics a candidate may not lose against a reference: the promotion gate and retrieval_quality.
GATED_METRICS = ("recall@k", "ndcg@k")


@dataclass(frozen=True)
class Regression:
    metric: str
    reference: float
    candidate: float
    tolerance: float

    def __str__(self) -> str:
        return f"{self.metric} {self.candidate} < {self.reference} - {self.tolerance}"


def compare(reference: dict[str, float], candidate: dict[str, float], tolerance: float) -> list[tuple[str, float, float, bool]]:
    """Per gated metric: (metric, reference, candidate, regressed): a fall of more than `tolerance` regresses."""
    rows = []
    for metric in GATED_METRICS:
        before, after = reference.get(metric, 0.0), candidate.get(metric, 0.0)
        rows.append((metric, before, after, after < before - tolerance))
    return rows


def regressions(reference: dict[str, float], candidate: dict[str, float], tolerance: float) -> list[Regression]:
    return [Regression(metric, before, after, tolerance)
            for metric, before, after, regressed in compare(reference, candidate, tolerance) if regressed]


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
