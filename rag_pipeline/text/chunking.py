"""Chunking: split on the structure a document already has, then by tokens of the embedding model.

Markdown headings open sections (their path becomes `section_path`); pages are hard boundaries so every
chunk has an exact page span. Inside a section, langchain's recursive splitter cuts by the embedding
model's own tokenizer, sized so that prefix + chunk fits the model's maximum sequence length.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rag_pipeline.domain import ids
from rag_pipeline.text import structure

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
PANDOC_CAPTION_RE = re.compile(r"^(?:Table|Tabelle|Tableau):\s*", re.IGNORECASE)
SECTION_SEPARATOR = " › "
# Consecutive same-level headings with no text between are joined into one title up to this length (beyond it,
# a list of headings such as a table of contents: each replaces the last, as headings do).
MAX_JOINED_TITLE = 160
# A table's title block: at most this many lines and words above it (more is a paragraph, not a title).
MAX_TITLE_LINES = 5
# A page with a run of this many lines that end in a page number is a contents page: there, such lines are entries.
MIN_CONTENTS_ENTRIES = 3
# Between two entries only short lines ("PART II", "Page", the first line of a wrapped title); a longer line is text.
MAX_CONTENTS_GAP_WORDS = 12
MAX_CAPTION_WORDS = 40
MONEY_RE = re.compile(r"[$€£¥]\s?\(?\d")
# /9: a chunk's prefix names its document by what it says it is (rag_pipeline.text.identity, read when chunking),
# with its file's name for a title only guessed from the cover, in at most a third of the prefix's budget; a section
# that repeats the name is left out. /10: a chunk for each picture parsing found that says something
# (rag_pipeline.text.figures)
CHUNKER_FAMILY = "structure+recursive-tokens/10"


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


@dataclass
class _OpenHeading:
    level: int
    title: str
    anchor: int | None  # structure.anchor_rank: a part, an item, a statement or the notes


def _is_statement(heading: _OpenHeading) -> bool:
    return heading.anchor == 2 and structure.statement_name(heading.title) is not None


def _continues_table(lines: Sequence[str]) -> bool:
    """The page goes on with a table: its first lines, past at most two running title lines, are table rows."""
    passed = 0
    for line in lines:
        if not line.strip():
            continue
        if TABLE_LINE_RE.match(line):
            return True
        if passed == 2 or not structure.is_title_line(line) or structure.statement_name(line):
            return False
        passed += 1
    return False


def _title_lines_at_end(lines: list[str], most: int = 2) -> list[str]:
    """The short title lines that end `lines` (a company's name above its statement's title), taken out of it."""
    taken: list[str] = []
    while lines and len(taken) < most:
        line = lines[-1]
        if not line.strip():
            lines.pop()
            continue
        if (_heading(line) or not structure.is_title_line(line) or len(line.split()) > 8
                or structure.is_furniture(structure.strip_heading_mark(line))):
            break
        taken.insert(0, lines.pop())
    return taken


def sections_of(pages: Sequence[tuple[int, str]]) -> list[Section]:
    """Cut pages at Markdown headings; the heading stack carries across pages.

    A report's structure decides what governs a page: contents entries and running furniture are never headings;
    a part, an item, a statement's title and the notes are anchors that replace everything below their rank and that
    ordinary headings, whatever their type size, never replace; a statement's title governs its own page and the next
    only while that page goes on with its table."""
    stack: list[_OpenHeading] = []
    sections: list[Section] = []

    def close(page: int, lines: list[str]) -> None:
        body = "\n".join(lines).strip()
        if body:
            sections.append(Section(page, tuple(h.title for h in stack), body))
        lines.clear()

    for page, text in pages:
        page_lines = text.split("\n")
        if any(_is_statement(h) for h in stack) and not _continues_table(page_lines):
            del stack[next(i for i, h in enumerate(stack) if _is_statement(h)):]
        contents_page = _is_contents_page(page_lines)
        lines: list[str] = []
        title_open = False  # the last heading, on this page, has had no text yet: the next may continue its title
        joining = True  # false for the rest of a run of headings too long to be one title (a table of contents)
        for line in page_lines:
            heading = _heading(line, contents_page)
            if heading is None and HEADING_MARK_RE.match(line):
                line = structure.strip_heading_mark(line)  # a contents entry set as a heading is text
            anchor = structure.anchor_rank(heading[1]) if heading else None
            # A heading directly followed by a sub-heading stays with it: no heading-only sections.
            if heading and any(kept.strip() and not _heading(kept, contents_page) for kept in lines):
                # a statement's title takes the name printed above it (its company) into its own section
                carried = _title_lines_at_end(lines) if anchor == 2 else []
                close(page, lines)
                lines.extend(carried)
            if heading:
                level, title = heading
                joined = f"{stack[-1].title} {title}" if stack else title
                if (title_open and joining and stack[-1].level == level and len(joined) <= MAX_JOINED_TITLE
                        and anchor is None and stack[-1].anchor not in (0, 1) and not NUMBERED_HEADING_RE.match(title)):
                    # Lines of one title set as headings ("Consolidated Statements of Cash Flows" over "(in
                    # millions of USD)"): the second does not replace the first in the path, they are one title.
                    # A numbered heading ("Item 8.") or another anchor opens a section of its own, and a part's or
                    # an item's title is whole.
                    stack[-1].title = joined
                else:
                    joining = joining and not (title_open and stack and stack[-1].level == level)
                    if anchor is not None:
                        while stack and (stack[-1].anchor is None or stack[-1].anchor >= anchor):
                            stack.pop()
                    else:
                        while stack and stack[-1].anchor is None and stack[-1].level >= level:
                            stack.pop()
                    stack.append(_OpenHeading(level, title, anchor))
                title_open = True
            elif line.strip():
                title_open, joining = False, True
            lines.append(line)
        close(page, lines)
    return sections


def _listed(title: str, contents_page: bool) -> bool:
    return structure.is_contents_entry(title) if contents_page else bool(structure.DOT_LEADER_RE.search(title[-200:]))


def _is_contents_page(lines: Sequence[str]) -> bool:
    """A table of contents (or an index): a run of lines that end with their page number, with no sentence between
    them. Headings that end in a number each followed by their text ("Clause 12" over its paragraph) are not one."""
    run = 0
    for line in lines:
        title = structure.strip_heading_mark(line)
        if structure.is_contents_entry(title):
            run += 1
            if run >= MIN_CONTENTS_ENTRIES:
                return True
        elif len(title.split()) > MAX_CONTENTS_GAP_WORDS:
            run = 0
    return False


def _heading(line: str, contents_page: bool = True) -> tuple[int, str] | None:
    """(level, title) for a Markdown heading, a numbered section line or a statement's title line, else None.
    Running furniture is never a heading, nor, on a contents page, a contents entry ("Item 8. Financial Statements
    45"); elsewhere only a title with dot leaders is one ("PostgreSQL 15" is a heading). Nor is a line holding an
    amount of money."""
    markdown = HEADING_MARK_RE.match(line)
    title = line[markdown.end():].rstrip().rstrip("#").rstrip() if markdown else ""
    if markdown and title:
        if structure.is_furniture(title) or _listed(title, contents_page) or MONEY_RE.search(title):
            return None  # a line with an amount in it is a table's row set in bold ("TOTAL NOTES PAYABLE $ 336")
        numbered = NUMBERED_HEADING_RE.match(title)
        if numbered and numbered.group("num"):  # "## 3.2 Scope": the numbering knows the depth better
            return numbered.group("num").count(".") + 1, title
        return len(markdown.group(1)), title
    stripped = line.strip()
    if not stripped or TABLE_LINE_RE.match(stripped):
        return None
    numbered = NUMBERED_HEADING_RE.match(stripped)
    if numbered and len(line.split()) <= 12 and not _listed(stripped, contents_page):
        depth = 1 if numbered.group("item") else numbered.group("num").count(".") + 1
        return depth, stripped
    if structure.statement_name(stripped):  # a statement's title in body type ("CONSOLIDATED BALANCE SHEETS")
        return 1, stripped
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
    caption: str = ""  # a table's title line


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
        # The same text is counted again and again (a block, then the chunk it becomes; the splitter's merges of
        # its pieces), and tokenizing is most of a small document's chunking: the last thousand counts of
        # chunk-sized texts are kept (a longer one, a whole table or block, is counted afresh: the cache lives as
        # long as the worker and must not hold large texts).
        self._cacheable_characters = max_tokens * 16
        self._cached_count = functools.lru_cache(maxsize=1024)(lambda text: len(tokenizer.tokenize(text)))
        # The model's tokens measure length (as langchain's from_huggingface_tokenizer does, without requiring
        # transformers' class: rag_pipeline.embedding.locations.FastTokenizer gives the same tokens).
        self._splitter = RecursiveCharacterTextSplitter(
            length_function=self.count_tokens,
            chunk_size=max_tokens,
            chunk_overlap=overlap_tokens,
            separators=["\n\n", "\n", ". ", " ", ""],
        )

    @property
    def version(self) -> str:
        return chunker_version(self.max_tokens, self.overlap_tokens)

    def count_tokens(self, text: str) -> int:
        if len(text) > self._cacheable_characters:
            return len(self.tokenizer.tokenize(text))
        return self._cached_count(text)

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

    def _pieces(self, section_text: str, carried_caption: str = "") -> tuple[list[str], int, str]:
        """The section cut into chunk texts, how many of them (at the end) come from a table that closes the
        section (the one that may run on over a page break), and the caption of that table. `carried_caption`
        captions a table that opens the section with no title of its own (a statement continued from the page
        before)."""
        pieces: list[str] = []
        closing_table, caption = 0, ""
        blocks = _with_captions(blocks_of(section_text))
        if len(blocks) > 1:
            # Headings already travel in every chunk's section path and prefix: alone they are noise.
            blocks = [b for b in blocks if b.kind == "table" or any(
                line.strip() and not _heading(line) for line in b.text.split("\n"))] or blocks
        for number, block in enumerate(blocks):
            closing_table = 0
            if block.kind == "table":
                caption = block.caption or (carried_caption if number == 0 else "")
                table_pieces = self.split_table(block.text, caption)
                pieces.extend(table_pieces)
                closing_table = len(table_pieces)
            elif self.count_tokens(block.text) <= self.max_tokens:
                pieces.append(block.text)
            else:
                pieces.extend(self._splitter.split_text(block.text))
        return pieces, closing_table, caption if closing_table else ""

    def is_whole_word(self, word: str) -> bool:
        """The model's tokenizer keeps it as one token: a word of its vocabulary."""
        return len(self.tokenizer.tokenize(word)) == 1

    def chunk(
        self, doc_id: str, pages: Sequence[tuple[int, str]], table_reach: dict[int, int] | None = None
    ) -> list[Chunk]:
        """Chunks in document order. `table_reach` maps a page to the last page its final table runs on to
        (tables joined over page breaks), so those table pieces get their true page span."""
        chunks: list[Chunk] = []
        table_reach = table_reach or {}
        pages = [(page, structure.join_split_words(text, self.is_whole_word)) for page, text in pages]
        sections = sections_of(pages)
        open_caption: tuple[tuple[str, ...], str] | None = None  # (path, caption) of a table that closed its page
        for number, section in enumerate(sections):
            carried = ""
            if open_caption and open_caption[0] == section.path and open_caption[1]:
                carried = open_caption[1] if open_caption[1].endswith("(continued)") else f"{open_caption[1]} (continued)"
            pieces, closing_table, closing_caption = self._pieces(section.text, carried)
            last_of_page = number + 1 == len(sections) or sections[number + 1].page != section.page
            open_caption = (section.path, closing_caption) if last_of_page and closing_table else None
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


def _title_block(lines: list[str]) -> tuple[list[str], str]:
    """The title block that ends a text block right above a table (company, statement, period, units; a parser's
    "Table: ..." line), as one caption line, and the lines left above it. A short last line of a wrapped paragraph
    is not a title: the block starts after a blank line, a heading or a finished sentence."""
    end = len(lines)
    while end and not lines[end - 1].strip():
        end -= 1
    start = end
    while start and end - start < MAX_TITLE_LINES and structure.is_title_line(lines[start - 1]) \
            and not structure.is_furniture(structure.strip_heading_mark(lines[start - 1])):
        start -= 1
    while start < end:
        above = lines[start - 1].strip() if start else ""
        if (not above or _heading(above) or structure.is_furniture(structure.strip_heading_mark(above))
                or above.endswith((".", ":", ";", "?", "!"))):
            break
        start += 1  # the block's top line goes on from the paragraph above: not a title
    block = [structure.strip_heading_mark(line) for line in lines[start:end] if line.strip()]
    if not block or sum(len(line.split()) for line in block) > MAX_CAPTION_WORDS:
        return lines, ""
    caption = " — ".join(PANDOC_CAPTION_RE.sub("", line) for line in block)  # a parser's "Table: ..." lines too
    return lines[:start], caption if TABLE_CAPTION_RE.match(caption) else f"Table: {caption}"


def _with_captions(blocks: list[Block]) -> list[Block]:
    """Tables that are really prose become text; every other table takes the title block right above it (or a
    numbered "Table 3." line) as its caption, out of the text before it."""
    merged: list[Block] = []
    for block in blocks:
        if block.kind == "table" and (prose := structure.prose_of_table(block.text)) is not None:
            block = Block("text", prose)
        if merged and merged[-1].kind == "text" and block.kind == "text":
            merged[-1] = Block("text", merged[-1].text + "\n" + block.text)
        else:
            merged.append(block)
    for number, block in enumerate(merged):
        if block.kind != "table" or not number or merged[number - 1].kind != "text":
            continue
        lines = merged[number - 1].text.split("\n")
        kept, caption = _title_block(lines)
        if not caption and lines and TABLE_CAPTION_RE.match(lines[-1].strip()):
            kept, caption = lines[:-1], lines[-1].strip()
        if caption:
            merged[number - 1] = Block("text", "\n".join(kept))
            merged[number] = Block("table", block.text, caption)
    return [b for b in merged if b.text.strip()]


def template_prefix(title: str | None, section_path: str, page_start: int, page_end: int) -> str:
    """The default contextual prefix: document title › section path › page."""
    pages = f"p. {page_start}" if page_start == page_end else f"pp. {page_start}-{page_end}"
    parts = [part for part in (title, section_path, pages) if part]
    return SECTION_SEPARATOR.join(parts)


MIN_NAME_WORDS = 2  # a document's name shortened further than this says nothing
WORD_RE = re.compile(r"[^\W_]+")


def fitted_prefix(count_tokens: Callable[[str], int], title: str | None, section_path: str, page_start: int,
                  page_end: int, budget: int) -> str:
    """The template prefix in at most `budget` tokens, keeping what says most about the chunk: the page, the
    innermost section (a statement's title), then the document's name, then the outer sections from the inside
    out. A part that does not fit is left out whole, never cut into word pieces; only an innermost section longer
    than the whole budget, and a document's name longer than a third of it or not fitting beside the section, are
    shortened, by whole words from their end (a name leads with what matters most: rag_pipeline.text.identity.label;
    at two words it is left out). An outer section that only repeats words of the name ("CREATE TABLE › CREATE
    TABLE › Parameters") is left out: it would say them twice."""
    if title and section_path:
        named = set(WORD_RE.findall(title.lower()))
        parts = section_path.split(SECTION_SEPARATOR)
        # the innermost stays: the name may be shortened below, and then only the section would say it
        section_path = SECTION_SEPARATOR.join(
            [part for part in parts[:-1] if not (words := set(WORD_RE.findall(part.lower()))) or not words <= named]
            + parts[-1:])
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
        title_words = title.split()
        keep_title = title
        # the name takes at most a third of the budget: the sections say where in the document a chunk is
        while count_tokens(render()) > budget or count_tokens(keep_title) > budget // 3:
            if len(title_words) <= MIN_NAME_WORDS:
                keep_title = None
                break
            title_words.pop()
            keep_title = " ".join(title_words)
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
