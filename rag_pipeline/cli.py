"""`rag-pipeline`: the database, ingestion through Dagster, search, the search service and the UI.

Every command exits with one of these codes (README, "CLI"):

  0  done
  1  done, and what it ran or checked failed: a failed run, a failed check, a server that is not running
  2  usage or configuration error: nothing was done
  3  refused: a promotion's gates, or a version lifecycle step not allowed now
  4  deletions held for confirmation: the run finished, a source's deletions (or the holding of a source that left
     the configuration) wait for --confirm-deletions; or `erase --source` of a configured source without --confirm
  5  runtime error: the database, a model or an endpoint failed, or an erasure was refused
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rag_pipeline.extras import DISTRIBUTION, MissingExtraError, install_hint, require

if TYPE_CHECKING:  # imported where used: a search through a running service needs no configuration (pydantic)
    from rag_pipeline.config import Settings

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REFUSED, EXIT_DELETIONS_HELD, EXIT_ERROR = 0, 1, 2, 3, 4, 5
SEARCH_URL_VARIABLE = "RAG_SEARCH_URL"  # a running `rag-pipeline serve` that `search` asks instead of the database


class UsageError(Exception):
    """The command line asks for something that cannot be done as asked (exit 2, nothing done)."""

# Model weights must come from local folders or packages; never hang on a hub that cannot be reached.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


def cmd_db(args: argparse.Namespace, settings: Settings) -> int:
    from rag_pipeline.store.database import EmbeddedPostgres, as_role, migrate, resolve_urls, run_psql

    if args.psql_args and args.action != "psql":
        raise UsageError(f"db {args.action} takes no arguments (given: {' '.join(args.psql_args)})")
    if args.user and args.action != "url":
        raise UsageError("--user goes with db url")

    server = EmbeddedPostgres(settings.pgdata_dir)
    if settings.database_url and args.action in ("start", "stop"):
        print(f"RAG_DATABASE_URL is set: using the external server, nothing embedded to {args.action}.")
        return 0
    if args.action == "start":
        urls = resolve_urls(settings)
        applied = migrate(urls.index)
        print(f"PostgreSQL running (data in {settings.pgdata_dir}); migrations applied now: {applied or 'none'}")
        print(f"index database:   {urls.index}")
        print(f"dagster database: {urls.dagster}")
    elif args.action == "stop":
        print("stopped" if server.stop() else "not running")
    elif args.action == "status":
        running = bool(settings.database_url) or server.is_running()
        print(json.dumps({"embedded": not settings.database_url, "running": running,
                          "data_dir": str(settings.pgdata_dir)}))
        return EXIT_OK if running else EXIT_FAILED
    elif args.action == "url":
        url = resolve_urls(settings, start=False).index
        print(as_role(url, args.user) if args.user else url)
    elif args.action == "psql":
        return run_psql(resolve_urls(settings).index, args.psql_args)
    return 0


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    # Through prepare, as every entry point: the schema, model identities and the search settings SQL callers read;
    # the SQL functions are re-applied whatever their checksum says (a start skips them when they are current).
    from rag_pipeline.lifecycle.prepare import prepare
    from rag_pipeline.store.database import resolve_urls

    applied = prepare(resolve_urls(settings).index, settings, reapply_functions=True)
    print(f"applied: {', '.join(applied) if applied else 'nothing (up to date)'}")
    return 0


def _index_url(settings: Settings) -> str:
    """The index database, started if embedded and migrated to the schema this code expects."""
    from rag_pipeline.lifecycle.prepare import prepare
    from rag_pipeline.store.database import resolve_urls

    url = resolve_urls(settings).index
    prepare(url, settings)
    return url


def _prepare_instance(settings: Settings, check_model: bool = False) -> Path:
    """The index database ready, and DAGSTER_HOME pointing at Dagster's storage on the same server. With
    `check_model`, a configured model that is not the one the live index was embedded by is refused first, in one
    line that says what to set (a refresh would refuse it too, after a run had started)."""
    require("pipeline", "ingestion and the Dagster UI")
    from rag_pipeline.defs.runs import prepare_dagster_home
    from rag_pipeline.store.database import connect, resolve_urls

    url = _index_url(settings)
    if check_model:
        from rag_pipeline.stages.chunk import check_configured_model

        with connect(url) as conn:
            check_configured_model(conn, settings)
    return prepare_dagster_home(settings, resolve_urls(settings).dagster)


def cmd_ingest(args: argparse.Namespace, settings: Settings) -> int:
    from rag_pipeline.config import parse_labels

    if args.dry_run:
        return _ingest_preview(args, settings)
    _prepare_instance(settings, check_model=True)
    from rag_pipeline.defs.runs import run_ingest

    bars = sys.stdout.isatty() and not args.json
    with _progress_bar() if bars else contextlib.nullcontext():
        # Dagster tees a step's output to the terminal from another process, past the bars' display: with bars,
        # the terminal gets the run's warnings and errors only (every line is in the UI's run log); without, plain
        # lines as they come.
        summary = run_ingest(settings, sources=args.source or [], labels=list(parse_labels(args.labels)),
                             confirm_deletions=args.confirm_deletions or [], log_level="WARNING" if bars else "INFO")
    summary["problems"] = _problems_with_paths(settings, summary["problems"])
    summary["documents"] = _documents_with_paths(settings, summary.get("documents", {}))
    held, dead = _attention_list(settings)
    summary["held_now"] = None if held is None else len(held)  # `held` counts the documents this run newly held
    if args.json:
        _print_json(summary)
    else:
        print(f"run {summary['run_id']}: {'succeeded' if summary['success'] else 'FAILED'}")
        for key, value in summary.items():
            if key == "held":
                now = "unknown" if summary["held_now"] is None else summary["held_now"]
                print(f"  {'held now':<18} {now} (newly held: {value})")
            elif isinstance(value, int | float) and not isinstance(value, bool) and key != "held_now":
                print(f"  {key:<18} {value}")
        for reason, count in sorted(summary["dead_letter_reasons"].items()):
            print(f"  dead letter: {reason:<10} {count}")
        _print_attention_list(held, dead)
        for change, documents in summary["documents"].items():
            for document in documents:
                where = f"{document['source']}:{document['path']}" if document["path"] else "(gone)"
                print(f"  {change:<18} {where} ({document['document']})")
        for problem in summary["problems"]:
            print(f"  problem {problem['source']}:{problem['path']}: {problem['problem']}")
        for name, check in sorted(summary["checks"].items()):
            verdict = "ok" if check["passed"] else f"FAILED ({check['severity']})"
            print(f"  check {name:<18} {verdict}: {check['summary']}")
        seconds = summary["seconds"]
        print("  seconds            " + ", ".join(f"{k} {v:.2f}" for k, v in seconds.items()))
        for error in summary.get("errors", []):
            print(f"  error: {error}", file=sys.stderr)
    if summary.get("scans_failed"):
        print(f"scan failed: {', '.join(summary['scans_failed'])} (see the problems above); their documents are as "
              "they were, and staleness fails until a scan completes", file=sys.stderr)
    if not summary["success"] or summary.get("scans_failed"):
        return EXIT_FAILED
    if summary.get("deletions_held"):
        print(f"{summary['deletions_held']} deletions held (or sources that left the configuration): see the "
              "problems above; rerun with --confirm-deletions SOURCE to carry them out", file=sys.stderr)
        return EXIT_DELETIONS_HELD
    return EXIT_OK


def _ingest_preview(args: argparse.Namespace, settings: Settings) -> int:
    """`ingest --dry-run`: what the refresh would do, with paths (this terminal is not a run's record)."""
    require("pipeline", "ingestion and the Dagster UI")
    from rag_pipeline.config import parse_labels
    from rag_pipeline.defs.runs import preview_ingest

    answer = preview_ingest(settings, sources=args.source or [], labels=list(parse_labels(args.labels)),
                            confirm_deletions=args.confirm_deletions or []).as_dict(paths=True)
    if args.json:
        _print_json(answer)
        return EXIT_OK
    print("dry run: nothing was written; a refresh now would do this")
    for source in answer["sources"]:
        counts = source["counts"]
        print(f"source {source['source']}: {counts.get('seen', 0)} files: "
              + ", ".join(f"{counts[name]} {name.replace('_', ' ')}" for name in counts if name != "seen"))
        for change in source["changes"]:
            ref = f" ({change['document']})" if change["document"].startswith("#") else ""
            print(f"  {change['change']:<15} {change['path']}{ref}: {change['detail']}")
        for guard in source["guards"]:
            print(f"  guard: {guard}")
        for problem in source["problems"]:
            print(f"  problem {problem['path']}: {problem['problem']}")
    work = answer["work"]
    print(f"work: {work['documents_to_parse']} documents to parse ({work['bytes_to_parse']:,} bytes; those parsed "
          f"before had {work['pages_they_had']} pages), {work['documents_to_chunk']} to chunk from kept text, "
          f"{work['chunks_relabelled_in_place']} chunks relabelled in place, {work['chunks_removed']} chunks "
          f"removed, {work['pdfs_for_the_new_parser']} PDFs and decks for the new parser; unchanged text keeps its vectors")
    return EXIT_OK


@contextlib.contextmanager
def _progress_bar() -> Iterator[Any]:
    """A bar per long stage (documents done / total, rate, ETA), drawn from the stages' progress reports."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from rag_pipeline.stages.progress import Snapshot, listening

    bars = Progress(TextColumn("{task.description:<16}"), BarColumn(), MofNCompleteColumn(), TextColumn("documents"),
                    TextColumn("{task.fields[work]}"), TimeRemainingColumn(), redirect_stderr=True)
    tasks: dict[str, Any] = {}

    def draw(snapshot: Snapshot) -> None:
        if not snapshot.total:
            return  # nothing queued yet: no 0/0 bar
        if snapshot.stage not in tasks:
            tasks[snapshot.stage] = bars.add_task(snapshot.stage, total=snapshot.total, work="")
        # The bar counts documents; the units (pages, chunks) and their rate are said as what they are.
        bars.update(tasks[snapshot.stage], completed=snapshot.done, total=snapshot.total,
                    work=f"· {snapshot.units:,} {snapshot.unit} ({snapshot.rate:,.1f} {snapshot.unit}/s)")

    with bars, listening(draw), _logs_above():
        yield bars


@contextlib.contextmanager
def _logs_above() -> Iterator[None]:
    """Log handlers made before the bars started write to the terminal directly, so a log line would land in the
    middle of a bar. While the bars are drawn, every such handler writes through rich's proxies (sys.stdout and
    sys.stderr inside the display), which print each line above the bars."""
    import logging

    terminals = {sys.__stdout__: sys.stdout, sys.__stderr__: sys.stderr}  # inside the display: the proxies
    loggers = [logging.getLogger(), *(lg for lg in list(logging.Logger.manager.loggerDict.values())
                                      if isinstance(lg, logging.Logger))]  # placeholders have no handlers
    moved = []
    for handler in {h for lg in loggers for h in getattr(lg, "handlers", ())}:
        stream = getattr(handler, "stream", None)
        if isinstance(handler, logging.StreamHandler) and stream in terminals and terminals[stream] is not stream:
            moved.append((handler, handler.setStream(terminals[stream])))
    try:
        yield
    finally:
        for handler, stream in moved:
            handler.setStream(stream)


def cmd_erase(args: argparse.Namespace, settings: Settings) -> int:
    from rag_pipeline.lifecycle.erasure import erase, readmit

    source, rel_path = args.source, None
    if args.doc:
        source, sep, rel_path = args.doc.partition(":")
        if not sep or not source or not rel_path:
            raise UsageError(f"--doc expects SOURCE:PATH, got {args.doc!r}")
    if args.undo:
        readmitted = readmit(_index_url(settings), source, rel_path, settings.lock_timeout_seconds)
        if args.json:
            _print_json({"readmitted": readmitted})
        else:
            print(f"re-admitted {readmitted} erased document(s): the next ingest indexes them if they are at their "
                  "source; recorded in `erasures`")
        return EXIT_OK
    if rel_path is None and source in {s.name for s in settings.sources} and not args.confirm:
        # A live source's files are still there: erasing them all is rarely meant, and they come back held.
        print(f"refused: source {source} is in the configuration; `erase --source` would erase every document of "
              "it, and the files still at the source would be held (held_erased) at the next ingest until "
              "re-admitted. Remove it from the configuration first, or rerun with --confirm", file=sys.stderr)
        return EXIT_DELETIONS_HELD
    report = erase(_index_url(settings), source, rel_path, settings.lock_timeout_seconds)
    if args.json:
        _print_json({"documents": report.documents, "names": report.names, "removed": report.removed})
    else:
        print(f"erased {report.documents} document(s); rows removed: "
              + ", ".join(f"{table} {n}" for table, n in sorted(report.removed.items()) if n))
        if rel_path is not None and report.names > 1:
            print(f"  {report.names} spellings of {rel_path!r} (the same name in another Unicode normalisation) "
                  "were erased")
        print("  an audit record (no text, no path) is in `erasures`; deletion_replay checks it")
    return EXIT_OK


def cmd_doc(args: argparse.Namespace, settings: Settings) -> int:
    """What a ref in Dagster's UI (`#123`) names: Dagster's records name documents by ref, never by path."""
    from rag_pipeline import store
    from rag_pipeline.domain.refs import ref_of_name
    from rag_pipeline.store.database import connect

    refs = [ref_of_name(ref if ref.startswith("#") else f"#{ref}") for ref in args.refs]
    if None in refs:
        raise UsageError(f"doc: a ref is a number as the UI shows it (#123), got {args.refs[refs.index(None)]!r}")
    with connect(_index_url(settings)) as conn:
        found = store.documents.paths_of(conn, refs)
        identities = store.documents.identities_of(conn, refs)
    # what the document says it is ({} when nothing is known yet: a held document, one not chunked since)
    known = {ref: identity if any(key != "found" for key in identity) else {}
             for ref, identity in identities.items()}
    rows = [{"ref": ref, "source": found[ref][0], "path": found[ref][1], "identity": known.get(ref, {})}
            if ref in found else {"ref": ref, "source": None, "path": None} for ref in refs]
    if args.json:
        _print_json(rows)
    else:
        for row in rows:
            print(f"#{row['ref']}  {row['source']}:{row['path']}" if row["path"] else
                  f"#{row['ref']}  no such document (deleted or erased)")
            known = row.get("identity") or {}
            found_in = known.get("found", {})
            for key in ("title", "organisation", "kind", "year", "quarter", "period_end"):
                if known.get(key) is not None:
                    where = found_in.get(key) or (found_in.get("period") if key in ("year", "quarter", "period_end")
                                                  else None)
                    print(f"    {key}: {known[key]}" + (f"  ({where})" if where else ""))
    return EXIT_OK if len(found) == len(set(refs)) else EXIT_FAILED


def _documents_with_paths(settings: Settings, named: dict[str, list[str]]) -> dict[str, list[dict[str, Any]]]:
    """The documents a run names by ref for each change, with their source and path where they still exist (a
    deleted one's path is gone with it: the deletion log keeps it, by doc_id)."""
    from rag_pipeline import store
    from rag_pipeline.domain.refs import ref_of_name
    from rag_pipeline.store.database import connect

    refs = {ref for names in named.values() for name in names if (ref := ref_of_name(name)) is not None}
    paths: dict[int, tuple[str, str]] = {}
    if refs:
        with connect(_index_url(settings)) as conn:
            paths = store.documents.paths_of(conn, refs)
    return {change: [{"document": name, "source": paths.get(ref_of_name(name) or -1, (None, None))[0],
                      "path": paths.get(ref_of_name(name) or -1, (None, None))[1]} for name in names]
            for change, names in named.items() if names}


def _problems_with_paths(settings: Settings, problems: list[dict]) -> list[dict]:
    """A run's problems as the shell shows them: the refs Dagster's records use resolved back to paths."""
    from rag_pipeline import store
    from rag_pipeline.domain.refs import ref_of_name
    from rag_pipeline.store.database import connect

    refs = {ref for p in problems if (ref := ref_of_name(p["path"])) is not None}
    if not refs:
        return problems
    with connect(_index_url(settings)) as conn:
        paths = {ref: path for ref, (_, path) in store.documents.paths_of(conn, refs).items()}
    return [{**p, "path": paths[ref], "problem": p["problem"].replace(p["path"], paths[ref])}
            if (ref := ref_of_name(p["path"])) in paths else p for p in problems]


def cmd_gc(args: argparse.Namespace, settings: Settings) -> int:
    from rag_pipeline.lifecycle.alerts import AlertSender
    from rag_pipeline.lifecycle.erasure import housekeeping
    from rag_pipeline.lifecycle.reclaim import reclaim_versions

    retention = settings.retention
    url = _index_url(settings)
    versions = reclaim_versions(url, retention, AlertSender(settings.alerts), settings.lock_timeout_seconds)
    report = housekeeping(url, retention.embedding_cache_grace_seconds,
                          retention.deletion_log_seconds, settings.lock_timeout_seconds)
    if args.json:
        _print_json({"embedding_cache_entries": report.embedding_cache_entries,
                     "deletion_log_entries": report.deletion_log_entries,
                     "versions_reclaimed": versions.reclaimed, "previous_versions": versions.kept,
                     "reclaimable_bytes": versions.reclaimable_bytes})
        return 0
    for version in versions.reclaimed:
        print(f"dropped v{version['version']} ({version['embedding_model']}): previous for longer than "
              f"retention.rollback; {version['bytes']:,} bytes reclaimed, rollback to it no longer possible")
    for version in versions.kept:
        until = (f"until {version['reclaim_at']:%Y-%m-%d %H:%M} UTC" if version["reclaim_at"]
                 else f"pinned: {version['pinned_reason']}")
        print(f"kept v{version['version']} for rollback ({version['bytes']:,} bytes) {until}")
    print(f"collected {report.embedding_cache_entries} embedding-cache entries no index row uses, forgot "
          f"{report.deletion_log_entries} deletion-log entries")
    return 0


def _attention_list(settings: Settings) -> tuple[list[Any] | None, list[dict[str, Any]]]:
    """Documents a person should look at: held back (and why), and dead-lettered. None when the database cannot
    say (a run that lost it): the run's own summary is printed all the same."""
    import psycopg

    from rag_pipeline import store
    from rag_pipeline.store.database import connect

    try:
        with connect(_index_url(settings)) as conn:
            return store.documents.held_documents(conn), store.pages.dead_letter_summary(conn)
    except psycopg.Error:
        return None, []


def _print_attention_list(held: list[Any] | None, dead: list[dict[str, Any]], limit: int = 20) -> None:
    held = held or []
    for source, rel_path, status, reason in held[:limit]:
        print(f"  {status}: {source}:{rel_path}" + (f" ({reason})" if reason else ""))
    for entry in dead[:limit]:
        print(f"  dead letter ({entry['reason']}): {entry['source']}:{entry['rel_path']}")
    hidden = max(0, len(held) - limit) + max(0, len(dead) - limit)
    if hidden:
        print(f"  ... and {hidden} more (see the parsed_documents asset in the UI)")


def _searchable_version(conn: Any, number: int) -> Any:
    from rag_pipeline import store
    from rag_pipeline.domain.status import VersionStatus
    from rag_pipeline.retrieval.search import SearchError

    version = store.versions.get_version(conn, number)
    if version is None or version.status == VersionStatus.RETIRED:
        raise SearchError(f"no searchable index version {number} (see rag-pipeline index list)")
    return version


def cmd_eval(args: argparse.Namespace, settings: Settings) -> int:
    """Golden-set metrics of one index version; of two side by side with paired significance (--compare V1 V2,
    or --compare-modes A B on one version); or recall and abstention across score floors (--floors)."""
    from dataclasses import asdict

    from rag_pipeline.config import ConfigError
    from rag_pipeline.retrieval.evaluation import (
        evaluate,
        floor_sweep,
        load_golden,
        paired_differences,
        report_table,
    )
    from rag_pipeline.retrieval.search import SearchOptions
    from rag_pipeline.store.database import connect

    golden = args.golden or settings.checks.golden_set
    labels = args.labels or ",".join(settings.checks.golden_labels)
    if golden is None or not labels:
        raise ConfigError("eval needs a golden set and labels: pass GOLDEN and --labels, or set "
                          "checks.golden_set and checks.golden_labels")
    questions = load_golden(Path(golden))
    k = args.k or settings.checks.k
    floor = settings.retrieval.min_similarity if args.min_similarity is None else args.min_similarity
    options = SearchOptions.from_settings(settings, min_similarity=floor)
    with connect(_index_url(settings)) as conn:
        if args.floors:
            floors = [float(f) for f in args.floors.split(",")]
            version = _searchable_version(conn, args.index_version) if args.index_version is not None else None
            points = floor_sweep(conn, questions, labels, floors, k=k, mode=args.mode, version=version,
                                 options=options)
            if args.json:
                _print_json([asdict(p) for p in points])
            else:
                print(f"| score floor | recall@{k} | hit@{k} | abstention |\n|---|---|---|---|")
                for point in points:
                    print(f"| {point.floor} | {point.recall} | {point.hit} | {point.abstention} |")
            return 0
        runs = ([(_searchable_version(conn, v), args.mode) for v in args.compare] if args.compare else
                [(_searchable_version(conn, args.index_version) if args.index_version is not None else None, m)
                 for m in (args.compare_modes or [args.mode])])
        reports = [evaluate(conn, questions, labels, k=k, mode=mode, version=target, options=options)
                   for target, mode in runs]
    differences = paired_differences(reports[0].results, reports[1].results) if len(reports) == 2 else []
    if args.json:
        _print_json({"reports": [asdict(r) for r in reports], "differences": [asdict(d) for d in differences]})
    else:
        for report in reports:
            print(f"v{report.version} ({report.model}), mode {report.mode}, k={report.k}, "
                  f"{report.questions} questions, score floor {floor}")
        print(report_table(reports))
        for difference in differences:
            verdict = "real" if difference.significant else "not significant"
            print(f"  {difference.describe()}: {verdict}")
    return 0


def cmd_checks(args: argparse.Namespace, settings: Settings) -> int:
    """The six index checks from a shell (the same functions the Dagster asset checks run)."""
    from dataclasses import asdict

    from rag_pipeline.lifecycle import checks as health
    from rag_pipeline.retrieval.search import SearchOptions
    from rag_pipeline.store.database import connect

    with connect(_index_url(settings)) as conn:
        if args.set_baseline:
            metrics = health.rebaseline(conn, settings.checks, SearchOptions.from_settings(settings))
            print(f"baseline recorded: {json.dumps(metrics['overall'])}")
            return 0
        outcomes = health.run_all(conn, settings)
    if args.json:
        _print_json({name: asdict(outcome) for name, outcome in outcomes.items()})
    else:
        for name, outcome in outcomes.items():
            print(f"{'ok  ' if outcome.passed else 'FAIL'} {name:<18} {outcome.summary}")
    return 0 if all(outcome.passed for outcome in outcomes.values()) else 1


def cmd_search(args: argparse.Namespace, settings: Settings | None) -> int:
    """Search the index database with --labels, or a running `rag-pipeline serve` (--service or RAG_SEARCH_URL)
    with the token in RAG_SEARCH_TOKEN: a process that asks the service loads no model and pays no cold start."""
    service = _service_url(args)
    if service:
        hits = _search_service(args, service)
    elif not args.labels:
        raise UsageError(f"search needs --labels (the caller's ACL labels), or --service URL (or "
                         f"{SEARCH_URL_VARIABLE}) to ask a running rag-pipeline serve with your token")
    else:
        from rag_pipeline import store
        from rag_pipeline.retrieval.search import SearchOptions, abstention_of, fetch, finish, plan
        from rag_pipeline.store.database import connect

        assert settings is not None  # loaded for every search of the database (main)
        with connect(_index_url(settings)) as conn:
            if args.index_version is not None:
                version = _searchable_version(conn, args.index_version)
            else:
                version = store.versions.active_version(conn)
            planned = plan(args.query, args.labels, k=args.k or settings.retrieval.k, mode=args.mode,
                           version=version, options=SearchOptions.from_settings(settings))
            fetched = fetch(conn, planned)
            abstained = None if fetched else abstention_of(conn, planned)
            unheld = store.search.unheld_labels(conn, version, planned.labels) if version is not None else []
        # The connection is closed before a reranker is asked: it may take until the search's deadline.
        result = finish(planned, fetched, abstained)
        hits = [hit.to_dict() for hit in result.hits]
        if unheld:  # a misspelt label matches nothing and widens nothing: say so, or it reads as "no results"
            print(f"note: no indexed document carries the label{'s' * (len(unheld) > 1)} "
                  f"{', '.join(map(repr, unheld))} (labels match exactly, case included)", file=sys.stderr)
        if result.note:
            print(f"note: {result.note}", file=sys.stderr)
        if result.abstained:
            print(f"no evidence: {result.abstained}", file=sys.stderr)
    from rag_pipeline.text.identity import label as document_label

    if args.json:
        _print_json(hits)
        return 0
    if not hits:
        print("no results")
    for rank, hit in enumerate(hits, 1):
        start, end = hit["page_start"], hit["page_end"]
        pages = f"p.{start}" if start == end else f"pp.{start}-{end}"
        similarity = "" if hit["similarity"] is None else f"similarity {hit['similarity']:.3f}  "
        print(f"{rank:>2}. {similarity}(rank score {hit['score']:.4f})  {hit['source']}:{hit['path']} {pages}  "
              f"[{hit['section_path']}]")
        if hit.get("document"):
            print(f"    {document_label(hit['document'], hit['path'])}")
        print("    " + " ".join(hit["text"].split())[:200])
    return 0


def _service_url(args: argparse.Namespace) -> str | None:
    """The running service a `search` asks instead of the database, if one is named."""
    if args.func is not cmd_search:
        return None
    return args.service or os.environ.get(SEARCH_URL_VARIABLE)


def _search_service(args: argparse.Namespace, url: str) -> list[dict[str, Any]]:
    """The hits of a running `rag-pipeline serve` at `url`. The service's labels come from the token; a search
    never mixes them with labels given on the command line, and k defaults to the service's."""
    from rag_pipeline.retrieval.integrations.client import SearchClient, SearchServiceError

    origin = "--service" if args.service else SEARCH_URL_VARIABLE
    unset = f"; to search the database, leave out --service and unset {SEARCH_URL_VARIABLE}"
    if args.labels is not None:
        raise UsageError(f"--labels: a search through the service ({origin}) carries the labels of your token "
                         f"(RAG_SEARCH_TOKEN){unset}")
    if args.index_version is not None:
        raise UsageError(f"--index-version: the service ({origin}) searches its active version{unset}")
    try:
        client = SearchClient(url)
    except ValueError as exc:  # no token, or not a URL a token may be sent to
        raise UsageError(f"{origin}: {exc}") from None
    try:
        return client.search(args.query, k=args.k, mode=args.mode)
    except SearchServiceError as exc:
        if 400 <= exc.status < 500 and exc.status != 408:  # the token or the request is wrong: a usage error
            raise UsageError(str(exc)) from None
        raise  # unreachable, redirected, too slow, or the service failed: a runtime error
    finally:
        client.close()


def _gate_line(gate: dict[str, Any]) -> str:
    from rag_pipeline.lifecycle.blue_green import GATE_RESULT_WORDS

    return f"gate {gate['gate']}: {GATE_RESULT_WORDS[gate['passed']]} ({gate['detail']})"


def cmd_index(args: argparse.Namespace, settings: Settings) -> int:
    """Index versions (blue/green): list, build, promote, roll back, retire, pin."""
    from rag_pipeline.config import parse_labels
    from rag_pipeline.lifecycle import blue_green
    from rag_pipeline.store.database import connect

    if args.index_command == "build":
        from rag_pipeline.defs.runs import run_index_build
        from rag_pipeline.embedding.locations import ModelArgumentError, check_model_argument

        try:  # before anything starts: not a model name nor a model folder is a usage error (exit 2)
            check_model_argument(args.model)
        except ModelArgumentError as exc:
            raise UsageError(str(exc)) from None
        _prepare_instance(settings)
        summary = run_index_build(settings, args.model)
        if args.json:
            _print_json(summary)
        else:
            print(f"v{summary['version']} ({summary['model']}, {summary['dimensions']} dims) {summary['status']}: "
                  f"{summary['rows']} rows; {sum(r['success'] for r in summary['shards'])}/{len(summary['shards'])}"
                  f" shards succeeded (backfill {summary['backfill']}). Next: rag-pipeline index promote "
                  f"{summary['version']}")
        return 0 if summary["success"] else 1
    if args.index_command in ("promote", "rollback"):
        url = _index_url(settings)
        gates = None
        with connect(url) as conn, conn.transaction():
            if args.index_command == "promote":
                _searchable_version(conn, args.version)  # a version that does not exist is an error
                try:
                    gates = blue_green.promote_with_gates(
                        conn, args.version, settings, golden=Path(args.golden) if args.golden else None,
                        labels=list(parse_labels(args.labels)) if args.labels else None, k=args.k,
                        tolerance=args.tolerance, force=bool(args.force), reason=args.force)
                except blue_green.PromotionRefused as refused:
                    for gate in blue_green.gate_results(refused.gates):
                        print(_gate_line(gate), file=sys.stderr)
                    raise
                active = args.version
            else:
                active = blue_green.rollback(conn).version_id
        with connect(url) as conn:  # after the commit: what the swap leaves to do is read, never held under its locks
            swap = blue_green.swap_report(conn, settings, active, gates)
        if args.json:
            _print_json(swap)
            return 0
        for gate in swap["gates"]:
            print(_gate_line(gate))
        if any(gate["passed"] is False for gate in swap["gates"]):
            print(f"--force: promoted despite failed gates, because: {args.force} (recorded)", file=sys.stderr)
        print(f"{swap['active']} is active: {swap['embedding_model']} ({swap['dimensions']} dims)")
        if swap["set"]:
            print("next: set " + ", ".join(f"{key}: {value}" for key, value in swap["set"].items())
                  + f" in the configuration; until then a refresh is refused (it would embed with "
                  f"{swap['configured_model']})")
        print(f"roll back: `rag-pipeline index rollback` returns to {swap['rollback_to']}"
              if swap["rollback_to"] else "roll back: no older version is kept to return to")
        return 0
    if args.index_command == "retire":
        with connect(_index_url(settings)) as conn, conn.transaction():
            blue_green.retire(conn, args.version)
        print(f"v{args.version} retired: its table is dropped")
        return 0
    if args.index_command in ("pin", "unpin"):
        from rag_pipeline.lifecycle.reclaim import pin

        if args.index_command == "pin" and not (args.reason or "").strip():
            raise UsageError("index pin: --reason is required (it is recorded with the pin)")
        with connect(_index_url(settings)) as conn, conn.transaction():
            try:
                pin(conn, args.version, args.reason if args.index_command == "pin" else None)
            except LookupError as exc:
                raise UsageError(str(exc)) from None
        print(f"v{args.version} pinned: never reclaimed until `rag-pipeline index unpin {args.version}`"
              if args.index_command == "pin" else
              f"v{args.version} unpinned: reclaimed retention.rollback after it stops being active")
        return 0
    return _index_list(args, settings)


def _index_list(args: argparse.Namespace, settings: Settings) -> int:
    from rag_pipeline import store
    from rag_pipeline.lifecycle.reclaim import reclaim_due
    from rag_pipeline.store.database import connect

    retention = settings.retention
    with connect(_index_url(settings)) as conn:
        all_versions = store.versions.index_versions(conn)
        active = store.versions.active_version(conn)
        times = store.versions.version_times(conn)
        target = store.versions.rollback_target(conn, active.version_id) if active else None
        now = store.versions.database_now(conn)
        due = {p.version.version_id: reclaim_due(p, retention.rollback_seconds, retention.rollback_warning_seconds,
                                                 now)
               for p in store.versions.previous_versions(conn) if p.pinned_reason is None}
    rows = [
        {
            "version": v.version_id, "status": v.status, "active": active is not None and v.version_id == active.version_id,
            "rollback_target": v.version_id == target, "pinned_reason": times[v.version_id].pinned_reason,
            "reclaim_at": due.get(v.version_id),
            "embedding_model": v.embedding_model, "model_revision": v.model_revision,
            "model_identity": v.model_identity, "dimensions": v.dimensions,
            "chunker_version": v.chunker_version, "parser_version": v.parser_version, "rows": v.row_count,
            "table": v.table_name, "created_at": times[v.version_id].created_at,
            "promoted_at": times[v.version_id].promoted_at, "retired_at": times[v.version_id].retired_at,
        }
        for v in all_versions
    ]
    if args.json:
        _print_json(rows)
        return 0
    if not rows:
        print("no index versions yet: run `rag-pipeline ingest`")
    for row in rows:
        marker = "*" if row["active"] else " "
        notes = [note for note in (
            "rollback returns here" if row["rollback_target"] else "",
            f"pinned: {row['pinned_reason']}" if row["pinned_reason"] else "",
            f"reclaim due {row['reclaim_at']:%Y-%m-%d %H:%M} UTC" if row["reclaim_at"] else "") if note]
        print(f"{marker} v{row['version']:<3} {row['status']:<9} {row['embedding_model']} ({row['dimensions']} dims)"
              f"  {row['rows']} rows  created {row['created_at']:%Y-%m-%d %H:%M}"
              + (f"  ({'; '.join(notes)})" if notes else ""))
    return 0


def cmd_parse(args: argparse.Namespace, settings: Settings) -> int:
    """Parse one file through the cascade, as ingestion would (cleaning included), and report every page."""
    require("pipeline", "rag-pipeline parse")
    from rag_pipeline.parsing.cascade import Cascade, parse_document
    from rag_pipeline.parsing.pages import DeadLetter, parser_version
    from rag_pipeline.text.cleaning import clean_parsed_pages

    path = Path(args.file)
    report: dict[str, Any] = {"file": str(path), "status": "ok", "reason": None, "detail": None,
                              "parser_version": parser_version(), "pages": []}
    cascade = Cascade(settings.parsing)
    describer = None
    if settings.parsing.vlm.describe_pictures:  # asked each time: a file parsed here has no cache to read
        from rag_pipeline.parsing.descriptions import DescriptionCache, PictureDescriber

        describer = PictureDescriber(settings.parsing.vlm, settings.parsing.max_render_pixels)
    try:
        pages = parse_document(path, args.password, cascade)
        if describer is not None:
            said: dict[str, str] = {}
            report["pictures_described"] = describer.describe(
                path, args.password, pages, DescriptionCache(said.get, said.__setitem__)).described
        report["chars_removed"] = clean_parsed_pages(pages)
        report["pages"] = [
            {"page": p.page, "tier": p.tier, "signals": p.signals, "markdown": p.markdown, "tables": p.tables,
             "seconds": round(p.seconds, 4)}
            for p in pages
        ]
    except DeadLetter as exc:
        report.update(status="dead_letter", reason=exc.reason, detail=exc.detail)
    except FileNotFoundError:
        report.update(status="dead_letter", reason="missing", detail=f"no such file: {path}")
    finally:
        cascade.close()
        if describer is not None:
            describer.close()
    report["tiers_unavailable"] = cascade.unavailable
    if args.json:
        _print_json(report)
    else:
        if report["status"] != "ok":
            print(f"{path}: dead letter ({report['reason']}): {report['detail']}")
        for page in report["pages"]:
            print(f"=== page {page['page']}: tier {page['tier']}, {len(page['markdown'])} chars, {page['tables']} "
                  f"tables, {page['seconds']:.3f} s")
            pictures = page["signals"].get("pictures", [])
            signals = {key: value for key, value in page["signals"].items() if key != "pictures"}
            print("signals: " + json.dumps(signals, sort_keys=True, default=str))
            print(page["markdown"].rstrip() + "\n")
            for number, picture in enumerate(pictures, 1):  # chunked as figures (rag_pipeline.text.figures)
                words = " ".join(str(picture.get("text", "")).split())
                read_by = " (words read by OCR)" if picture.get("text_read_by") == "ocr" else ""
                print(f"picture {number}: {picture.get('kind')} at {picture.get('box')}, caption "
                      f"{picture.get('caption')!r}{read_by}: {words[:300]}")
                if picture.get("description"):
                    print(f"  described: {picture['description'][:500]}")
        for tier, why in report["tiers_unavailable"].items():
            print(f"note: tier {tier} could not run: {why}")
    return EXIT_OK if report["status"] == "ok" else EXIT_FAILED


def cmd_config(args: argparse.Namespace, settings: Settings) -> int:
    """The configuration: its JSON Schema, or the settings as loaded (defaults and environment applied)."""
    from rag_pipeline.config import json_schema_text

    if args.config_command == "schema":
        sys.stdout.write(json_schema_text())
    else:
        print(f"# {settings.config_file or 'no configuration file: defaults and environment'}")
        from rag_pipeline.endpoints.redaction import redact_value

        # Passwords in URLs (the database's, an object store's endpoint) and secret query values are masked.
        print(json.dumps(redact_value(settings.model_dump(mode="json", by_alias=True)), indent=2))
    return 0


def cmd_ui(args: argparse.Namespace, settings: Settings) -> int:
    home = _prepare_instance(settings)
    host, port = args.host or settings.ui.host, args.port or settings.ui.port
    # `dg dev` (dagster-dg-cli), the current way to run Dagster locally: webserver and daemon, on this code location.
    beside = Path(sys.executable).with_name("dg")
    dg_cli = beside if beside.exists() else Path(shutil.which("dg") or beside)
    if not dg_cli.exists():
        raise MissingExtraError("the `dg` command of dagster-dg-cli is not installed beside this Python: "
                                + install_hint("pipeline"))
    # A workspace file of our own (not the operator's DAGSTER_HOME) names the location as `dg dev` in the checkout
    # and workspace.yaml do: rag_pipeline.
    workspace = settings.data_dir / "ui_workspace.yaml"
    workspace.parent.mkdir(parents=True, exist_ok=True)
    workspace.write_text("load_from:\n  - python_module:\n      module_name: rag_pipeline.definitions\n"
                         "      location_name: rag_pipeline\n")
    command = [str(dg_cli), "dev", "-w", str(workspace), "-h", host, "-p", str(port)]
    if settings.config_file:
        os.environ["RAG_CONFIG"] = str(settings.config_file)
    print(f"Dagster UI on http://{host}:{port} (DAGSTER_HOME={home}); Ctrl-C stops it.", flush=True)
    # Stops sent to this process reach the UI too: SIGTERM and SIGHUP are passed on; Ctrl-C reaches both (one
    # process group), and one sent to this process alone is passed on if the UI is still up after a while.
    children: list[subprocess.Popen] = []

    def pass_on(signum: int, _frame: Any) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, pass_on)
    signal.signal(signal.SIGHUP, pass_on)
    # A signal Python catches is back to its default in the child after exec; one this process ignores (started
    # with `&` from a script) would stay ignored there, and dg dev then ignores SIGTERM too.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    ui = subprocess.Popen(command)
    children.append(ui)
    interrupted = False
    while True:
        try:
            code = ui.wait(timeout=15 if interrupted else None)
            break
        except subprocess.TimeoutExpired:
            ui.send_signal(signal.SIGINT)
        except KeyboardInterrupt:
            interrupted = True
    if interrupted:
        return EXIT_OK  # a stop the user asked for is a clean exit: `make run` ends without "Error 1"
    return code if code >= 0 else 128 - code  # killed by a signal: the shell's convention


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    require("serve", "rag-pipeline serve")
    from rag_pipeline.retrieval.service import serve

    if args.host or args.port:
        service = settings.service.model_copy(update={k: v for k, v in (("host", args.host), ("port", args.port)) if v})
        settings = settings.model_copy(update={"service": service})
    serve(settings, _index_url(settings), announce=lambda: print(
        f"search service on http://{settings.service.host}:{settings.service.port} (OpenAPI docs at /docs); "
        "Ctrl-C stops it.", flush=True))
    return 0


