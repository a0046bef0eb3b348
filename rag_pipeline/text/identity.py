"""What a document is, read from the document itself: its title, the organisation it is by or about, its kind and
its period (year, quarter, period end).

Many collections name files by hash or by ticker and quarter, and people ask by name and period ("Coca-Cola's
Q3 2022 10-Q", "the latest annual report"), so routing, the contextual prefix and search results need what the
document says about itself. Each field is taken from the strongest place that has it:

  1. the PDF's own metadata (Title, Author/Company), when it reads as a title or an organisation rather than a
     converter's stamp, a filing number or a file name;
  2. the cover: the first pages' title block, a form's cover lines ("(Exact name of registrant as specified in its
     charter)", "For the fiscal year ended ..."), a copyright or publisher line, a release date;
  3. the file name, last: a year in it, its words as a title.
Sidecar metadata overrides all of it (in the database: rag.document_identity). The rules are generic shapes of
covers; the kinds are data (parsing.identity.kinds), so a deployment adds its own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import PurePosixPath
from typing import Any

from rag_pipeline.text.safety import injection_flags

# How much of the first pages is read: a cover and a title block are at the top.
COVER_PAGES = 3
COVER_CHARS = 6000
MAX_FIELD_CHARS = 200
MAX_METADATA_CHARS = 1000  # what is read of a metadata value (the parser keeps 300)

MONTHS = {name: number for number, names in enumerate(
    (("january", "jan"), ("february", "feb"), ("march", "mar"), ("april", "apr"), ("may",), ("june", "jun"),
     ("july", "jul"), ("august", "aug"), ("september", "sep", "sept"), ("october", "oct"), ("november", "nov"),
     ("december", "dec")), 1) for name in names}
_MONTH = r"(?:" + "|".join(sorted(MONTHS, key=len, reverse=True)) + r")\.?"
# "December 26, 2015", "26 December 2015", "April 22 2021", "2015-12-26", "05/10/2015" (day first, then month
# first when the day cannot be a month)
DATE_RE = re.compile(
    rf"(?P<m1>{_MONTH})\s+(?P<d1>\d{{1,2}}),?\s+(?P<y1>(?:19|20)\d\d)"
    rf"|(?P<d2>\d{{1,2}})\s+(?P<m2>{_MONTH}),?\s+(?P<y2>(?:19|20)\d\d)"
    r"|(?P<y3>(?:19|20)\d\d)-(?P<m3>\d\d)-(?P<d3>\d\d)"
    r"|(?P<a4>\d{1,2})/(?P<b4>\d{1,2})/(?P<y4>(?:19|20)\d\d)",
    re.IGNORECASE)
YEAR_RE = re.compile(r"(?<![\d.])((?:19|20)\d\d)(?![\d])")
QUARTER_WORDS = {"first": 1, "second": 2, "third": 3, "fourth": 4, "1st": 1, "2nd": 2, "3rd": 3, "4th": 4}

# A form's cover: the period it reports on.
FISCAL_YEAR_ENDED_RE = re.compile(r"for\s+the\s+(?:fiscal\s+)?year\s+ended[:\s]+", re.IGNORECASE)
PERIOD_ENDED_RE = re.compile(r"for\s+the\s+(?:quarterly\s+|three[- ]month\s+|six[- ]month\s+|nine[- ]month\s+)?"
                             r"period\s+ended[:\s]+", re.IGNORECASE)
NAMED_QUARTER_RE = re.compile(r"\b(first|second|third|fourth|1st|2nd|3rd|4th)\s+quarter\s+(?:of\s+)?(?:fiscal\s+)?"
                              r"(?:year\s+)?((?:19|20)\d\d)\b|\bQ([1-4])\s*(?:FY)?\s*'?((?:19|20)\d\d)\b",
                              re.IGNORECASE)
# A cover's date line: a release, a publication, an inspection.
DATED_RE = re.compile(r"\b(?:for\s+release|date\s+of\s+publication|published|release\s+date|dated?|as\s+of)\b[:\s]*",
                      re.IGNORECASE)

# The line above a form's "(Exact name of registrant as specified in its charter)" names the registrant.
REGISTRANT_RE = re.compile(r"exact\s+name\s+of\s+(?:the\s+)?registrant", re.IGNORECASE)
FORM_FURNITURE_RE = re.compile(r"commission\s+file|\bfile\s+number|^for\s+the\b|^or$|pursuant\s+to|^\(?mark\s+one|"
                               r"^form\s+[\w-]+$", re.IGNORECASE)
# A report's recommended citation: 'Lopez, ... 2016. "Title." Washington, D.C.: Publisher, June.' or 'Publisher,
# January, 2019, "Title"': the quoted title, and the publisher among its comma- or colon-separated parts.
CITATION_RE = re.compile(r"(?:recommended|suggested)\s+citation\b:?(?P<text>.{0,400})", re.IGNORECASE | re.DOTALL)
QUOTED_RE = re.compile(r"[“\"](?P<title>[^”\"]{8,200}?)[.,]?[”\"]")
COPYRIGHT_RE = re.compile(r"(?:©|\(c\)|copyright)\s*(?:(?:19|20)\d\d(?:\s*[-–,]\s*(?:19|20)?\d\d)*\s*,?\s*)?"
                          r"(?:by\s+)?(?P<name>[A-Z][\w&.,'’ -]{2,80}?)\s*(?:\.\s|,?\s+all\s+rights|\.?$)",
                          re.IGNORECASE | re.MULTILINE)
# Words an organisation's name ends with (or holds), in many languages' common forms.
ORGANISATION_WORDS = (
    r"inc|incorporated|corp|corporation|company|co|ltd|limited|llc|llp|lp|plc|n\.?v|s\.?a|ag|gmbh|"
    r"group|holdings|bank|technologies|university|college|school|institute|center|centre|department|ministry|"
    r"agency|commission|authority|council|association|foundation|organi[sz]ation|office|bureau|board")
ORGANISATION_RE = re.compile(rf"\b(?:{ORGANISATION_WORDS})\b\.?", re.IGNORECASE)
# a name of two words or more, each capitalised (or a connective), that ends with one of those words, or holds one
# followed by "of ..." ("Department of State", "University of Oxford")
ORGANISATION_NAME_RE = re.compile(
    rf"^(?:The\s+)?(?:[A-Z0-9][\w&.'’-]*,?\s+(?:(?:of|and|for|the|de|&)\s+)*)+"
    rf"(?:(?:{ORGANISATION_WORDS})\.?|[A-Z][\w&.'’-]*)$", re.IGNORECASE)
# PDF metadata written by tools, not by the document's authors
TOOL_STAMP_RE = re.compile(r"edgar|donnelley|workiva|microsoft\s*(?:word|powerpoint|excel)|adobe|acrobat|"
                           r"pdf\s*(?:creator|producer|generator)|latex|untitled|^user$|^admin", re.IGNORECASE)
# Lines of a cover that are never its title
# A title that only says what kind of document it is
GENERIC_TITLE_RE = re.compile(r"(?:user'?s?\s+|help\s+|quick\s+start\s+|owner'?s\s+|reference\s+)?"
                              r"(?:guide|manual|handbook|brochure|report|presentation|instructions)", re.IGNORECASE)
# "Carroll Doherty, Director of Political Research": a contact line
PERSON_AND_ROLE_RE = re.compile(r"^[A-Z][\w.'’-]+(?:\s+[A-Z][\w.'’-]+){1,3},\s+[A-Z]")
NOT_TITLE_RE = re.compile(
    r"^(?:table\s+of\s+contents|contents|united\s+states|securities\s+and\s+exchange\s+commission|washington|"
    r"form\s+[\w-]+|\(mark\s+one\)|for\s+release|for\s+media|page\s+\d+|abstract|draft|confidential|by\s|"
    r"case\s+\S+|numbers,\s+facts|(?:www\.|https?://)|.*@|.*\(cid:)", re.IGNORECASE)

FORM_LABELS = {"annual report": "annual report", "quarterly report": "quarterly report"}


@dataclass(frozen=True)
class DocumentIdentity:
    """What a document says it is; None where it does not say. `found` says where each field came from."""

    title: str | None = None
    organisation: str | None = None
    kind: str | None = None
    year: int | None = None  # the fiscal or calendar year it is for (a 10-K for the year ended Dec 2015: 2015)
    quarter: int | None = None
    period_end: str | None = None  # ISO date the period ends or the document is dated
    found: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {key: value for key, value in asdict(self).items() if value not in (None, {}, "")}


def _clean(text: str) -> str:
    """One line of plain text: Markdown marks and edge punctuation off, a closing abbreviation's dot ("Inc.")
    kept."""
    text = " ".join(re.sub(r"[#*_`|>\x00-\x1f\x7f-\x9f]+", " ", text).split()).strip(" ,;:-–—")
    stripped = text.rstrip(" ,;:-–—.")
    if text[len(stripped):].startswith(".") and re.search(r"(?:^|[^A-Za-z])[A-Za-z]{1,4}$", stripped[-5:]):
        stripped += "."
    return stripped.lstrip(".")[:MAX_FIELD_CHARS]


def _date(match: re.Match[str]) -> date | None:
    g = match.groupdict()
    try:
        if g["y1"]:
            return date(int(g["y1"]), MONTHS[g["m1"].lower().rstrip(".")], int(g["d1"]))
        if g["y2"]:
            return date(int(g["y2"]), MONTHS[g["m2"].lower().rstrip(".")], int(g["d2"]))
        if g["y3"]:
            return date(int(g["y3"]), int(g["m3"]), int(g["d3"]))
        first, second = int(g["a4"]), int(g["b4"])
        day, month = (first, second) if second <= 12 else (second, first)
        return date(int(g["y4"]), month, day)
    except (ValueError, KeyError):
        return None


def _date_after(text: str, cue: re.Pattern[str]) -> date | None:
    """The date written right after a cue ("For the fiscal year ended December 31, 2022")."""
    for match in cue.finditer(text):
        # a form's cells can sit between the cue and its date ("period ended Commission file June 30, 2022")
        found = DATE_RE.search(text, match.end(), match.end() + 60)
        if found and (parsed := _date(found)):
            return parsed
        year = re.match(r"\s*((?:19|20)\d\d)\b", text[match.end():match.end() + 12])
        if year:
            return date(int(year.group(1)), 12, 31)
    return None


def _lines(markdown: str) -> list[str]:
    return [line for line in (_clean(raw) for raw in markdown.splitlines()) if line]


def looks_like_title(text: str | None, rel_path: str) -> bool:
    """A title an author wrote: two words or more with letters, not a tool's stamp, a filing number or the file's
    own name."""
    if not text:
        return False
    words = re.findall(r"[^\W\d_]{2,}", text)
    stem = PurePosixPath(rel_path).stem.lower()
    squashed = re.sub(r"[\W_]+", "", text.lower())
    return (len(words) >= 2 and len(text) >= 8 and not TOOL_STAMP_RE.search(text)
            and squashed != re.sub(r"[\W_]+", "", stem) and not re.search(r"\.(?:docx?|pptx?|xlsx?|pdf|indd)\b", text, re.I))


def looks_like_organisation(text: str | None) -> bool:
    """A name of two to twelve capitalised words that holds an organisation's word ("Inc.", "University",
    "Department"), not a tool's stamp."""
    if not text or len(text) > 120 or TOOL_STAMP_RE.search(text) or re.search(r"\ba\s+division\s+of\b", text, re.I):
        return False
    words = text.split()
    capitalised = words[0][0].isupper() and all(
        w[0].isupper() or w[0].isdigit() or w.lower() in {"of", "and", "for", "the", "de", "&"} for w in words)
    return 2 <= len(words) <= 12 and capitalised and bool(ORGANISATION_RE.search(text))


