"""Stage 3: structure-aware chunks with their contextual prefixes and safety flags.

Chunks are sized for the shortest window among the configured model and every version that receives writes,
so every chunk fits every version and an embedding-model swap (or a rollback) re-chunks nothing.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field

import psycopg

from rag_pipeline import store
from rag_pipeline.config import ConfigError, Settings
from rag_pipeline.domain.refs import in_log
from rag_pipeline.domain.status import DocumentStatus
from rag_pipeline.embedding.identity import (
    cache_key,
    configured_identity,
    for_database,
    model_for_version,
    version_settings,
)
from rag_pipeline.embedding.locations import max_sequence_length, resolve_model
from rag_pipeline.stages.common import StageStats, count
from rag_pipeline.store.queue import PendingDocument
from rag_pipeline.text.chunking import Chunk, Chunker, chunker_version, fitted_prefix, truncate_to_tokens
from rag_pipeline.text.figures import figure_chunks
from rag_pipeline.text.identity import COVER_PAGES, prefix_name
from rag_pipeline.text.identity import derive as derive_identity
from rag_pipeline.text.language import text_search_config
from rag_pipeline.text.prefixes import LlmPrefixer, PrefixError, PrefixRequest
from rag_pipeline.text.safety import injection_flags

log = logging.getLogger(__name__)
D = DocumentStatus


class ModelMismatchError(RuntimeError):
    """embedding.model names another model than the active index version's; a swap is a new version."""


@dataclass
class ChunkStats(StageStats):
    documents_chunked: int = 0
    chunks_written: int = 0
    figure_chunks: int = 0  # of chunks_written: one per picture that says something (rag_pipeline.text.figures)
    requeued_for_new_chunker: int = 0
    chunker_version: str = ""
    prefixes_generated: int = 0  # LLM calls made
    prefixes_cached: int = 0  # LLM prefixes reused from the cache
    prefix_failures: int = 0  # documents left in the queue because the endpoint failed
    # documents chunked this run whose title, organisation, kind and period were found, by where (cover, pdf
    # metadata, file name): how well the collection says what its documents are
    identity_found: dict[str, int] = field(default_factory=dict)
    token_counts: list[int] = field(default_factory=list)
    SUMMARY = ("documents_chunked", "chunks_written")

    def token_distribution(self) -> dict[str, float]:
        tokens = self.token_counts
        if not tokens:
            return {}
        return {"min": min(tokens), "median": float(statistics.median(tokens)), "max": max(tokens),
                "mean": round(statistics.fmean(tokens), 1)}


def check_configured_model(conn: psycopg.Connection, settings: Settings) -> None:
    """Refuse a refresh whose model (weights or backend) differs from the active version's: writing chunks sized
    and vectors embedded for another model into the live index would be a silent swap. The same weights in another
    folder are the same model."""
    active = store.versions.active_version(conn)
    if active is None:
        return
    active_key = cache_key(active)
    embedding = settings.embedding.for_index(active.embedding_model)
    configured = configured_identity(embedding)
    if configured.key == active_key:
        return
    # What to do depends on where the configured model is: the version a rollback returns to, or no version yet.
    previous_id = store.versions.rollback_target(conn, active.version_id)
    previous = store.versions.get_version(conn, previous_id) if previous_id is not None else None
    keep = ", ".join(f"{key}: {value}" for key, value in version_settings(active).items())
    if previous is not None and previous.model_identity == configured.key:
        other = (f"or, to serve {previous.label} ({previous.embedding_model}) again, "
                 "`rag-pipeline index rollback`")
    else:
        other = (f"or, to swap models (a model, weights or backend change is a new index version), "
                 f"`rag-pipeline index build --model {settings.embedding.model}`, then `rag-pipeline index promote`")
    raise ModelMismatchError(
        f"embedding.model (with embedding.backend {embedding.backend}) is {configured.backend_model!r} "
        f"({configured.key}) but the active index version {active.label} was embedded by "
        f"{active.embedding_model!r} ({active_key}): a refresh would mix models. To refresh {active.label}, set "
        f"{keep}; {other}."
    )


def sizing_model_location(conn: psycopg.Connection, settings: Settings) -> str:
    """The model whose window sizes the chunks: the shortest among the configured model and the versions that
    receive writes (each as the model that gives its vectors here)."""
    names = [for_database(conn, settings.embedding).backend_model,
             *(model_for_version(v, settings.embedding) for v in store.versions.writable_versions(conn))]
    locations = {resolve_model(name, settings.embedding.models_dir).location for name in names}
    return min(sorted(locations), key=max_sequence_length)


MIN_CHUNK_TOKENS = 16


def chunk_size(settings: Settings, model_location: str) -> int:
    """Tokens per chunk: chunking.max_tokens, else what the model's window leaves after two special tokens
    ([CLS]/[SEP]) and the contextual prefix. Refused (before any document is touched) when the settings leave
    no room for a chunk, or no room beside the overlap."""
    chunking = settings.chunking
    window = max_sequence_length(model_location)
    size = chunking.max_tokens or window - 2 - (chunking.prefix_token_budget or 0)
    if size < MIN_CHUNK_TOKENS:
        raise ConfigError(f"{settings.config_file or 'configuration'}: chunking.prefix_token_budget: "
                          f"{chunking.prefix_token_budget} leaves {size} tokens of the model's {window} for a chunk "
                          f"(at least {MIN_CHUNK_TOKENS})")
    if chunking.overlap_tokens >= size:
        raise ConfigError(f"{settings.config_file or 'configuration'}: chunking.overlap_tokens: "
                          f"{chunking.overlap_tokens} is not smaller than the chunk size of {size} tokens")
    return size


