"""Pictures on a PDF page, found from the page's own objects without a model: embedded images, and charts or
diagrams drawn with vector graphics (paths, rectangles, lines), each with the words drawn inside it and its caption.
A chart's axis titles, labels, legend and data labels are usually text in the PDF already; grouped by the picture
they belong to, they can be said together instead of scattered through the prose around them.

  * images: page.images of at least MIN_AREA_SHARE of the page, not a page-sized one (a scan's page image is the
    page itself, read by OCR), not a thin strip (a rule or a banner);
  * drawings: the page's curves, rectangles and lines, grouped where their boxes come within about GAP points
    of each other (on a grid of GAP-sized cells: up to three cells apart); a group of at least
    MIN_DRAWING_OBJECTS objects and MIN_AREA_SHARE of the page is a picture, unless it lies mostly inside a table
    the page's table finders found (a ruled grid is a table, not a picture);
  * decorations: a picture at the same place and size on REPEATED_PAGES pages or more is page furniture (a logo, a
    banner) and is dropped by `without_furniture`;
  * words: those whose middle lies in the picture's box or within WORD_MARGIN points of it (axis labels);
  * caption: the nearest line beginning "Figure 3", "Fig. 3", "Chart 2", "Exhibit 4", "Graph", "Diagram", "Map" or
    "Photo" within CAPTION_DISTANCE points above or below (not prose that refers to one: "Figure 3 shows …"), else
    such a line opening or closing the picture's own words, else a line of three words or more, not ending a
    sentence, within TITLE_DISTANCE points above (a chart's title);
  * a drawing the table finders read as a grid is the table's, unless the caption set under it names a numbered
    figure ("Figure 3-1 …": a diagram of boxes read as cells).
"""

from __future__ import annotations

import itertools
import math
import re
import unicodedata
from collections import defaultdict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from rag_pipeline.parsing.pages import ParsedPage

MIN_AREA_SHARE = 0.02  # of the page: an icon or a bullet glyph is no picture
MAX_AREA_SHARE = 0.9  # of the page: a page-sized image is a scan or a background
MAX_ASPECT = 12.0  # longer side over shorter: a rule, a banner, a colour bar
GAP = 6.0  # points between two drawing objects of one picture
MIN_DRAWING_OBJECTS = 8  # a box, an underline and an arrow are not a chart
TABLE_OVERLAP = 0.6  # share of a drawing inside a found table that makes it the table's grid
CAPTION_DISTANCE = 40.0  # points between a picture and its caption
TITLE_DISTANCE = 12.0  # points between a picture and the title line set right above it
# points around a picture's box whose words are its own: a chart's category and tick labels are set just outside
# the lines of its axes
WORD_MARGIN = 10.0
REPEATED_PAGES = 3
POSITION_TOLERANCE = 2.0  # points: the same place on another page
MAX_OBJECTS = 20_000  # a page drawn with more paths is grouped by its first ones only (bounded time)
MAX_IMAGES = 500  # images a page is searched for pictures among, the largest first
MAX_PICTURES = 100  # pictures kept from one page, the largest first
MAX_GRID = 400  # cells a side at most (a 612-point page at GAP has 102)
MAX_PICTURE_CHARS = 2000  # of a picture's words, kept with the page
MAX_CAPTION_CHARS = 300
MAX_DESCRIPTION_CHARS = 2000  # of a model's description of it
# what a picture's words may not carry into the page's signals: control characters (a NUL is refused by jsonb and
# would lose the document; an escape has no business on a terminal) and glyphs the font could not map
UNREADABLE_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ufffd]|\(cid:\d+\)")

CAPTION_WORDS = r"^\s*(?:figure|fig\.|chart|exhibit|graph|diagram|map|photo|illustration|plate)\s*"
CAPTION_RE = re.compile(CAPTION_WORDS + r"[\dIVXivx]*\b", re.IGNORECASE)
# The caption's label in full ("Figure 3-5", "Fig. 2.1", "Chart IV") and what follows it: a caption goes on with its
# title ("Figure 3-5 Special registers", "Figure 2: overview"); prose that refers to a figure goes on with a word in
# lower case ("Figure 3-5 shows the difference", "Chart of accounts").
# A label's number may carry a supplement's or an appendix's letter before it and a panel's after it ("Figure S1",
# "Figure A.2", "Figure 3a", "Fig. 2b").
CAPTION_LABEL_RE = re.compile(CAPTION_WORDS + r"(?:(?:[A-Z]\.?)?(?:\d+[a-z]?|[IVX]+\b)(?:[.\-\u2013][\dA-Za-z]+)*)?\s*(?P<rest>.*)$",
                              re.IGNORECASE)