def _registrant(lines: Sequence[str]) -> str | None:
    for index, line in enumerate(lines):
        match = REGISTRANT_RE.search(line)
        if not match:
            continue
        before = _clean(re.sub(r"\(\s*$", "", line[:match.start()]))
        if len(before) >= 3 and re.search(r"[^\W\d_]{2}", before):
            return before
        for previous in reversed(lines[max(0, index - 2):index]):
            if re.search(r"[^\W\d_]{2}", previous) and not FORM_FURNITURE_RE.search(previous):
                return previous
            if not FORM_FURNITURE_RE.search(previous):
                break
    return None


def _copyright_holder(text: str) -> str | None:
    for match in COPYRIGHT_RE.finditer(text):
        name = _clean(match.group("name"))
        if looks_like_organisation(name):
            return name
    return None


def _organisation_line(lines: Sequence[str]) -> str | None:
    """A short cover line that is an organisation's name and nothing else ("ITC Limited", "PEW RESEARCH
    CENTER")."""
    for line in lines[:40]:
        if len(line.split()) <= 8 and looks_like_organisation(line) and ORGANISATION_NAME_RE.match(line) \
                and not NOT_TITLE_RE.match(line) and not re.search(r"exchange\s+commission", line, re.I) \
                and ORGANISATION_RE.search(line.split()[-1]) and not re.search(r"\d", line):
            return line.title() if line.isupper() else line
    return None


