"""Ingestion assets: source_documents -> parsed_documents -> document_chunks -> search_index."""

import contextlib
import dataclasses
import threading
from collections.abc import Iterator

import dagster as dg

from rag_pipeline import store
from rag_pipeline.config import ConfigError, Settings, SourceConfig
from rag_pipeline.defs.io import RUN_OUTPUTS
from rag_pipeline.defs.metadata import (
    chunk_metadata,
    index_metadata,
    index_totals,
    parse_metadata,
    typed_table,
)
from rag_pipeline.defs.resources import Rag
from rag_pipeline.defs.run_monitoring import INDEX_WRITER_POOL
from rag_pipeline.extras import install_hint
from rag_pipeline.stages.chunk import ChunkStats
from rag_pipeline.stages.discover import DiscoverStats, discover, refreshed_sources
from rag_pipeline.stages.index import IndexStats
from rag_pipeline.stages.parse import ParseStats
from rag_pipeline.stages.process import ProcessStats, process_pending
from rag_pipeline.store.database import connect

GROUP = "ingestion"
# Each asset's statistics: the stage's short name and its stats class (rag_pipeline.defs.runs summarises them).
STAGE_STATS = {
    "source_documents": ("discover", DiscoverStats),
    "parsed_documents": ("parse", ParseStats),
    "document_chunks": ("chunk", ChunkStats),
    "search_index": ("index", IndexStats),
}


class DiscoverConfig(dg.Config):
    """Which configured sources to scan (all when empty), and which may delete beyond their guard."""

    sources: list[str] = []  # names of configured sources; a run cannot name a folder or labels of its own
    # Sources whose held deletions (an emptied root, a mass deletion) are meant, or that left the configuration.
    confirm_deletions: list[str] = []


# Sources given on the command line (`rag-pipeline ingest --source NAME=PATH`), set only around the CLI's own
# in-process run (rag_pipeline.defs.runs). A run launched from the UI runs in another process and scans configured
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
    removed: list[str]  # configured sources no longer in the configuration: their documents are held if confirmed


def sources_to_scan(rag: Rag, config: DiscoverConfig, url: str | None = None) -> ScanPlan:
    """The sources a run scans; `url`: the index database as it is (not prepared: a preview's)."""
    if _command_line_sources:
        return ScanPlan(list(_command_line_sources), "command_line", [])
    with connect(url or rag.database_url()) as conn:
        known, removed = refreshed_sources(conn, rag.settings().sources)
    unknown = sorted(set(config.sources) - known.keys())
    if unknown:
        raise dg.Failure(f"sources not configured: {', '.join(unknown)}; a run scans configured sources only "
                         f"(known: {', '.join(sorted(known)) or 'none'})")
    unconfirmable = sorted(set(config.confirm_deletions) - known.keys() - set(removed))
    if unconfirmable:  # a typo must not look like a confirmation that was given
        raise dg.Failure(f"confirm_deletions names sources not configured: {', '.join(unconfirmable)}")
    chosen = [known[name] for name in config.sources] if config.sources else list(known.values())
    return ScanPlan(chosen, "config", removed)


def confirmable_sources(settings: Settings, named: list[str]) -> list[str]:
    """Which of `named` may confirm deletions: configured sources, and those the database knows (a source given on
    an earlier command line, or one that left the configuration, whose documents wait to be held)."""
    configured = {s.name for s in settings.sources}
    if set(named) <= configured:
        return list(named)
    from rag_pipeline.store.database import resolve_urls

    with connect(resolve_urls(settings).index) as conn:
        registered = {s.name for s in store.sources.registered_sources(conn)}
    return [name for name in named if name in configured | registered]


def source_documents(context: dg.AssetExecutionContext, config: DiscoverConfig, rag: Rag):
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
            "released": stats.released,
            "retitled": stats.retitled,
            "unchanged": stats.unchanged,
            "deleted": stats.deleted,
            "relabelled_without_reembedding": stats.relabelled,
            "newly_held": stats.held,
            "deletions_held": stats.deletions_held,
            "scans_failed": len(stats.scans_failed),  # the run fails through the staleness check
            "seconds": round(stats.seconds, 3),
            "per_source": typed_table(
                ("source", "seen", "new", "changed", "released", "retitled", "deleted", "relabelled", "held",
                 "deletions held",
                 "moved (pages reused)", "list requests", "sidecar reads", "metadata reads"),
                [(name, *counts.values()) for name, counts in stats.per_source.items()],
            ),
            "problems": typed_table(  # documents named by ref by the stage: see stages.discover
                ("source", "path or document", "problem"), [tuple(p.values()) for p in stats.problems]
            ),
            "documents_by_change": typed_table(  # by ref: what a run records keeps no path
                ("change", "documents", "named"),
                [(change, getattr(stats, change, len(names)), " ".join(names))
                 for change, names in stats.documents.items() if names],
            ),
            "stats": dg.MetadataValue.json(stats.as_dict()),
            **_totals(db_url),
        }
    )


