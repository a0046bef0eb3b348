"""Ingestion assets: source_documents -> parsed_documents -> document_chunks -> search_index."""

import contextlib
import dataclasses
import threading
from collections.abc import Iterator

import dagster as dg

from rag_pipeline.config import SourceConfig
from rag_pipeline.defs.metadata import markdown_table
from rag_pipeline.defs.resources import RagResource
from rag_pipeline.stages.chunk import ChunkStats
from rag_pipeline.stages.discover import DiscoverStats, discover
from rag_pipeline.stages.index import IndexStats
from rag_pipeline.stages.parse import ParseStats
from rag_pipeline.stages.process import process_pending
from rag_pipeline.store import documents, pages, versions
from rag_pipeline.store.database import connect

GROUP = "ingestion"
REFRESH_TAG = "rag_pipeline/index_writer"
# Each asset's statistics: the stage's short name and its stats class (rag_pipeline.runs summarises them).
STAGE_STATS = {
    "source_documents": ("discover", DiscoverStats),
    "parsed_documents": ("parse", ParseStats),
    "document_chunks": ("chunk", ChunkStats),
    "search_index": ("index", IndexStats),
}


class DiscoverConfig(dg.Config):
    """Which configured sources to scan (all when empty), and which may delete beyond their guard."""

    sources: list[str] = []  # names of configured sources; a run cannot name a folder or labels of its own
    confirm_deletions: list[str] = []  # sources whose held deletions (an emptied root, a mass deletion) are meant


# Sources given on the command line (`rag-pipeline ingest --source NAME=PATH`), set only around the CLI's own
# in-process run (rag_pipeline.runs). A run launched from the UI runs in another process and scans configured
# sources only: the UI can neither point ingestion at a folder nor give it labels.
_command_line_sources: list[SourceConfig] = []
_command_line_lock = threading.Lock()  # one command-line run at a time per process: the hand-off is global


@contextlib.contextmanager
def command_line_sources(sources: list[SourceConfig]) -> Iterator[None]:
    with _command_line_lock:
        _command_line_sources[:] = sources
        try:
            yield
        finally:
            _command_line_sources.clear()


@dataclasses.dataclass
class ScanPlan:
    sources: list[SourceConfig]
    origin: str  # how these sources are registered: "config" or "command_line"
    removed: list[str]  # configured sources no longer in the configuration: their documents are held


def sources_to_scan(rag: RagResource, config: DiscoverConfig) -> ScanPlan:
    if _command_line_sources:
        return ScanPlan(list(_command_line_sources), "command_line", [])
    configured = {s.name: s for s in rag.settings().sources}
    with connect(rag.database_url()) as conn:
        # Sources an earlier command line registered keep being refreshed, with what it gave them.
        registered = {s.name: s for s in documents.registered_sources(conn, "command_line") if s.name not in configured}
        removed = documents.configured_sources_removed(conn, list(configured))
    known = {**registered, **configured}
    unknown = sorted(set(config.sources) - known.keys())
    if unknown:
        raise dg.Failure(f"sources not configured: {', '.join(unknown)}; a run scans configured sources only "
                         f"(known: {', '.join(sorted(known)) or 'none'})")
    chosen = [known[name] for name in config.sources] if config.sources else list(known.values())
    return ScanPlan(chosen, "config", removed)


@dg.asset(group_name=GROUP, description="Every file in every source, reconciled with the documents table.")
def source_documents(context: dg.AssetExecutionContext, config: DiscoverConfig, rag: RagResource):
    db_url = rag.database_url()
    plan = sources_to_scan(rag, config)
    if not plan.sources and not plan.removed:
        raise dg.Failure("no sources: add them to rag_pipeline.yaml or pass --source NAME=PATH")
    stats = discover(
        db_url, plan.sources, progress=context.log.info, lock_timeout_seconds=rag.settings().lock_timeout_seconds,
        confirm_deletions=config.confirm_deletions, origin=plan.origin, removed=plan.removed,
    )
    return dg.MaterializeResult(
        metadata={
            "documents_seen": stats.documents_seen,
            "new": stats.new,
            "changed": stats.changed,
            "unchanged": stats.unchanged,
            "deleted": stats.deleted,
            "relabelled_without_reembedding": stats.relabelled,
            "newly_held": stats.held,
            "deletions_held": stats.deletions_held,
            "seconds": round(stats.seconds, 3),
            "per_source": markdown_table(
                ("source", "seen", "new", "changed", "deleted", "relabelled", "held", "deletions held"),
                [(name, *counts.values()) for name, counts in stats.per_source.items()],
            ),
            "problems": markdown_table(
                ("source", "path", "problem"), [tuple(p.values()) for p in stats.problems]
            ),
            "stats": dg.MetadataValue.json(stats.as_dict()),
        }
    )