def _kind(cover: str, kinds: Mapping[str, Sequence[str]]) -> str | None:
    """The kind whose pattern matches first in the cover (a 10-Q's cover says "Form 10-Q" before it mentions the
    annual report); on a tie, the kind listed first."""
    best: tuple[int, int] | None = None
    chosen = None
    for order, (kind, patterns) in enumerate(kinds.items()):
        for pattern in patterns:
            match = re.search(pattern, cover, re.IGNORECASE | re.MULTILINE)
            if match and (best is None or (match.start(), order) < best):
                best, chosen = (match.start(), order), kind
    return chosen


def _is_title_text(text: str) -> bool:
    """A line that can be part of a title: words, not boilerplate, not a byline or an author list."""
    return (not NOT_TITLE_RE.match(text) and len(re.findall(r"[^\W\d_]{2,}", text)) >= 1
            and text.count(",") < 2 and not re.search(r"[^\W\d_]\d[,\s*†∗]|[∗†]", text)
            and not PERSON_AND_ROLE_RE.match(text))


def _cover_title(pages: Sequence[str]) -> str | None:
    """The first page's title block: its first heading, joined with the heading lines right under it (and with the
    line above when the heading goes on from it, in lower case); else its first line that reads as a title."""
    if not pages:
        return None
    raw = [line.strip() for line in pages[0].splitlines() if line.strip()]
    headings: list[str] = []
    level = 0
    for index, line in enumerate(raw[:40]):
        if not line.startswith("#"):
            if headings:
                break
            continue
        if headings and len(line) - len(line.lstrip("#")) != level:
            break  # a heading of another size starts what follows the title
        level = len(line) - len(line.lstrip("#"))
        text = _clean(line)
        if not _is_title_text(text) or DATE_RE.search(text):
            if headings:
                break
            continue
        if not headings and text[:1].islower() and index and _is_title_text(_clean(raw[index - 1])):
            headings.append(_clean(raw[index - 1]))
        headings.append(text)
        if len(" ".join(headings)) > 160:
            break
    if headings and len(re.findall(r"[^\W\d_]{2,}", " ".join(headings))) >= 2:
        title = _clean(" ".join(headings))
        if len(title.split()) <= 3 and GENERIC_TITLE_RE.fullmatch(title):
            # "User Guide", "Help Guide": the product or subject is on the lines around it
            start = raw.index(next(line for line in raw if _clean(line) == headings[0]))
            around = [_clean(line) for line in raw[max(0, start - 1):start] + raw[start + 1:start + 3]]
            extra = [line for line in around if _is_title_text(line) and len(line) <= 80 and not DATE_RE.search(line)
                     and not re.search(r"[.?!:]$", line)]
            title = _clean(" ".join([title, *extra]))
        return title
    for line in _lines(pages[0])[:12]:
        if (_is_title_text(line) and len(re.findall(r"[^\W\d_]{2,}", line)) >= 2 and len(line) <= 150
                and not DATE_RE.search(line) and not re.search(r"[.?!:]$", line)):
            return line
    return None


