"""Chunking: split on the structure a document already has, then by tokens of the embedding model.

Markdown headings open sections (their path becomes `section_path`); pages are hard boundaries so every
chunk has an exact page span. Inside a section, langchain's recursive splitter cuts by the embedding
model's own tokenizer, sized so that prefix + chunk fits the model's maximum sequence length.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rag_pipeline.domain import ids

# The opening hashes of a Markdown heading; the title is taken by string operations, not by a pattern with a lazy
# group before optional trailers (that backtracks cubically on a long run of whitespace).
HEADING_MARK_RE = re.compile(r"^(#{1,6})\s+")
# Numbered sections as plain text: "Item 1A. Risk Factors", "3.2 Scope", "1. Purpose and scope".
NUMBERED_HEADING_RE = re.compile(
    r"^(?:(?P<item>Item\s+\d{1,2}[A-Z]?\.?)|(?P<num>\d{1,2}(?:\.\d{1,2}){0,4})\.?)\s+(?P<title>[A-Z][^.;:]{1,80})$"
)
TABLE_LINE_RE = re.compile(r"^\s*\|")
TABLE_SEPARATOR_RE = re.compile(r"^\s*\|(?:\s*:?-{3,}:?\s*\|)+\s*$")
LIST_LINE_RE = re.compile(r"^\s*(?:[-*•]|\d{1,3}[.)])\s+\S")
CAPTION_RE = re.compile(r"^(?:Figure|Fig\.|Abbildung|Chart)\s*[\dIVX]+", re.IGNORECASE)
# "Table 3. ..." or the parser's "Table: <title above the table>" (pandoc's caption line).
TABLE_CAPTION_RE = re.compile(r"^(?:Table|Tabelle|Tableau)(?::|\s*[\dIVX])", re.IGNORECASE)
SECTION_SEPARATOR = " › "
# Consecutive same-level headings with no text between are joined into one title up to this length (beyond it,
# a list of headings such as a table of contents: each replaces the last, as headings do).
MAX_JOINED_TITLE = 160
CHUNKER_FAMILY = "structure+recursive-tokens/4"


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
        title_open = False  # the last heading, on this page, has had no text yet: the next may continue its title
        joining = True  # false for the rest of a run of headings too long to be one title (a table of contents)
        for line in text.split("\n"):
            heading = _heading(line)
            # A heading directly followed by a sub-heading stays with it: no heading-only sections.
            if heading and any(kept.strip() and not _heading(kept) for kept in lines):
                close(page, lines)
            if heading:
                level, title = heading
                joined = f"{stack[-1][1]} {title}" if stack else title
                if (title_open and joining and stack[-1][0] == level and len(joined) <= MAX_JOINED_TITLE
                        and not NUMBERED_HEADING_RE.match(title)):
                    # Lines of one title set as headings ("Consolidated Statements of Cash Flows" over "(in
                    # millions of USD)"): the second does not replace the first in the path, they are one title.
                    # A numbered heading ("Item 8.") opens a section of its own.
                    stack[-1] = (level, joined)
                else:
                    joining = joining and not (title_open and stack and stack[-1][0] == level)
                    while stack and stack[-1][0] >= level:
                        stack.pop()
                    stack.append((level, title))
                title_open = True
            elif line.strip():
                title_open, joining = False, True
            lines.append(line)
        close(page, lines)
    return sections


def _heading(line: str) -> tuple[int, str] | None:
    """(level, title) for a Markdown heading or a numbered section line, else None."""
    markdown = HEADING_MARK_RE.match(line)
    title = line[markdown.end():].rstrip().rstrip("#").rstrip() if markdown else ""
    if markdown and title:
        numbered = NUMBERED_HEADING_RE.match(title)
        if numbered and numbered.group("num"):  # "## 3.2 Scope": the numbering knows the depth better
            return numbered.group("num").count(".") + 1, title
        return len(markdown.group(1)), title
    numbered = NUMBERED_HEADING_RE.match(line.strip())
    if numbered and len(line.split()) <= 12:
        depth = 1 if numbered.group("item") else numbered.group("num").count(".") + 1
        return depth, line.strip()
    return None


def content_type_of(text: str) -> str:
    lines = [line for line in text.split("\n") if line.strip() and not _heading(line)]
    if not lines:
        return "heading"
    table_lines = sum(1 for line in lines if TABLE_LINE_RE.match(line))
    if table_lines / len(lines) >= 0.6:
        return "table"
    if len(lines) <= 3 and CAPTION_RE.match(lines[0].strip()):
        return "figure_caption"
    if sum(1 for line in lines if LIST_LINE_RE.match(line)) / len(lines) >= 0.6:
        return "list"
    return "prose"


@dataclass(frozen=True)
class Block:
    kind: str  # "table" | "text"
    text: str


def blocks_of(text: str) -> list[Block]:
    """Split a section into runs of Markdown table lines and runs of everything else."""
    blocks: list[Block] = []
    for line in text.split("\n"):
        kind = "table" if TABLE_LINE_RE.match(line) else "text"
        if blocks and blocks[-1].kind == kind:
            blocks[-1] = Block(kind, blocks[-1].text + "\n" + line)
        else:
            blocks.append(Block(kind, line))
    return [b for b in blocks if b.text.strip()]


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

    def split_table(self, table: str, caption: str = "") -> list[str]:
        """A table is atomic; one too large for a chunk is cut between rows, every piece repeating
        the caption and the header row (and its separator) so that each piece stands alone."""
        lines = [line for line in table.split("\n") if line.strip()]
        has_header = len(lines) >= 2 and TABLE_SEPARATOR_RE.match(lines[1])
        head = ([caption] if caption else []) + (lines[:2] if has_header else [])
        rows = lines[2:] if has_header else lines
        whole = "\n".join(head + rows)
        if self.count_tokens(whole) <= self.max_tokens:
            return [whole]
        pieces: list[str] = []
        current: list[str] = []
        head_tokens = self.count_tokens("\n".join(head))
        budget = self.max_tokens - head_tokens
        if budget < 16:  # a header too wide to repeat: fall back to rows alone
            head, budget = [], self.max_tokens
        used = 0
        for row in rows:
            row_tokens = self.count_tokens(row) + 1
            if current and used + row_tokens > budget:
                pieces.append("\n".join(head + current))
                current, used = [], 0
            if row_tokens > budget:  # a single monstrous row: the token splitter is all that is left
                pieces.extend("\n".join(head + [part]) for part in self._splitter.split_text(row))
                continue
            current.append(row)
            used += row_tokens
        if current:
            pieces.append("\n".join(head + current))
        return pieces

    def _pieces(self, section_text: str) -> tuple[list[str], int]:
        """The section cut into chunk texts, and how many of them (at the end) come from a table that
        closes the section (the one that may run on over a page break)."""
        pieces: list[str] = []
        closing_table = 0
        blocks = blocks_of(section_text)
        if len(blocks) > 1:
            # Headings already travel in every chunk's section path and prefix: alone they are noise.
            blocks = [b for b in blocks if b.kind == "table" or any(
                line.strip() and not _heading(line) for line in b.text.split("\n"))] or blocks
        for block in blocks:
            closing_table = 0
            if block.kind == "table":
                caption = ""
                if pieces and TABLE_CAPTION_RE.match(pieces[-1].split("\n")[-1].strip()):
                    # The caption right above a table belongs to it (and to every piece of it).
                    prose_lines = pieces[-1].split("\n")
                    caption = prose_lines.pop().strip()
                    pieces[-1] = "\n".join(prose_lines)
                    if not pieces[-1].strip():
                        pieces.pop()
                table_pieces = self.split_table(block.text, caption)
                pieces.extend(table_pieces)
                closing_table = len(table_pieces)
            elif self.count_tokens(block.text) <= self.max_tokens:
                pieces.append(block.text)
            else:
                pieces.extend(self._splitter.split_text(block.text))
        return pieces, closing_table

    def chunk(
        self, doc_id: str, pages: Sequence[tuple[int, str]], table_reach: dict[int, int] | None = None
    ) -> list[Chunk]:
        """Chunks in document order. `table_reach` maps a page to the last page its final table runs on to
        (tables joined over page breaks), so those table pieces get their true page span."""
        chunks: list[Chunk] = []
        table_reach = table_reach or {}
        sections = sections_of(pages)
        for number, section in enumerate(sections):
            pieces, closing_table = self._pieces(section.text)
            last_of_page = number + 1 == len(sections) or sections[number + 1].page != section.page
            for position, piece in enumerate(pieces):
                piece = piece.strip()
                if not piece:
                    continue
                content_type = content_type_of(piece)
                runs_on = last_of_page and position >= len(pieces) - closing_table
                page_end = table_reach.get(section.page, section.page) if runs_on else section.page
                text_hash = ids.text_hash(piece)
                ordinal = len(chunks)
                chunks.append(
                    Chunk(
                        chunk_id=ids.chunk_id(doc_id, self.version, ordinal, text_hash),
                        ordinal=ordinal,
                        text=piece,
                        section_path=SECTION_SEPARATOR.join(section.path),
                        page_start=section.page,
                        page_end=page_end,
                        content_type=content_type,
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


def fitted_prefix(count_tokens: Callable[[str], int], title: str | None, section_path: str, page_start: int,
                  page_end: int, budget: int) -> str:
    """The template prefix in at most `budget` tokens, keeping what says most about the chunk: the page, the
    innermost section (a statement's title), then the document's title, then the outer sections from the inside
    out; a part that does not fit is left out whole, never cut into word pieces. Only an innermost section longer
    than the whole budget is shortened, by whole words."""
    whole = template_prefix(title, section_path, page_start, page_end)
    if count_tokens(whole) <= budget:
        return whole
    sections = [part for part in section_path.split(SECTION_SEPARATOR) if part] if section_path else []
    innermost = sections[-1] if sections else ""
    words = innermost.split()
    while words and count_tokens(template_prefix(None, " ".join(words), page_start, page_end)) > budget:
        words.pop()
    kept_innermost = " ".join(words)
    if count_tokens(template_prefix(None, kept_innermost, page_start, page_end)) > budget:
        return ""
    keep_title, outer = None, [False] * max(len(sections) - 1, 0)

    def render() -> str:
        path = [part for part, kept in zip(sections[:-1], outer, strict=True) if kept] + ([kept_innermost] if kept_innermost else [])
        return template_prefix(keep_title, SECTION_SEPARATOR.join(path), page_start, page_end)

    if title:
        keep_title = title
        if count_tokens(render()) > budget:
            keep_title = None
    for index in reversed(range(len(outer))):
        outer[index] = True
        if count_tokens(render()) > budget:
            outer[index] = False
    return render()


def truncate_to_tokens(tokenizer: Any, text: str, budget: int) -> str:
    """Cut text to at most `budget` tokens of the model, on a token boundary."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= budget:
        return text
    return tokenizer.decode(ids[:budget], skip_special_tokens=True)
