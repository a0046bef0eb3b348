"""What a line is in the structure of a report: a contents entry, running furniture, an anchor heading (a part, an
item, a financial statement, the notes), a title line of the block above a table, prose set as a table, and words
split apart by character spacing.

Annual and quarterly reports (10-K, 10-Q, their equivalents elsewhere) open with a table of contents whose lines
look like headings ("Item 8. Financial Statements 45") and set statement titles in wide-tracked capitals that a
text layer splits ("Cash Flow s"). These rules keep such lines out of section paths and give each statement table
its title. They read only the text, so they apply to any document with the same shapes.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

# A title followed by its page number ("Item 16. Form 10-K Summary 115", "PART I 1") or by dot leaders.
DOT_LEADER_RE = re.compile(r"(?:\.\s*){3,}\d{1,4}$|…+\s*\d{1,4}$")
TRAILING_NUMBER_RE = re.compile(r"^(?P<title>.*\S)\s+(?P<number>\d{1,3})$")
# Words a number legitimately follows in a heading ("Note 12", "Part 2", "Tier 1"): not a page number.
NUMBERED_WORDS = frozenset(
    "note notes item items part section sections chapter schedule exhibit article table figure fig level tier "
    "phase step stage class series quarter q fy page appendix annex rule form chart no number unit group type "
    "act pillar scope clause paragraph volume vol version release module lesson".split()
    # a day after its month ("As of December 31")
    + "january february march april may june july august september october november december jan feb mar apr jun "
      "jul aug sep sept oct nov dec".split())
MAX_ENTRY_CHARS = 300
FURNITURE_TITLES = frozenset({"table of contents", "contents", "index"})

PART_RE = re.compile(r"^part\s+(?:[ivx]{1,4}|\d{1,2})\b", re.IGNORECASE)
ITEM_RE = re.compile(r"^item\s+\d{1,2}[a-z]?\b", re.IGNORECASE)
NOTES_RE = re.compile(r"^(?:condensed\s+|consolidated\s+|combined\s+)*notes\s+to\s+(?:the\s+)?(?:condensed\s+|"
                      r"consolidated\s+|combined\s+|unaudited\s+|interim\s+)*financial\s+statements\b", re.IGNORECASE)
# The primary statements by their usual titles; words before them may only be a name ("NIKE, Inc.").
STATEMENT_RE = re.compile(
    r"(?P<statement>\b(?:(?:condensed|consolidated|combined|unaudited|interim)\s+)*(?:"
    r"balance\s+sheets?|statements?\s+of\s+(?:consolidated\s+)?(?:financial\s+(?:position|condition)"
    r"|(?:comprehensive\s+)?(?:income|loss|earnings|operations)(?:\s+\(loss\))?|cash\s+flows?"
    r"|(?:changes\s+in\s+)?(?:(?:share|stock)holders['’]?\s+|shareowners['’]?\s+)?(?:equity|investment|deficit)"
    r"|retained\s+earnings)|(?:income|cash\s+flows?)\s+statements?))\b",
    re.IGNORECASE)
# Words that make a line mentioning a statement a sentence, not its title ("See the Consolidated Balance Sheets").
SENTENCE_LEADS = frozenset("see refer the in per from our as on to of and with for under a an this these its".split())
# Lower-case words that go on a statement's title rather than a sentence ("... as of December 31", "... and
# Comprehensive Income").
TITLE_CONTINUATIONS = frozenset("as at for and in of from ended".split())
MAX_TITLE_WORDS = 14
ABBREVIATION_END_RE = re.compile(r"(?:\b[A-Z]{1,5}|\b(?:Inc|Co|Corp|Ltd|Bros|No|U\.S|L\.P|N\.A))\.$")
LIST_MARK_RE = re.compile(r"^\s*(?:[-*•]|\d{1,3}[.)])\s+\S")
TABLE_ROW_RE = re.compile(r"^\s*\|")
HEADING_MARK_RE = re.compile(r"^#{1,6}\s+")


def strip_heading_mark(line: str) -> str:
    return HEADING_MARK_RE.sub("", line.strip()).rstrip("#").strip()


def is_contents_entry(title: str) -> bool:
    """A line of a table of contents (or a running footer): a title that ends with its page number."""
    title = title.strip()
    if len(title) > MAX_ENTRY_CHARS:  # also bounds the patterns' work on a hostile line
        return False
    if DOT_LEADER_RE.search(title):
        return True
    match = TRAILING_NUMBER_RE.match(title)
    if not match or not re.search(r"[A-Za-z]{2}", match.group("title")):
        return False
    before = match.group("title").split()[-1].lower().strip(".:,;()")
    return before not in NUMBERED_WORDS


def is_furniture(title: str) -> bool:
    """A running page line or a contents page's own title: never a section."""
    return " ".join(title.lower().split()).strip(":") in FURNITURE_TITLES