def _totals(db_url: str) -> dict:
    """The whole index beside what this run did: a no-op refresh still shows what the index holds."""
    with connect(db_url) as conn:
        return index_totals(conn)


WORK_STATS = "stats"  # the output name of every document step


def work_documents(context: dg.OpExecutionContext, rag: Rag) -> dict:
    return process_pending(rag.database_url(), rag.settings(), progress=context.log.info).as_dict()


def report_documents(context: dg.OpExecutionContext, rag: Rag):
    # Read from the database rather than taken as inputs: Dagster's Dask executor does not hand fanned-in
    # outputs of steps that ran on other workers to the step that collects them.
    with connect(rag.database_url()) as conn:
        reports = store.run_outputs.of_run(conn, _lineage(context), WORK_STATS)
        dead = store.pages.dead_letter_summary(conn)
    stats = _added_up(reports)
    hosts = sorted({r["host"] for r in reports})
    return dg.Output(stats.as_dict(), metadata={
        **parse_metadata(stats.parse, dead, stats.workers, stats.workers_replaced, hosts),
        **_totals(rag.database_url())})


def _added_up(reports: list[dict]) -> ProcessStats:
    stats = ProcessStats()
    for report in reports:
        stats.add(ProcessStats.from_dict(report))
    return stats


def _lineage(context: dg.OpExecutionContext | dg.AssetExecutionContext) -> list[str]:
    """This run's id, then those of the runs it re-executes (nearest first): a re-execution from failure skips the
    document steps that succeeded, and their reports are the parent's."""
    run_ids, run = [context.run_id], context.run
    while run is not None and run.parent_run_id and len(run_ids) < 100:
        run_ids.append(run.parent_run_id)
        run = context.instance.get_run_by_id(run.parent_run_id)
    return run_ids


def _this_runs_work(db_url: str, context: dg.AssetExecutionContext) -> ProcessStats:
    """What this run's document steps did. Not taken from the upstream asset's value: that is the latest one any
    run stored, and two refreshes at once each reported the other's counts (or their own twice)."""
    with connect(db_url) as conn:
        return _added_up(store.run_outputs.of_run(conn, _lineage(context), WORK_STATS))


def parsed_documents_asset(steps: int, pool: str | None) -> dg.AssetsDefinition:
    """The document work, in `steps` steps side by side (under a distributed executor each may run on another
    machine). Parsing, chunking and indexing are pipelined per document there; the two assets after this one
    report what it did and pick up anything left in their own queue."""
    work = dg.op(
        name="work_documents", ins={"scanned": dg.In(dg.Nothing)},
        out={WORK_STATS: dg.Out(dict, io_manager_key=RUN_OUTPUTS)}, pool=pool,
        description="Lease queued documents one at a time: worker processes (one per core by default) parse, clean "
                    "and chunk them within a time and memory budget while this step embeds and indexes what they "
                    "finish. Several of these steps share one queue, on one machine or many.")(work_documents)
    report = dg.op(name="report_documents", ins={"worked": dg.In(dg.Nothing)},
                   out=dg.Out(dict, io_manager_key=RUN_OUTPUTS), pool=pool,
                   description="What the document steps did, added up.")(report_documents)

    @dg.graph_asset(
        name="parsed_documents", group_name=GROUP, ins={"source_documents": dg.AssetIn(dagster_type=dg.Nothing)},
        description="Per-page text of new and changed documents; failures (a corrupt file, a file over its time or "
                    "memory budget) are dead-lettered with a reason. Each queued document is leased by one worker "
                    "process that parses, cleans and chunks it, while its step embeds and indexes what is done.",
    )
    def parsed_documents(source_documents):
        reports = [work.alias(f"work_documents_{n}")(source_documents) if steps > 1
                   else work(source_documents) for n in range(steps)]
        return report(worked=reports)

    return parsed_documents


