"""The refresh preview as a job the UI can launch (Launchpad: the ingest job's `source_documents` config), with
the answer `rag-pipeline ingest --dry-run` prints; documents by ref (a run's records keep no path)."""

import dagster as dg

from rag_pipeline.defs.ingestion import DiscoverConfig, sources_to_scan
from rag_pipeline.defs.metadata import typed_table, without_credentials
from rag_pipeline.defs.resources import Rag
from rag_pipeline.stages.preview import preview
from rag_pipeline.store.database import resolve_urls, schema_behind


@dg.op(description="Scan the sources and report what a refresh would do (new, changed, released, retitled, "
                   "relabelled, held, deleted, deletions held, moved; documents to parse and chunk), writing nothing "
                   "to the index.")
def preview_sources(context: dg.OpExecutionContext, config: DiscoverConfig, rag: Rag) -> None:
    url = resolve_urls(rag.settings()).index  # not prepared (migrated): a preview writes nothing
    behind = schema_behind(url)
    if behind:
        raise dg.Failure(f"the index database is not at this code's schema ({', '.join(behind)} to apply): run "
                         "`rag-pipeline migrate` or a refresh first; a preview writes nothing, migrations included")
    plan = sources_to_scan(rag, config, url)
    if not plan.sources and not plan.removed:
        raise dg.Failure("no sources: add them to rag_pipeline.yaml")
    answer = preview(url, plan.sources, config.confirm_deletions, plan.removed).as_dict(paths=False)
    guards = [(s["source"], guard) for s in answer["sources"] for guard in s["guards"]]
    context.add_output_metadata(without_credentials({
        **answer["counts"],
        **answer["work"],
        "writes_nothing": True,
        "guards": typed_table(("source", "guard"), guards),
        "changes": typed_table(("source", "change", "document", "detail"), [
            (s["source"], c["change"], c["document"], c["detail"]) for s in answer["sources"] for c in s["changes"]]),
        "problems": typed_table(("source", "path or document", "problem"), [
            (s["source"], p["path"], p["problem"]) for s in answer["sources"] for p in s["problems"]]),
        "preview": dg.MetadataValue.json(answer),
    }))
    counts = answer["counts"]
    context.log.info("a refresh would find " + ", ".join(f"{counts[name]} {name}" for name in counts)
                     + "; nothing was written")
    for source, guard in guards:
        context.log.warning(f"source {source}: {guard}")


@dg.job(name="preview_refresh",
        description="What a refresh would do, without doing it (also `rag-pipeline ingest --dry-run`).")
def preview_refresh_job():
    preview_sources()