JSON_HELP = "print JSON instead of text"
MODE_HELP = "hybrid (default): dense and BM25 fused; dense or sparse alone"


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rag-pipeline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML configuration (default: $RAG_CONFIG or ./rag_pipeline.yaml)")
    parser.add_argument("--version", action="version", version=f"rag-pipeline {package_version()}",
                        help="print the installed version and exit")
    parser.add_argument("--debug", action="store_true",
                        help="print the traceback of every error, expected ones (one line without it) included")
    sub = parser.add_subparsers(dest="command", required=True)

    db = sub.add_parser("db", help="the embedded PostgreSQL server")
    db.add_argument("action", choices=["start", "stop", "status", "url", "psql"],
                    help="start (idempotent, migrates), stop, status (exit 1 when not running), print the index "
                         "database's URL, or open psql on it (the psql of the embedded server, else the one on PATH)")
    db.add_argument("--user", metavar="ROLE", help="url: the URL as ROLE connects (no password in it: PGPASSWORD or "
                                                   "~/.pgpass gives it)")
    db.add_argument("psql_args", nargs="*", metavar="PSQL_ARGUMENT",
                    help="psql: its arguments, after -- (rag-pipeline db psql -- -c 'SELECT 1')")
    db.set_defaults(func=cmd_db)

    sub.add_parser("migrate", help="apply pending SQL migrations").set_defaults(func=cmd_migrate)

    ingest = sub.add_parser("ingest", help="run the ingest job through Dagster")
    ingest.add_argument("--source", action="append", metavar="NAME=PATH",
                        help="scan this folder as source NAME (repeatable); default: the configured sources")
    ingest.add_argument("--labels", help="default ACL labels for --source folders, comma-separated")
    erase = sub.add_parser("erase", help="erase a document or a source from everything the pipeline keeps")
    target = erase.add_mutually_exclusive_group(required=True)
    target.add_argument("--doc", metavar="SOURCE:PATH", help="one document, by source and path")
    target.add_argument("--source", metavar="NAME", help="every document of a source")
    erase.add_argument("--confirm", action="store_true",
                       help="erase a source that is still in the configuration (refused without it, exit 4)")
    erase.add_argument("--undo", action="store_true",
                       help="re-admit: an erased document back at its source is held until this is run for it "
                            "(--doc SOURCE:PATH, or --source NAME for every held one of a source)")
    erase.add_argument("--json", action="store_true", help="print one JSON object")
    erase.set_defaults(func=cmd_erase)
    doc = sub.add_parser("doc", help="the document a ref in Dagster's UI (#123) names")
    doc.add_argument("refs", nargs="+", metavar="REF", help="a ref as the UI shows it (#123 or 123)")
    doc.add_argument("--json", action="store_true", help="print JSON")
    doc.set_defaults(func=cmd_doc)
    gc = sub.add_parser("gc", help="collect embedding-cache entries and deletion-log paths past their retention")
    gc.add_argument("--json", action="store_true", help="print one JSON object")
    gc.set_defaults(func=cmd_gc)
    ingest.add_argument("--confirm-deletions", action="append", metavar="SOURCE",
                        help="carry out the deletions a scan of SOURCE held back (its root was empty, or more than "
                             "its max_deletion_share of documents were gone), or hold the documents of SOURCE that "
                             "left the configuration; repeatable")
    ingest.add_argument("--dry-run", action="store_true",
                        help="scan the sources and print what the refresh would do (documents by change, the guards "
                             "that would hold, the work), writing nothing to the index")
    ingest.add_argument("--json", action="store_true", help="print one JSON object")
    ingest.set_defaults(func=cmd_ingest)

    search = sub.add_parser("search", help="hybrid search of the active index version")
    search.add_argument("query", help="the question or keywords")
    search.add_argument("--labels", help="the caller's ACL labels, comma-separated (searching the database)")
    search.add_argument("--service", metavar="URL",
                        help=f"ask a running rag-pipeline serve instead, with the token in RAG_SEARCH_TOKEN (its "
                             f"labels); reads no configuration. Default: ${SEARCH_URL_VARIABLE}")
    search.add_argument("-k", type=int, help="results (default: retrieval.k; through a service, the service's)")
    search.add_argument("--mode", choices=["hybrid", "dense", "sparse"], default="hybrid", help=MODE_HELP)
    search.add_argument("--index-version", type=int, metavar="V",
                        help="search this index version instead of the active one")
    search.add_argument("--json", action="store_true", help=JSON_HELP)
    search.set_defaults(func=cmd_search)

    evaluate = sub.add_parser("eval", help="golden-set retrieval metrics")
    evaluate.add_argument("golden", nargs="?", help="golden set, JSON Lines (default: checks.golden_set)")
    evaluate.add_argument("--labels", help="the ACL labels to evaluate as, comma-separated (default: "
                          "checks.golden_labels); a question with its own `labels` is asked with those")
    evaluate.add_argument("-k", type=int, help="cut-off (default: checks.k)")
    evaluate.add_argument("--mode", choices=["hybrid", "dense", "sparse"], default="hybrid", help=MODE_HELP)
    evaluate.add_argument("--index-version", type=int, metavar="V",
                          help="evaluate this index version instead of the active one")
    evaluate.add_argument("--compare", type=int, nargs=2, metavar=("V1", "V2"),
                          help="two versions, with paired differences, 95%% CIs and p-values")
    evaluate.add_argument("--compare-modes", nargs=2, choices=["hybrid", "dense", "sparse"], metavar=("A", "B"),
                          help="two modes on one version, with paired differences")
    evaluate.add_argument("--floors", help="comma-separated score floors: recall and abstention for each")
    evaluate.add_argument("--min-similarity", type=float, help="score floor (default: retrieval.min_similarity)")
    evaluate.add_argument("--json", action="store_true", help=JSON_HELP)
    evaluate.set_defaults(func=cmd_eval)

    checks = sub.add_parser("checks", help="run the six index checks; exit 1 if any fails")
    checks.add_argument("--json", action="store_true", help=JSON_HELP)
    checks.add_argument("--set-baseline", action="store_true",
                        help="evaluate the golden set (checks.golden_set) now and make it the active version's baseline")
    checks.set_defaults(func=cmd_checks)

    index = sub.add_parser("index", help="index versions (blue/green)")
    index_sub = index.add_subparsers(dest="index_command", required=True)
    index_list = index_sub.add_parser("list", help="every index version, the active one marked with *")
    index_list.add_argument("--json", action="store_true", help=JSON_HELP)
    index_list.set_defaults(func=cmd_index)
    index_build = index_sub.add_parser("build", help="build a version for another model beside the active one")
    index_build.add_argument("--model", required=True, help="sentence-transformers name, or a folder holding a model "
                             "(modules.json or config.json at its top)")
    index_build.add_argument("--json", action="store_true", help=JSON_HELP)
    index_build.set_defaults(func=cmd_index)
    index_promote = index_sub.add_parser("promote", help="make a version active, if its gates pass")
    index_promote.add_argument("version", type=int, metavar="V", help="the index version to make active")
    index_promote.add_argument("--golden", help="golden set for the quality gate (default: checks.golden_set)")
    index_promote.add_argument("--labels", help="labels to evaluate the golden set as (default: "
                               "checks.golden_labels; a question with its own `labels` is asked with those)")
    index_promote.add_argument("-k", type=int, help="cut-off (default: checks.k)")
    index_promote.add_argument("--tolerance", type=float,
                               help="allowed drop in recall@k / nDCG@k (default: checks.quality_tolerance)")
    index_promote.add_argument("--force", metavar="REASON",
                               help="promote even if a gate fails; the reason is recorded with the promotion")
    index_promote.add_argument("--json", action="store_true", help=JSON_HELP)
    index_promote.set_defaults(func=cmd_index)
    index_rollback = index_sub.add_parser("rollback", help="re-activate the version active before the current one "
                                          "(older; only goes back)")
    index_rollback.add_argument("--json", action="store_true", help=JSON_HELP)
    index_rollback.set_defaults(func=cmd_index)
    index_retire = index_sub.add_parser("retire", help="drop a version that is not active")
    index_retire.add_argument("version", type=int, metavar="V", help="the index version to drop (not the active one)")
    index_retire.set_defaults(func=cmd_index)
    index_pin = index_sub.add_parser("pin", help="keep a version: never reclaimed after retention.rollback")
    index_pin.add_argument("version", type=int, metavar="V", help="the index version to keep")
    index_pin.add_argument("--reason", required=True, help="why (recorded with the pin)")
    index_pin.set_defaults(func=cmd_index)
    index_unpin = index_sub.add_parser("unpin", help="let retention.rollback reclaim a pinned version again")
    index_unpin.add_argument("version", type=int, metavar="V", help="the pinned index version")
    index_unpin.set_defaults(func=cmd_index)

    parse = sub.add_parser("parse", help="parse one file through the cascade and show each page")
    parse.add_argument("file", help="a document (PDF, Office, HTML, Markdown, text)")
    parse.add_argument("--password", help="password of an encrypted PDF")
    parse.add_argument("--json", action="store_true", help=JSON_HELP)
    parse.set_defaults(func=cmd_parse)

    config = sub.add_parser("config", help="the configuration file: its JSON Schema, or the settings as loaded")
    config.add_argument("config_command", choices=["schema", "show"],
                        help="schema: the JSON Schema of the file; show: the settings as loaded")
    config.set_defaults(func=cmd_config)

    ui = sub.add_parser("ui", help="serve the Dagster UI (and daemon) on the project's instance")
    ui.add_argument("--host", help="default: ui.host")
    ui.add_argument("--port", type=int, help="default: ui.port")
    ui.set_defaults(func=cmd_ui)

    serve = sub.add_parser("serve", help="search over HTTP for applications (tokens map to labels: service.tokens)")
    serve.add_argument("--host", help="default: service.host")
    serve.add_argument("--port", type=int, help="default: service.port")
    serve.set_defaults(func=cmd_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    from rag_pipeline.endpoints.redaction import install_log_redaction, keep_secrets_of, redact_credentials

    args = build_parser().parse_args(argv)
    install_log_redaction()  # no log line of this process (a run's included) shows a credential
    try:
        settings = None
        if not _service_url(args):  # a search through a running service reads no configuration: the service's apply
            from rag_pipeline.config import load_settings

            settings = load_settings(args.config)
            keep_secrets_of(settings.model_dump(mode="json"))
            from rag_pipeline.config import DEFAULT_CONFIG_NAME, ENV_OVERRIDES

            if settings.config_file is None and args.command != "config" and not any(
                    variable in os.environ for variable in ENV_OVERRIDES):
                # Outside a checkout, no file silently meant defaults: a data folder and sources other than meant.
                # (Configured by RAG_* variables alone, as in a container, it is meant: no note.)
                print(f"note: no configuration file ({DEFAULT_CONFIG_NAME} here, or --config, or $RAG_CONFIG): the "
                      f"built-in defaults; data in {settings.data_dir}", file=sys.stderr)
        return args.func(args, settings)
    except (MissingExtraError, UsageError) as exc:  # MissingExtraError: the install lacks what the command needs
        if args.debug:
            print(redact_credentials(traceback.format_exc()), end="", file=sys.stderr)
        print(f"error: {redact_credentials(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:
        # An error of a class whose module was never imported cannot have been raised: looked up, not imported
        # (importing them here would load the pipeline extra's modules on an install without it).
        def raised(*names: str) -> tuple[type, ...]:
            found = (getattr(sys.modules.get(module), cls, None) for module, cls in (n.rsplit(".", 1) for n in names))
            return tuple(c for c in found if isinstance(c, type))

        if args.debug:
            print(redact_credentials(traceback.format_exc()), end="", file=sys.stderr)
        if isinstance(exc, raised("rag_pipeline.config.ConfigError")):
            print(f"configuration error: {redact_credentials(str(exc))}", file=sys.stderr)
            return EXIT_USAGE
        usage = raised("rag_pipeline.retrieval.search.SearchError", "rag_pipeline.retrieval.evaluation.GoldenSetError",
                       "rag_pipeline.stages.chunk.ModelMismatchError")
        refused = raised("rag_pipeline.lifecycle.blue_green.VersionError")
        reported = raised("rag_pipeline.store.database.DatabaseError", "rag_pipeline.embedding.locations.ModelUnavailableError",
                          "rag_pipeline.lifecycle.erasure.ErasureError", "psycopg.OperationalError",
                          "rag_pipeline.retrieval.integrations.client.SearchServiceError")  # e.g. no server there
        if isinstance(exc, usage):  # the request or settings are wrong
            print(f"error: {redact_credentials(str(exc))}", file=sys.stderr)
            return EXIT_USAGE
        if isinstance(exc, refused):
            print(f"refused: {redact_credentials(str(exc))}", file=sys.stderr)
            return EXIT_REFUSED
        if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
            # a path the user gave (a golden set, a folder): the path and why, in one line
            said = f"{exc.strerror}: {exc.filename}" if exc.filename and exc.strerror else str(exc)
            print(f"error: {redact_credentials(said)}", file=sys.stderr)
            return EXIT_USAGE
        if isinstance(exc, reported):
            print(f"error: {redact_credentials(str(exc))}", file=sys.stderr)
        elif not args.debug:  # unexpected: the traceback is what a bug report needs
            print(redact_credentials(traceback.format_exc()), end="", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
