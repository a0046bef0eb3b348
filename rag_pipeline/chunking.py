"""Chunking: split on the structure a document already has, then by tokens of the embedding model.

Markdown headings open sections (their path becomes `section_path`); pages are hard boundaries so every
chunk has an exact page span. Inside a section, langchain's recursive splitter cuts by the embedding
model's own tokenizer, sized so that prefix + chunk fits the model's maximum sequence length.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

HEADING_RE = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
TABLE_LINE_RE = re.compile(r"^\s*\|")
SECTION_SEPARATOR = " › "
CHUNKER_FAMILY = "headings+recursive-tokens/1"


def chunker_version(max_tokens: int, overlap_tokens: int) -> str:
    """Recorded on every chunk and index version: changing size or overlap re-chunks, and nothing else does."""
    return f"{CHUNKER_FAMILY};max={max_tokens};overlap={overlap_tokens}"


@dataclass(frozen=True)
class Chunk:
    chunk_id: str
    ordinal: int
    text: str
    section_path: str
    page_start: int
    page_end: int
    content_type: str
    token_count: int
    content_hash: str


@dataclass(frozen=True)
class Section:
    page: int
    path: tuple[str, ...]
    text: str


def sections_of(pages: Sequence[tuple[int, str]]) -> list[Section]:
    """Cut pages at Markdown headings; the heading stack carries across pages."""
    stack: list[tuple[int, str]] = []
    sections: list[Section] = []

    def close(page: int, lines: list[str]) -> None:
        body = "\n".join(lines).strip()
        if body:
            sections.append(Section(page, tuple(title for _, title in stack), body))
        lines.clear()

    for page, text in pages:
        lines: list[str] = []
        for line in text.split("\n"):
            heading = HEADING_RE.match(line)
            # A heading directly followed by a sub-heading stays with it: no heading-only sections.
            if heading and any(kept.strip() and not HEADING_RE.match(kept) for kept in lines):
                close(page, lines)
            if heading:
                level = len(heading.group(1))
                while stack and stack[-1][0] >= level:
                    stack.pop()
                stack.append((level, heading.group(2).strip()))
            lines.append(line)
        close(page, lines)
    return sections


def content_type_of(text: str) -> str:
    lines = [line for line in text.split("\n") if line.strip()]
    table_lines = sum(1 for line in lines if TABLE_LINE_RE.match(line))
    return "table" if lines and table_lines / len(lines) >= 0.6 else "prose"


class Chunker:
    def __init__(self, tokenizer: Any, max_tokens: int, overlap_tokens: int = 0):
        from langchain_text_splitters import RecursiveCharacterTextSplitter

        if max_tokens < 16:
            raise ValueError(f"max_tokens={max_tokens} is too small to hold a useful chunk")
        if not 0 <= overlap_tokens < max_tokens:
            raise ValueError("overlap_tokens must be >= 0 and smaller than max_tokens")
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.overlap_tokens = overlap_tokens
        self._splitter = RecursiveCharacterTextSplitter.from_huggingface_tokenizer(
            tokenizer,
            chunk_size=max_tokens,
            chunk_overlap=overlap_tokens,
            separators=["\n\n", "\n", ". ", " ", ""],
        )

    @property
    def version(self) -> str:
        return chunker_version(self.max_tokens, self.overlap_tokens)

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.tokenize(text))

    def chunk(self, doc_id: str, pages: Sequence[tuple[int, str]]) -> list[Chunk]:
        chunks: list[Chunk] = []
        for section in sections_of(pages):
            pieces = (
                [section.text]
                if self.count_tokens(section.text) <= self.max_tokens
                else self._splitter.split_text(section.text)
            )
            for piece in pieces:
                piece = piece.strip()
                if not piece:
                    continue
                text_hash = hashlib.sha256(piece.encode()).hexdigest()
                ordinal = len(chunks)
                chunk_id = hashlib.sha256(f"{doc_id}|{self.version}|{ordinal}|{text_hash}".encode()).hexdigest()
                chunks.append(
                    Chunk(
                        chunk_id=chunk_id[:32],
                        ordinal=ordinal,
                        text=piece,
                        section_path=SECTION_SEPARATOR.join(section.path),
                        page_start=section.page,
                        page_end=section.page,
                        content_type=content_type_of(piece),
                        token_count=self.count_tokens(piece),
                        content_hash=text_hash,
                    )
                )
        return chunks


def template_prefix(title: str | None, section_path: str, page_start: int, page_end: int) -> str:
    """The default contextual prefix: document title › section path › page."""
    pages = f"p. {page_start}" if page_start == page_end else f"pp. {page_start}-{page_end}"
    parts = [part for part in (title, section_path, pages) if part]
    return SECTION_SEPARATOR.join(parts)


def truncate_to_tokens(tokenizer: Any, text: str, budget: int) -> str:
    """Cut text to at most `budget` tokens of the model, on a token boundary."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= budget:
        return text
    return tokenizer.decode(ids[:budget], skip_special_tokens=True)