def document_chunks(context: dg.AssetExecutionContext, rag: Rag, parsed_documents: dict) -> dg.Output:
    # Chunked as they were parsed (parsed_documents); here only documents still queued for chunking (none, as a
    # rule) are worked, so materialising this asset alone still does what its name says.
    stats = _this_runs_work(rag.database_url(), context).chunk
    leftover = process_pending(rag.database_url(), rag.settings(), progress=context.log.info, parse=False,
                               index=False).chunk
    stats.add(leftover)
    stats.seconds += leftover.seconds
    return dg.Output(parsed_documents, metadata={**chunk_metadata(stats), **_totals(rag.database_url())})


def search_index(context: dg.AssetExecutionContext, rag: Rag, document_chunks: dict) -> dg.Output:
    db_url = rag.database_url()
    stats = _this_runs_work(db_url, context).index
    leftover = process_pending(db_url, rag.settings(), progress=context.log.info, parse=False, chunk=False).index
    stats.add(leftover)
    with connect(db_url) as conn:
        statuses = store.documents.status_counts(conn)
        all_versions = store.versions.index_versions(conn)
    return dg.Output(document_chunks, metadata={**index_metadata(stats, statuses, all_versions), **_totals(db_url)})


def code_versions(settings: Settings) -> dict[str, str]:
    """What each asset's output depends on besides its inputs, known without loading a model: the parser's version,
    the chunker's (chunk size from the configured model's window, overlap), and the model that embeds. The UI marks
    an asset whose code version changed since its last materialization."""
    from rag_pipeline.embedding.locations import ModelUnavailableError, resolve_model
    from rag_pipeline.parsing.pages import parser_version
    from rag_pipeline.stages.chunk import current_chunker_version

    versions = {"parsed_documents": parser_version()}
    try:
        location = resolve_model(settings.embedding.model, settings.embedding.models_dir).location
        versions["document_chunks"] = current_chunker_version(settings, location)
    except (ModelUnavailableError, OSError, ValueError, ConfigError):
        pass  # the model cannot be read here: no code version, the run itself will say why
    embedding = settings.embedding
    versions["search_index"] = f"{versions.get('document_chunks', '?')}|{embedding.backend}:{embedding.model}"
    return versions


def writer_pool(settings: Settings) -> str | None:
    """The one-writer pool of every asset and op that writes the index (see rag_pipeline.defs.run_monitoring). Not
    under Dask: dagster-dask hands the run to Dask, which cannot serialise the pool accounting Dagster attaches to
    it; there the index write lock in Postgres alone keeps writers apart."""
    return None if settings.execution.executor == "dask" else INDEX_WRITER_POOL


def ingestion_assets(settings: Settings) -> list[dg.AssetsDefinition]:
    pool = writer_pool(settings)
    assets = [
        dg.asset(group_name=GROUP, pool=pool,
                 description="Every file in every source, reconciled with the documents table.")(source_documents),
        parsed_documents_asset(settings.execution.steps, pool),
        dg.asset(group_name=GROUP, io_manager_key=RUN_OUTPUTS, pool=pool,
                 description="Structure-aware, token-sized chunks with their contextual prefixes.")(document_chunks),
        dg.asset(group_name=GROUP, io_manager_key=RUN_OUTPUTS, pool=pool, description=(
            "Embeddings written into every writable index version (pgvector halfvec + HNSW, BM25)."))(search_index),
    ]
    versions = code_versions(settings)
    return list(dg.map_asset_specs(
        lambda spec: spec.replace_attributes(kinds={"python", "postgres"},
                                             code_version=versions.get(spec.key.to_user_string())),
        assets))


def ingest_job(settings: Settings, assets: list[dg.AssetsDefinition]):  # an asset job, resolved by Definitions
    return dg.define_asset_job(
        "ingest",
        # These assets, not their group: in a user's project other assets may share the group's name.
        selection=dg.AssetSelection.assets(*assets),
        description="Scan sources and bring the index up to date; work is proportional to what changed.",
        executor_def=executor(settings),
    )


def executor(settings: Settings) -> dg.ExecutorDefinition | None:
    """Dask's on the configured cluster (the dagster-dask package); on one machine, every step in the run's own
    process when there is one document step (the light steps cost milliseconds, a process each cost seconds; the
    parse workers are processes of their own anyway), else Dagster's default, a process per step, so the document
    steps run side by side."""
    if settings.execution.executor != "dask":
        return dg.in_process_executor if settings.execution.steps == 1 else None
    try:
        from dagster_dask import dask_executor
    except ImportError as exc:
        raise ConfigError("execution.executor: dask needs the dagster-dask package "
                          f"({install_hint('dask')})") from exc
    return dask_executor.configured({"cluster": {"existing": {"address": settings.execution.dask_address}}})