def _period(cover: str, kind: str | None) -> tuple[int | None, int | None, date | None, str | None]:
    """(year, quarter, period end, where it was found) from the cover."""
    ended = _date_after(cover, FISCAL_YEAR_ENDED_RE)
    if ended and kind != "quarterly report":
        return ended.year, None, ended, "cover: fiscal year ended"
    named = NAMED_QUARTER_RE.search(cover)
    period_end = _date_after(cover, PERIOD_ENDED_RE)
    if period_end and kind == "quarterly report":
        return period_end.year, (period_end.month - 1) // 3 + 1, period_end, "cover: period ended"
    if named:
        quarter = QUARTER_WORDS[named.group(1).lower()] if named.group(1) else int(named.group(3))
        year = int(named.group(2) or named.group(4))
        return year, quarter, period_end, "cover: named quarter"
    if period_end:
        quarter = (period_end.month - 1) // 3 + 1 if kind == "quarterly report" else None
        return period_end.year, quarter, period_end, "cover: period ended"
    if ended:
        return ended.year, None, ended, "cover: year ended"
    dated = _date_after(cover, DATED_RE)
    if dated:
        return dated.year, None, dated, "cover: dated"
    for match in DATE_RE.finditer(cover[:1500]):
        if (found := _date(match)) is not None:
            return found.year, None, found, "cover: first date"
    return None, None, None, None