def current_chunker_version(settings: Settings, model_location: str) -> str:
    return chunker_version(chunk_size(settings, model_location), settings.chunking.overlap_tokens)


def chunk_one(
    conn: psycopg.Connection,
    doc: PendingDocument,
    chunker: Chunker,
    prefixer: LlmPrefixer | None,
    settings: Settings,
    stats: ChunkStats,
) -> None:
    document_pages = store.pages.document_pages(conn, doc.doc_id)
    table_reach = store.pages.table_continuations(conn, doc.doc_id)
    pictures = store.pages.document_pictures(conn, doc.doc_id)
    # What the document says it is, read from its stored pages (so a new reading needs no re-parse), with its
    # sidecar's word over it
    derived = derive_identity(store.pages.pdf_metadata(conn, doc.doc_id),
                              [markdown for _, markdown in document_pages[:COVER_PAGES]], doc.rel_path,
                              settings.parsing.document_kinds).to_json()
    known = store.queue.document_identity(conn, doc.doc_id, derived)
    conn.commit()  # end the read: the write below must be a transaction of its own
    chunks = chunker.chunk(doc.doc_id, document_pages, table_reach)
    figures = figure_chunks(doc.doc_id, chunker.version, pictures, chunks, chunker.count_tokens,
                            lambda text, tokens: truncate_to_tokens(chunker.tokenizer, text, tokens),
                            chunker.max_tokens)
    chunks += figures
    # what the document is (its organisation, period and title), so a chunk that says "revenue" says whose and when
    title = prefix_name(known, doc.rel_path)
    budget = settings.chunking.prefix_token_budget or 0
    # with an LLM sentence to follow, the template keeps to half the budget so the sentence is not cut away
    template_budget = budget // 2 if prefixer is not None else budget
    prefixes = [fitted_prefix(chunker.count_tokens, title, c.section_path, c.page_start, c.page_end, template_budget)
                for c in chunks]
    if prefixer is not None:
        # The LLM is called outside any transaction (no row lock is held while waiting on the network);
        # what it writes is cached at once, so a retry after a failure pays only for what is missing.
        try:
            sentences = _llm_sentences(conn, doc, chunks, document_pages, prefixer, settings, stats)
        except PrefixError as exc:
            stats.prefix_failures += 1
            log.warning("no contextual prefix for %s, left for the next run: %s",
                        *in_log(doc.source, doc.rel_path, doc.ref, exc))
            return
        prefixes = [f"{p}\n{sentences[c.content_hash]}" for p, c in zip(prefixes, chunks, strict=True)]
    prefixes = [truncate_to_tokens(chunker.tokenizer, p, budget) for p in prefixes]  # the LLM's sentence, cut
    # Retrieved text ends up in a model's prompt: flag what looks like an attempt to steer it.
    flags = [injection_flags(c.text) for c in chunks]
    # The document's language decides how its words are stemmed for BM25.
    text_config = text_search_config("\n".join(text for _, text in document_pages))
    with conn.transaction():
        store.groups.lock_assignment(conn)  # before the row lock (see store.groups)
        if not store.queue.claim(conn, doc.doc_id, D.PENDING_CHUNK):
            return
        store.chunks.replace_chunks(conn, doc.doc_id, chunks, prefixes, flags, chunker.version,
                                   store.queue.parser_version_of(conn, doc.doc_id), text_config)
        store.queue.set_identity(conn, doc.doc_id, derived)
        store.queue.mark_chunked(conn, doc.doc_id, chunker.version)
    stats.documents_chunked += 1
    stats.chunks_written += len(chunks)
    stats.figure_chunks += len(figures)
    for key, where in derived.get("found", {}).items():
        count(stats.identity_found, f"{key}: {where.split(':')[0]}")
    stats.token_counts.extend(c.token_count for c in chunks)


def _llm_sentences(
    conn: psycopg.Connection,
    doc: PendingDocument,
    chunks: list[Chunk],
    document_pages: list[tuple[int, str]],
    prefixer: LlmPrefixer,
    settings: Settings,
    stats: ChunkStats,
) -> dict[str, str]:
    version = settings.prefix.prompt_version
    doc_hash = doc.content_hash or ""
    sentences = store.chunks.cached_prefixes(conn, doc.doc_id, doc_hash, version)
    conn.commit()
    missing = [PrefixRequest(c.content_hash, c.text) for c in chunks if c.content_hash not in sentences]
    stats.prefixes_cached += len({c.content_hash for c in chunks}) - len({r.chunk_hash for r in missing})
    if missing:
        document = "\n\n".join(text for _, text in document_pages)
        fresh = prefixer.prefixes(document, missing)
        with conn.transaction():
            store.chunks.store_prefixes(conn, doc.doc_id, doc_hash, version, fresh)
        sentences.update(fresh)
        stats.prefixes_generated += len(fresh)
    return sentences