@dg.multi_asset(
    specs=[
        dg.AssetSpec("parsed_documents", group_name=GROUP, deps=[source_documents],
                     description="Per-page text of new and changed documents; failures (a corrupt file, a file "
                                 "over its time or memory budget) are dead-lettered with a reason."),
        dg.AssetSpec("document_chunks", group_name=GROUP, deps=["parsed_documents"],
                     description="Structure-aware, token-sized chunks with their contextual prefixes."),
        dg.AssetSpec("search_index", group_name=GROUP, deps=["document_chunks"],
                     description="Embeddings written into every writable index version (pgvector halfvec + HNSW, "
                                 "BM25)."),
    ],
    description="Each queued document leased by one worker process (one per core by default) that parses, cleans "
                "and chunks it within a time and memory budget, while this step embeds and indexes what they "
                "finish.",
)
def process_documents(context: dg.AssetExecutionContext, rag: RagResource):
    db_url = rag.database_url()
    stats = process_pending(db_url, rag.settings(), progress=context.log.info)
    with connect(db_url) as conn:
        dead = pages.dead_letter_summary(conn)
        statuses = documents.status_counts(conn)
        all_versions = versions.index_versions(conn)
    yield parse_result(stats.parse, dead, stats.workers, stats.workers_replaced)
    yield chunk_result(stats.chunk)
    yield index_result(stats.index, statuses, all_versions)


def parse_result(stats: ParseStats, dead: list[dict], workers: int, replaced: int) -> dg.MaterializeResult:
    return dg.MaterializeResult(
        asset_key="parsed_documents",
        metadata={
            "parsed": stats.parsed,
            "content_unchanged": stats.content_unchanged,
            "dead_lettered": stats.dead_lettered,
            "pages": stats.pages,
            "seconds": round(stats.seconds, 3),
            "pages_per_second": round(stats.pages / stats.seconds, 2) if stats.seconds else 0.0,
            "workers": workers,
            "workers_replaced": replaced,
            "tier_mix": markdown_table(("tier", "pages"), sorted(stats.tiers.items())),
            "pages_escalated": stats.escalated,
            "pages_unresolved": stats.unresolved_pages,
            "escalations": markdown_table(("reason", "pages"), sorted(stats.escalation_reasons.items())),
            "tiers_unavailable": markdown_table(("tier", "why"), sorted(stats.tiers_unavailable.items())),
            "chars_removed_by_cleaning": markdown_table(("rule", "characters"), sorted(stats.chars_removed.items())),
            "dead_letters_this_run": markdown_table(("reason", "documents"), sorted(stats.dead_letter_reasons.items())),
            "dead_letters_all": markdown_table(
                ("source", "path", "reason", "attempts"),
                [(d["source"], d["rel_path"], d["reason"], d["attempts"]) for d in dead[:50]],
            ),
            "stats": dg.MetadataValue.json(stats.as_dict()),
        },
    )


def chunk_result(stats: ChunkStats) -> dg.MaterializeResult:
    summary = stats.as_dict()
    summary.pop("token_counts")
    return dg.MaterializeResult(
        asset_key="document_chunks",
        metadata={
            "documents_chunked": stats.documents_chunked,
            "chunks_written": stats.chunks_written,
            "requeued_for_new_chunker": stats.requeued_for_new_chunker,
            "chunker_version": stats.chunker_version,
            "llm_prefixes_generated": stats.prefixes_generated,
            "llm_prefixes_cached": stats.prefixes_cached,
            "llm_prefix_failures": stats.prefix_failures,
            "worker_seconds": round(stats.seconds, 3),
            "chunk_tokens": markdown_table(("statistic", "tokens"), list(stats.token_distribution().items())),
            "stats": dg.MetadataValue.json(summary),
        },
    )


def index_result(stats: IndexStats, statuses: dict[str, int], all_versions: list) -> dg.MaterializeResult:
    return dg.MaterializeResult(
        asset_key="search_index",
        metadata={
            "documents_indexed": stats.documents_indexed,
            "vectors_embedded": stats.vectors_embedded,
            "vectors_reused": stats.vectors_reused,
            "rows_written": stats.rows_written,
            "near_duplicates": stats.near_duplicates,
            "dedup_rate": stats.dedup_rate,
            "seconds": round(stats.seconds, 3),
            "chunks_per_second": round(stats.chunks_indexed / stats.seconds, 2) if stats.seconds else 0.0,
            "index_versions": markdown_table(
                ("version", "status", "model", "dims", "rows"),
                [(v.label, v.status, v.embedding_model, v.dimensions, v.row_count) for v in all_versions],
            ),
            "documents_by_status": markdown_table(("status", "documents"), sorted(statuses.items())),
            "stats": dg.MetadataValue.json(stats.as_dict()),
        },
    )


ingestion_assets = [source_documents, process_documents]
ingest_job = dg.define_asset_job(
    "ingest",
    selection=dg.AssetSelection.groups(GROUP),
    description="Scan sources and bring the index up to date; work is proportional to what changed.",
    # The run queue admits one run with this tag at a time (see prepare_dagster_home); the index write lock
    # in Postgres serialises writers that bypass the queue (the CLI, tests, another deployment).
    tags={REFRESH_TAG: "refresh"},
)