def derive(metadata: Mapping[str, Any], pages: Sequence[str], rel_path: str,
           kinds: Mapping[str, Sequence[str]] | None = None) -> DocumentIdentity:
    """The document's identity from its PDF metadata (Title, Author, Company, Subject), the Markdown of its first
    pages and its path (see the module's head). Pure: the same input gives the same identity."""
    if kinds is None:  # imported here: label() serves processes that load no configuration (a service's client)
        from rag_pipeline.config import DEFAULT_DOCUMENT_KINDS

        kinds = DEFAULT_DOCUMENT_KINDS
    meta = {str(k).lower(): _clean(str(v)[:MAX_METADATA_CHARS]) for k, v in metadata.items() if v}
    cover_pages = [page[:COVER_CHARS] for page in pages[:COVER_PAGES]]
    lines = _lines("\n".join(cover_pages))
    cover = "\n".join(lines)
    flat = " ".join(lines)
    found: dict[str, str] = {}

    kind = _kind(cover, kinds)
    if kind:
        found["kind"] = "cover"
    else:  # what the metadata or the file name calls it ("User's Guide", "student_handbook_2020")
        for where, text in (("pdf metadata", " ".join(meta.get(k, "") for k in ("title", "subject"))),
                            ("file name", re.sub(r"[_\-.]+", " ", PurePosixPath(rel_path).stem))):
            if text.strip() and (kind := _kind(text, kinds)):
                found["kind"] = where
                break

    organisation = _registrant(lines)
    if organisation:
        found["organisation"] = "cover: registrant"
    else:
        for key in ("company", "author"):
            if looks_like_organisation(meta.get(key)):
                organisation, found["organisation"] = meta[key], f"pdf metadata: {key}"
                break
        else:
            cited = CITATION_RE.search(flat)
            publisher = next((part for part in (_clean(p) for p in re.split(r"[,:;“”\"]", cited.group("text")))
                              if looks_like_organisation(part)), None) if cited else None
            if publisher:
                organisation, found["organisation"] = publisher, "cover: citation"
            else:
                organisation = _copyright_holder(cover) or _organisation_line(lines)
                if organisation:
                    found["organisation"] = "cover"

    year, quarter, period_end, where = _period(flat, kind)
    if where:
        found["period"] = where
    else:
        stem_year = YEAR_RE.findall(PurePosixPath(rel_path).stem)
        if stem_year:
            year, found["period"] = int(stem_year[0]), "file name"

    if organisation:
        organisation = re.sub(r"[\s,]+(?:19|20)\d\d$", "", organisation)
    title = None
    cited = CITATION_RE.search(flat)
    quoted = QUOTED_RE.search(cited.group("text")) if cited else None
    if kind in FORM_LABELS and REGISTRANT_RE.search(cover):
        # a form's cover has no title of its own: it is the registrant's report for the period
        span = f" for fiscal year {year}" if year and not quarter else (f" for Q{quarter} {year}" if quarter else "")
        title = f"{organisation + ' ' if organisation else ''}{FORM_LABELS[kind]}{span}"
        found["title"] = "cover: form"
    elif looks_like_title(meta.get("title"), rel_path):
        title, found["title"] = meta["title"], "pdf metadata"
    elif quoted:
        title, found["title"] = _clean(quoted.group("title")), "cover: citation"
    elif (cover_title := _cover_title(cover_pages)) is not None and (
            not organisation or cover_title.lower() != organisation.lower()):
        title, found["title"] = cover_title, "cover"
    else:
        stem = re.sub(r"[_\-.]+", " ", PurePosixPath(rel_path).stem).strip()
        if len(re.findall(r"[^\W\d_]{3,}", stem)) >= 1:
            title, found["title"] = stem, "file name"
    # what steers a model has no place in every chunk's prefix: a field that reads as an injection is left out
    if title and injection_flags(title):
        title, found["title"] = None, "left out: reads as an instruction"
    if organisation and injection_flags(organisation):
        organisation, found["organisation"] = None, "left out: reads as an instruction"
    return DocumentIdentity(title, organisation, kind, year, quarter,
                            period_end.isoformat() if period_end else None, found)