# A caption that names a figure by number, set under it: the one thing that makes a drawing the table finders read
# as a grid a picture too (a diagram of boxes), where a table's own header ("Exhibit No.", "Map Reference") or the
# caption of a figure set above the table does not.
NUMBERED_FIGURE_RE = re.compile(r"^\s*(?:figure|fig\.|diagram)\s*(?:[A-Z]?\.?\d|[IVX]+\b)", re.IGNORECASE)

Box = tuple[float, float, float, float]  # x0, top, x1, bottom, in points from the page's top left
# an embedded image, a group of vector drawings, a region the layout model called a figure
KINDS = ("image", "drawing", "figure")


@dataclass(frozen=True)
class Picture:
    page: int  # 1-based
    kind: str  # one of KINDS
    box: Box
    caption: str | None
    text: str  # the words drawn inside the box, line by line
    description: str | None = None  # what a vision-language model said it shows (rag_pipeline.parsing.descriptions)


def _box(obj: dict[str, Any]) -> Box:
    return float(obj["x0"]), float(obj["top"]), float(obj["x1"]), float(obj["bottom"])


def _on_page(obj: dict[str, Any], width: float, height: float) -> Box | None:
    """The object's box clipped to the page, or None when it is off the page, empty or not finite (a PDF can draw
    at 1e400, which pdfplumber reads as infinity)."""
    try:
        x0, top, x1, bottom = _box(obj)
    except (KeyError, TypeError, ValueError):
        return None
    if not all(math.isfinite(v) for v in (x0, top, x1, bottom)):
        return None
    box = (max(min(x0, x1), 0.0), max(min(top, bottom), 0.0), min(max(x0, x1), width), min(max(top, bottom), height))
    return box if box[0] <= box[2] and box[1] <= box[3] else None


def _area(box: Box) -> float:
    return max(0.0, box[2] - box[0]) * max(0.0, box[3] - box[1])


def _overlap(a: Box, b: Box) -> float:
    return _area((max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])))


def _union(a: Box, b: Box) -> Box:
    return min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3])


def _shaped_like_a_picture(box: Box, page_area: float) -> bool:
    width, height = box[2] - box[0], box[3] - box[1]
    if width <= 0 or height <= 0:
        return False
    share = _area(box) / page_area
    return MIN_AREA_SHARE <= share <= MAX_AREA_SHARE and max(width, height) / min(width, height) <= MAX_ASPECT


