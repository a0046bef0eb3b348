"""Markdown read as Markdown: parsed with markdown-it-py (CommonMark plus GFM tables) and written back in the one
shape the chunker reads (ATX headings, paragraphs on one line, `-` and `1.` lists, pipe tables, fenced code).

A Markdown file needs no model stack: going through Docling imported torch in every parse worker (seconds) for a
file that is already Markdown. What is not text is left out: raw HTML tags (their text stays), link targets and
image files (their words stay), YAML front matter, emphasis markers, thematic breaks.
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import Iterator
from pathlib import Path

import yaml
from markdown_it import MarkdownIt
from markdown_it.token import Token

from rag_pipeline.parsing.pages import TABLE_SEPARATOR_RE, ParsedPage

FRONT_MATTER_RE = re.compile(r"\A---[ \t]*\n(.*?)\n(?:---|\.\.\.)[ \t]*(?:\n|\Z)", re.S)
# Tags of HTML's own elements and comments go; anything else in angle brackets is text, so a `<system>` tag stays
# visible to the prompt-injection flags and "a total < 50 EUR" keeps its words.
HTML_ELEMENTS = ("a abbr address article aside audio b blockquote br button caption center cite code col colgroup dd "
                 "del details dfn div dl dt em embed figcaption figure font footer form h1 h2 h3 h4 h5 h6 header hr i "
                 "iframe img input ins kbd label legend li link main mark meta nav noscript object ol optgroup option "
                 "p picture pre q s samp section select small source span strike strong sub summary sup table tbody "
                 "td template textarea tfoot th thead time tr tt u ul var video wbr").split()
HTML_TAG_RE = re.compile(rf"<!--.*?-->|</?(?:{'|'.join(HTML_ELEMENTS)})(?:\s[^<>]*)?/?>", re.S | re.IGNORECASE)
BLOCK_START_RE = re.compile(r"^(?:#{1,6}(?:\s|$)|>|[-+*]\s|\d{1,9}[.)]\s|\|)")
MAX_NESTING = 20  # lists and quotes deeper than this are read as text (markdown-it-py stops nesting there)
MAX_PARSED_BYTES = 8 * 1024 * 1024  # the parser holds about 100 bytes per byte of input: larger files stay text


def _parser() -> MarkdownIt:
    return MarkdownIt("commonmark", {"maxNesting": MAX_NESTING}).enable("table")


def parse_markdown(path: Path) -> Iterator[ParsedPage]:
    started = time.perf_counter()
    raw = path.read_bytes()
    text = raw.decode("utf-8", errors="replace")
    markdown = to_markdown(text) if len(raw) <= MAX_PARSED_BYTES else text
    yield ParsedPage(page=1, tier="markdown", markdown=markdown, seconds=time.perf_counter() - started,
                     tables=len(TABLE_SEPARATOR_RE.findall(markdown)),
                     signals={"chars": len(markdown), "format": "md"})


def to_markdown(text: str) -> str:
    """`text` (any Markdown) in the project's normal form. A document nested deeper than markdown-it-py follows
    (it drops what lies below its limit) is kept as its own text instead: nothing is lost to the parser."""
    text = _without_front_matter(text.replace("\r\n", "\n").replace("\r", "\n"))
    tokens = _parser().parse(text)
    if any(t.level >= MAX_NESTING - 2 for t in tokens):
        return text.strip() + "\n"
    blocks = _Writer().blocks(tokens)
    return "\n\n".join(b for b in blocks if b.strip()) + "\n"


def _without_front_matter(text: str) -> str:
    """YAML front matter (`---` lines around a mapping) is metadata, not text; a `---` that opens anything else (a
    thematic break, a setext heading's underline below) is left to the parser."""
    match = FRONT_MATTER_RE.match(text)
    if match is None:
        return text
    try:
        is_mapping = isinstance(yaml.safe_load(match.group(1)), dict)
    except yaml.YAMLError:
        is_mapping = False
    return text[match.end():] if is_mapping else text


def _strip_tags(markup: str) -> str:
    return html.unescape(HTML_TAG_RE.sub(" ", markup))


def _inline(token: Token) -> str:
    """The words of an inline token: text and code kept, markup, link targets and HTML tags left out."""
    parts: list[str] = []
    for child in token.children or []:
        if child.type == "text":
            parts.append(child.content)
        elif child.type == "code_inline":
            parts.append(f"`{child.content}`")
        elif child.type == "softbreak":
            parts.append(" ")
        elif child.type == "hardbreak":
            parts.append("\n")
        elif child.type == "image":
            parts.append(_inline(child) if child.children else child.attrGet("alt") or "")
        elif child.type == "html_inline":
            parts.append(_strip_tags(child.content).strip())
    return "".join(parts).strip()


class _Writer:
    """Walks markdown-it's block tokens; lists and quotes prefix the lines of what they hold."""

    def blocks(self, tokens: list[Token]) -> list[str]:
        self.tokens, self.position = tokens, 0
        return self._until(None)

    def _until(self, closing: str | None) -> list[str]:
        out: list[str] = []
        while self.position < len(self.tokens):
            token = self.tokens[self.position]
            self.position += 1
            if token.type == closing:
                break
            block = self._block(token)
            if block is not None:
                out.append(block)
        return out

    def _block(self, token: Token) -> str | None:
        kind = token.type
        if kind == "heading_open":
            text = _inline(self.tokens[self.position])
            self.position += 2  # inline, heading_close
            return f"{'#' * int(token.tag[1])} {text}" if text else None
        if kind == "paragraph_open":
            text = _inline(self.tokens[self.position])
            self.position += 2
            # A paragraph that an escape kept from being a heading, list or table stays one for the chunker.
            return "\\" + text if BLOCK_START_RE.match(text) else text
        if kind in ("fence", "code_block"):
            fence = "````" if "```" in token.content else "```"
            return f"{fence}{token.info.strip()}\n{token.content.rstrip()}\n{fence}"
        if kind == "html_block":
            return " ".join(_strip_tags(token.content).split())
        if kind == "blockquote_open":
            inner = "\n\n".join(self._until("blockquote_close"))
            return "\n".join(f"> {line}" if line else ">" for line in inner.split("\n"))
        if kind in ("bullet_list_open", "ordered_list_open"):
            return self._list(token)
        if kind == "table_open":
            return self._table()
        return None  # hr, and closing tokens of structures handled above

    def _list(self, opening: Token) -> str:
        ordered = opening.type == "ordered_list_open"
        number = int(opening.attrGet("start") or 1)
        closing = opening.type.replace("_open", "_close")
        items: list[str] = []
        while self.position < len(self.tokens):
            token = self.tokens[self.position]
            self.position += 1
            if token.type == closing:
                break
            if token.type != "list_item_open":
                continue
            marker = f"{number}. " if ordered else "- "
            number += 1
            body = "\n".join(self._until("list_item_close"))
            lines = body.split("\n") if body else [""]
            items.append(marker + lines[0] + "".join(f"\n{' ' * len(marker)}{line}" if line else "\n"
                                                     for line in lines[1:]))
        return "\n".join(items)

    def _table(self) -> str:
        rows: list[list[str]] = []
        while self.position < len(self.tokens):
            token = self.tokens[self.position]
            self.position += 1
            if token.type == "table_close":
                break
            if token.type == "tr_open":
                rows.append([])
            elif token.type == "inline" and rows:
                rows[-1].append(_inline(token).replace("|", "\\|").replace("\n", " "))
        if not rows:
            return ""
        width = max(len(r) for r in rows)
        rows = [r + [""] * (width - len(r)) for r in rows]
        lines = [f"| {' | '.join(rows[0])} |", "|" + "---|" * width]
        lines += [f"| {' | '.join(r)} |" for r in rows[1:]]
        return "\n".join(lines)