def statement_name(line: str) -> str | None:
    """The statement a title line names ("Consolidated Balance Sheets"), or None when the line is not a statement
    title: short, not a sentence, and nothing but a name before the statement's words."""
    text = strip_heading_mark(line)
    words = text.split()
    if not words or len(words) > MAX_TITLE_WORDS or text.endswith((";", ",")) or is_contents_entry(text):
        return None
    match = STATEMENT_RE.search(text)
    if not match:
        return None
    lead = text[: match.start()].split()
    if len(lead) > 6 or any(word.lower().strip(",.:") in SENTENCE_LEADS or word[:1].islower() for word in lead):
        return None
    if text[match.end():].lstrip().startswith((".", ":")):
        return None  # "... in the Consolidated Balance Sheets.": a wrapped sentence's end, or a label in a note
    rest = re.sub(r"\([^)]*\)?", " ", text[match.end():]).split()  # "(in millions)", "(continued)" say nothing
    if rest and rest[0][:1].islower() and rest[0].lower() not in TITLE_CONTINUATIONS:
        return None  # "Balance sheet data was restated ...": a sentence
    return match.group("statement")


def anchor_rank(title: str) -> int | None:
    """Headings that open a part of a report whatever their type size: 0 a part, 1 an item, 2 a statement or the
    notes. A heading of lower rank (or none) never replaces an anchor; an anchor replaces all below its rank."""
    text = strip_heading_mark(title)
    if PART_RE.match(text) and len(text.split()) <= 8:
        return 0
    if ITEM_RE.match(text):
        return 1
    if NOTES_RE.match(text) or statement_name(text):
        return 2
    return None


def is_title_line(line: str) -> bool:
    """A line of the title block above a table: a heading, or a short line that is not a sentence (a company name,
    a statement's name, a period, the units)."""
    text = line.strip()
    if not text or TABLE_ROW_RE.match(text) or LIST_MARK_RE.match(text):
        return False
    if HEADING_MARK_RE.match(text):
        return True
    if len(text.split()) > 12 or len(text) > 110:
        return False
    return not text.endswith((".", ";", ":")) or bool(ABBREVIATION_END_RE.search(text))


def table_cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def prose_of_table(table: str) -> str | None:
    """The text of a Markdown table that is really prose, else None: every row has at most one filled cell, and
    the cells are sentences (one of at least 12 words, or 5 on average), as a table finder may set a paragraph
    whose lines hold figures."""
    rows = [line for line in table.split("\n") if line.strip() and not re.match(r"^\s*\|(?:\s*:?-{3,}:?\s*\|)+\s*$",
                                                                                line)]
    filled = [[cell for cell in table_cells(row) if cell] for row in rows]
    if not filled or any(len(cells) > 1 for cells in filled):
        return None
    texts = [cells[0] for cells in filled if cells]
    words = [len(text.split()) for text in texts]
    if not texts or (max(words) < 12 and sum(words) / len(words) < 5):
        return None  # a one-column table of short entries (names, items) stays a table
    return "\n".join(texts)


PIECE_RE = re.compile(r"^([A-Za-z]{1,4})([^A-Za-z]*)$")  # a short run of letters, then punctuation ("s,")


def join_split_words(text: str, is_word: Callable[[str], bool]) -> str:
    """Join a word's pieces that character spacing split apart ("Cash Flow s", "TABLE OF CONTE NTS",
    "Statement of Incom e"): a short trailing piece that is no word of its own (a single letter other than "a" and
    "I", or a fragment `is_word` rejects) joins the word before it when the two together make a word, in the same
    case. A lone "s" after a word is a split plural; other single letters join only a head that is no word itself.
    `is_word` is the vocabulary check (the embedding model's tokenizer: one token is a whole word)."""

    @functools.lru_cache(maxsize=4096)
    def word(candidate: str) -> bool:
        return is_word(candidate.lower())

    def joins(head: str, tail: str) -> bool:
        if not (tail.islower() or (tail.isupper() and head.isupper())):
            return False
        if len(tail) == 1:
            if tail in "aAI" or (word(head) and tail not in "sS"):
                return False
        elif word(tail):
            return False
        return word(head + tail)

    lines = []
    for line in text.split("\n"):
        words = line.split(" ")
        index = 0
        while index < len(words) - 1:
            head, piece = words[index], PIECE_RE.match(words[index + 1])
            if len(head) >= 2 and head.isalpha() and piece and joins(head, piece.group(1)):
                words[index] = head + words.pop(index + 1)
                continue  # "CONT E NTS": the joined word may take the next piece too
            index += 1
        lines.append(" ".join(words))
    return "\n".join(lines)