def group_drawings(boxes: Sequence[Box], gap: float = GAP) -> list[tuple[Box, int]]:
    """Boxes that come within about `gap` of each other, grouped (transitively): each group's bounding box and how
    many boxes it holds. The boxes are drawn on a grid of `gap`-sized cells (each grown by half a gap on every side)
    and the grid's connected cells are the groups: time grows with the number of boxes and the page's cells, never
    with their product, however many paths a page draws."""
    if not boxes:
        return []
    gap = max(gap, 0.5)
    x_min = min(b[0] for b in boxes) - gap
    y_min = min(b[1] for b in boxes) - gap
    extent = max(max(b[2] for b in boxes) - x_min, max(b[3] for b in boxes) - y_min)
    cell = max(gap, extent / MAX_GRID)  # a page of absurd size is grouped coarser, not slower
    columns = int((max(b[2] for b in boxes) - x_min) / cell) + 3
    rows = int((max(b[3] for b in boxes) - y_min) / cell) + 3

    def cells(b: Box) -> tuple[int, int, int, int]:
        half = gap / 2
        return (min(max(int((b[1] - half - y_min) // cell), 0), rows - 1),
                min(max(int((b[3] + half - y_min) // cell), 0), rows - 1),
                min(max(int((b[0] - half - x_min) // cell), 0), columns - 1),
                min(max(int((b[2] + half - x_min) // cell), 0), columns - 1))

    spans = [cells(b) for b in boxes]
    # every box's cells marked at once: a difference array summed along both axes
    marks = np.zeros((rows + 1, columns + 1), dtype=np.int32)
    for r0, r1, c0, c1 in spans:
        marks[r0, c0] += 1
        marks[r0, c1 + 1] -= 1
        marks[r1 + 1, c0] -= 1
        marks[r1 + 1, c1 + 1] += 1
    occupied = marks.cumsum(axis=0).cumsum(axis=1)[:rows, :columns] > 0
    label = np.zeros((rows, columns), dtype=np.int32)
    next_label = 0
    for start in zip(*np.nonzero(occupied), strict=True):
        if label[start]:
            continue
        next_label += 1
        label[start] = next_label
        queue = deque([start])
        while queue:
            r, c = queue.popleft()
            for nr, nc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
                if 0 <= nr < rows and 0 <= nc < columns and occupied[nr, nc] and not label[nr, nc]:
                    label[nr, nc] = next_label
                    queue.append((nr, nc))
    groups: dict[int, tuple[Box, int]] = {}
    for b, (r0, _, c0, _) in zip(boxes, spans, strict=True):
        key = int(label[r0, c0])
        bounds, count = groups.get(key, (b, 0))
        groups[key] = (_union(bounds, b), count + 1)
    return list(groups.values())


def _lines(words: Iterable[dict[str, Any]]) -> list[tuple[Box, str]]:
    """Words as lines (by their tops, within 3 points), each line's box and text, top to bottom."""
    lines: list[list[dict[str, Any]]] = []
    for word in sorted(words, key=lambda w: (round(float(w["top"])), float(w["x0"]))):
        if lines and abs(float(lines[-1][0]["top"]) - float(word["top"])) <= 3:
            lines[-1].append(word)
        else:
            lines.append([word])
    out = []
    for line in lines:
        line.sort(key=lambda w: float(w["x0"]))
        box = _box(line[0])
        for w in line[1:]:
            box = _union(box, _box(w))
        out.append((box, " ".join(str(w["text"]) for w in line)))
    return out


def _inside(word: dict[str, Any], box: Box) -> bool:
    cx = (float(word["x0"]) + float(word["x1"])) / 2
    cy = (float(word["top"]) + float(word["bottom"])) / 2
    return box[0] <= cx <= box[2] and box[1] <= cy <= box[3]


def is_caption(line: str) -> bool:
    """A line that captions a picture ("Figure 3-5 Special registers", "Chart 2: Revenue", "Figure 4"), not prose
    that refers to one ("Figure 3-5 shows …")."""
    label = CAPTION_LABEL_RE.match(line) if CAPTION_RE.match(line) else None
    return label is not None and not label.group("rest")[:1].islower()


def _caption(box: Box, lines: Sequence[tuple[Box, str]], within: Sequence[str] = ()) -> str | None:
    """The nearest "Figure N" line above or below the box, else the first or last of the lines set `within` its
    margin when that is one (a caption set close under a picture), else a line set right above it (a chart's
    title)."""
    def distance(line_box: Box) -> float:
        return box[1] - line_box[3] if line_box[3] <= box[1] else line_box[1] - box[3]

    beside = [(distance(b), text) for b, text in lines
              if b[2] >= box[0] and b[0] <= box[2] and (b[3] <= box[1] or b[1] >= box[3])
              and 0 <= distance(b) <= CAPTION_DISTANCE]
    captions = sorted((d, text) for d, text in beside if is_caption(text))
    if captions:
        return captions[0][1].strip()
    for text in [*within[-1:], *within[:1]]:
        if is_caption(text):
            return text.strip()
    above = sorted((box[1] - b[3], text) for b, text in lines
                   if b[3] <= box[1] and box[1] - b[3] <= TITLE_DISTANCE and b[2] >= box[0] and b[0] <= box[2])
    if above and len(above[0][1].split()) >= 3 and not above[0][1].rstrip().endswith((".", ",", ";", ":")):
        return above[0][1].strip()
    return None


class _PageWords:
    """A page's words, placed and set in lines once, for the words and caption of each picture on it."""

    def __init__(self, words: Iterable[dict[str, Any]], width: float, height: float):
        self.placed = [w for w in itertools.islice(words, MAX_OBJECTS) if _on_page(w, width, height) is not None]
        self.lines = _lines(self.placed)

    def inside(self, box: Box) -> list[str]:
        around = (box[0] - WORD_MARGIN, box[1] - WORD_MARGIN, box[2] + WORD_MARGIN, box[3] + WORD_MARGIN)
        return [text for _, text in _lines([w for w in self.placed if _inside(w, around)])]

    def caption(self, box: Box) -> str | None:
        # the page's whole lines set within the picture's margin: a caption there may run on past its box
        within = [t for b, t in self.lines if b[2] >= box[0] and b[0] <= box[2]
                  and box[1] - WORD_MARGIN <= (b[1] + b[3]) / 2 <= box[3] + WORD_MARGIN]
        return _caption(box, [(b, t) for b, t in self.lines if _overlap(b, box) == 0], within)

    def names_a_figure_below(self, box: Box) -> bool:
        """The first line set under the box (its middle below the box's bottom, within CAPTION_DISTANCE) captions
        a numbered figure (NUMBERED_FIGURE_RE)."""
        below = sorted((b[1], t) for b, t in self.lines if b[2] >= box[0] and b[0] <= box[2]
                       and (b[1] + b[3]) / 2 > box[3] and b[1] - box[3] <= CAPTION_DISTANCE)
        return bool(below) and bool(NUMBERED_FIGURE_RE.match(below[0][1])) and is_caption(below[0][1])

    def picture(self, page_number: int, kind: str, box: Box) -> Picture:
        return Picture(page_number, kind, tuple(round(v, 1) for v in box),  # type: ignore[arg-type]
                       self.caption(box), "\n".join(self.inside(box)))


def _valid_page(width: float, height: float) -> bool:
    return math.isfinite(width) and math.isfinite(height) and width > 0 and height > 0


def find_pictures(page_number: int, width: float, height: float, images: Sequence[dict[str, Any]],
                  drawings: Sequence[dict[str, Any]], words: Sequence[dict[str, Any]],
                  tables: Sequence[Box] = ()) -> list[Picture]:
    """The pictures of one page from pdfplumber's objects: `images` (page.images), `drawings` (page.curves + rects +
    lines), `words` (extract_words) and the boxes of the tables found on it. Pure and bounded: the same objects give
    the same pictures; objects off the page or not finite are ignored, page-sized drawings (backgrounds) are not
    grouped, at most MAX_OBJECTS drawing objects and MAX_IMAGES images are considered and MAX_PICTURES kept."""
    if not _valid_page(width, height):
        return []
    page_area = width * height
    page_words = _PageWords(words, width, height)
    candidates: list[tuple[str, Box]] = []
    image_boxes = [b for b in (_on_page(i, width, height) for i in images) if b and _shaped_like_a_picture(b, page_area)]
    candidates += [("image", b) for b in sorted(image_boxes, key=_area, reverse=True)[:MAX_IMAGES]]
    boxes = [b for b in itertools.islice((_on_page(d, width, height) for d in drawings), MAX_OBJECTS)
             if b and _area(b) <= MAX_AREA_SHARE * page_area]
    for box, count in group_drawings(boxes):
        if count < MIN_DRAWING_OBJECTS or not _shaped_like_a_picture(box, page_area):
            continue
        # a drawing the table finders read as a grid is the table's, unless the caption under it names a figure
        # (a diagram of boxes and arrows read as cells)
        if (any(_overlap(box, table) >= TABLE_OVERLAP * _area(box) for table in tables)
                and not page_words.names_a_figure_below(box)):
            continue
        candidates.append(("drawing", box))
    # an image inside a drawing (a photo in a framed panel) is one picture: the larger box
    kept: list[tuple[str, Box]] = []
    for kind, box in sorted(candidates, key=lambda c: -_area(c[1])):
        if len(kept) == MAX_PICTURES:
            break
        if not any(_overlap(box, other) >= 0.8 * _area(box) for _, other in kept):
            kept.append((kind, box))
    return [page_words.picture(page_number, kind, box) for kind, box in sorted(kept, key=lambda c: (c[1][1], c[1][0]))]


def region_pictures(page_number: int, width: float, height: float, regions: Sequence[Box],
                    words: Sequence[dict[str, Any]], known: Sequence[Picture] = ()) -> list[Picture]:
    """Pictures at the regions a layout model calls figures (rag_pipeline.parsing.layout), kind `figure`: a diagram
    set as words and a few strokes, which no image or group of drawings makes, has its words and caption kept as
    any picture's. A region shaped like no picture, or one mostly covered by a picture `known` already (found from
    the page's objects), adds nothing."""
    if not _valid_page(width, height):
        return []
    page_area = width * height
    page_words = _PageWords(words, width, height)
    out: list[Picture] = []
    for region in itertools.islice(regions, MAX_PICTURES):
        box = _on_page({"x0": region[0], "top": region[1], "x1": region[2], "bottom": region[3]}, width, height)
        if box is None or not _shaped_like_a_picture(box, page_area):
            continue
        if any(_overlap(box, other.box) >= 0.5 * _area(box) for other in [*known, *out]):
            continue  # mostly a picture found already (a region holding a small image is not)
        out.append(page_words.picture(page_number, "figure", box))
    return out


def without_furniture(pictures: Sequence[Picture], repeated_pages: int = REPEATED_PAGES) -> list[Picture]:
    """The pictures less those drawn at the same place and size (within POSITION_TOLERANCE points) with the same
    words on `repeated_pages` pages or more (a logo, a banner, a page frame). A chart in the same place on every
    page of a deck, with other figures each time, stays."""
    def cell(p: Picture) -> tuple[int, ...]:
        return tuple(int(v // POSITION_TOLERANCE) for v in p.box)

    by_cell: dict[tuple[int, ...], list[Picture]] = defaultdict(list)
    for picture in pictures:
        by_cell[cell(picture)].append(picture)

    def repeated(picture: Picture) -> bool:
        home, pages = cell(picture), set()
        for offset in itertools.product((-1, 0, 1), repeat=4):
            for other in by_cell.get(tuple(c + o for c, o in zip(home, offset, strict=True)), ()):
                if other.text == picture.text and all(abs(a - b) <= POSITION_TOLERANCE
                                                      for a, b in zip(picture.box, other.box, strict=True)):
                    pages.add(other.page)
                    if len(pages) >= repeated_pages:
                        return True  # bounded: no need to count further
        return False

    return [p for p in pictures if not repeated(p)]


def pictures_kept(pages: Sequence[ParsedPage]) -> list[tuple[ParsedPage, int, Picture]]:
    """The pictures the records of `pages` hold, page furniture left out, each with its page and its index in the
    page's `pictures` record list (where what is learnt of it later goes: OCR'd words, a description)."""
    found = [(page, index, picture) for page in pages
             for index, record in enumerate(page.signals.get("pictures") or [])
             if (picture := picture_from_record(page.page, record)) is not None]
    kept = {id(picture) for picture in without_furniture([picture for _, _, picture in found])}
    return [item for item in found if id(item[2]) in kept]


def page_pictures(page: Any, page_number: int, tables: Sequence[Box] = (),
                  words: Sequence[dict[str, Any]] | None = None) -> list[Picture]:
    """find_pictures() over a pdfplumber page (`words`: its extract_words(), when already read)."""
    if words is None:
        words = page.extract_words(keep_blank_chars=False, use_text_flow=False)
    return find_pictures(page_number, float(page.width), float(page.height), page.images,
                         list(page.curves) + list(page.rects) + list(page.lines), words, tables)


def _readable(text: str, limit: int) -> str:
    return unicodedata.normalize("NFKC", UNREADABLE_RE.sub("", text[:4 * limit]))[:limit]


def picture_record(picture: Picture) -> dict[str, Any]:
    """A picture as a page's signals keep it (JSON): its words and caption in NFKC, without control characters or
    unmapped glyphs, cut to MAX_PICTURE_CHARS and MAX_CAPTION_CHARS."""
    caption = _readable(picture.caption, MAX_CAPTION_CHARS).strip() if picture.caption else None
    record = {"kind": picture.kind, "box": list(picture.box), "caption": caption or None,
              "text": _readable(picture.text, MAX_PICTURE_CHARS)}
    if picture.description:  # only then: a parse without a model keeps the records it always had
        record["description"] = _readable(picture.description, MAX_DESCRIPTION_CHARS).strip() or None
    return record


def picture_from_record(page: int, record: Any) -> Picture | None:
    """A stored picture_record() again, or None when it is not one (a page parsed by another version)."""
    if not isinstance(record, dict):
        return None
    kind, box, caption, text = (record.get(key) for key in ("kind", "box", "caption", "text"))
    description = record.get("description")
    if (kind not in KINDS or not isinstance(box, list) or len(box) != 4
            or not all(isinstance(v, int | float) and math.isfinite(v) for v in box)
            or not isinstance(text, str) or not (caption is None or isinstance(caption, str))
            or not (description is None or isinstance(description, str))):
        return None
    return Picture(page, kind, tuple(float(v) for v in box), caption, text, description)  # type: ignore[arg-type]