def period_label(identity: Mapping[str, Any]) -> str | None:
    """"FY2015", "Q1 2021", "2016" (a dated report): how a period is said in a prefix or a result."""
    year, quarter = identity.get("year"), identity.get("quarter")
    if not year:
        return None
    if quarter:
        return f"Q{quarter} {year}"
    return f"FY{year}" if identity.get("kind") in FORM_LABELS else str(year)


LABEL_TITLE_WORDS = 16
LABEL_ORGANISATION_WORDS = 12  # a sidecar's organisation is not bounded otherwise
WORD_RE = re.compile(r"[^\W_]+")


def label(identity: Mapping[str, Any], fallback: str) -> str:
    """The document as a chunk's prefix names it, what matters most first (the prefix has a token budget and is
    shortened from its end): its organisation and period, then its title ("Walmart Inc. FY2020: annual report",
    "Pew Research Center 2016: Latinos Increasingly Confident in Personal Finances …"). A form's title, composed
    from these, gives way to its kind."""
    found = identity.get("found") or {}
    title = identity.get("kind") if found.get("title") == "cover: form" else identity.get("title")
    words = str(title or fallback).split()
    title = " ".join(words[:LABEL_TITLE_WORDS]) + (" …" if len(words) > LABEL_TITLE_WORDS else "")
    said = _as_words(title)
    organisation = " ".join(str(identity.get("organisation") or "").split()[:LABEL_ORGANISATION_WORDS])
    head = " ".join(value for value in (organisation, period_label(identity) or "")
                    if value and _as_words(value) not in said)
    return f"{head}: {title}" if head else title


# Where a title is the document's own word: its sidecar, its PDF metadata, a form's cover, a recommended citation.
# A title read from a cover's largest lines is wrong for about four in ten long documents (bench.retrieval
# --identity), and a wrong name in every chunk's prefix costs more than the file's own name does (docs/retrieval.md:
# "What a chunk's prefix names").
RELIABLE_TITLES = ("sidecar", "pdf metadata", "cover: form", "cover: citation")
HASH_NAME_RE = re.compile(r"[0-9a-f]{16,}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)


def file_name_words(rel_path: str) -> str | None:
    """A file's name as words ("User Manual 1500S Classic EN"), or None when it has none: a hash, a number."""
    stem = PurePosixPath(rel_path).stem
    if HASH_NAME_RE.fullmatch(stem):
        return None
    words = " ".join(stem.replace("_", " ").split())
    return words if re.search(r"[^\W\d_]{3,}", words) else None


def prefix_name(identity: Mapping[str, Any], rel_path: str) -> str:
    """The document as a chunk's prefix names it: label(), with the file's name in place of a title only guessed
    from the cover (a hash-named file keeps the guess: it is all there is). A file name that reads as an instruction
    is said nowhere: the prefix leads every chunk a model is given."""
    named = file_name_words(rel_path)
    if named and injection_flags(named):
        named = None
    if named and identity.get("title") and (identity.get("found") or {}).get("title") not in RELIABLE_TITLES:
        identity = {**identity, "title": named}
    stem = PurePosixPath(rel_path).stem
    return label(identity, named or ("" if injection_flags(re.sub(r"[\W_]+", " ", stem)) else stem))


def _as_words(text: str) -> str:
    """The text as its words in lower case, space-separated and space-bounded: one text "says" another when the
    other's words appear in it, whole ("Meta" is not said by "Metadata")."""
    return " " + " ".join(WORD_RE.findall(text.lower())) + " "
