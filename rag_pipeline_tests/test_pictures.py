"""Pictures found on a page from its own objects (rag_pipeline.parsing.pictures): images and vector drawings, the
words inside them and their captions; decorations, page-sized scans and ruled tables are not pictures."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from rag_pipeline.parsing.pictures import (
    MAX_CAPTION_CHARS,
    MAX_OBJECTS,
    MAX_PICTURE_CHARS,
    Picture,
    find_pictures,
    group_drawings,
    is_caption,
    page_pictures,
    picture_from_record,
    picture_record,
    region_pictures,
    without_furniture,
)
from rag_pipeline.text.chunking import Chunk
from rag_pipeline.text.figures import figure_chunks, figure_text
from rag_pipeline_tests.conftest import MMLONGBENCH, TORTURE, report_with_a_chart
from torture_set.generate import raster_screenshot

WIDTH, HEIGHT = 612.0, 792.0


def box(x0: float, top: float, x1: float, bottom: float, **extra) -> dict:
    return {"x0": x0, "top": top, "x1": x1, "bottom": bottom, **extra}


def word(text: str, x0: float, top: float) -> dict:
    return box(x0, top, x0 + 6 * len(text), top + 9, text=text)


def bar_chart(left: float = 100.0, top: float = 200.0) -> list[dict]:
    """A bar chart drawn as paths: two axes, ten bars, a tick on each bar."""
    axes = [box(left, top, left + 1, top + 200), box(left, top + 200, left + 300, top + 201)]
    bars = [box(left + 10 + 28 * i, top + 200 - 15 * (i + 1), left + 30 + 28 * i, top + 200) for i in range(10)]
    ticks = [box(left + 20 + 28 * i, top + 200, left + 21 + 28 * i, top + 204) for i in range(10)]
    return axes + bars + ticks


def test_a_drawn_chart_is_a_picture_with_its_words_and_its_caption():
    words = [word("Revenue", 110, 205), word("by", 160, 205), word("region", 180, 205),  # its title, inside
             word("North", 110, 385), word("South", 200, 385), word("42.5", 330, 260),
             word("Figure", 100, 430), word("3:", 140, 430), word("Revenue", 160, 430), word("per", 210, 430),
             word("region", 235, 430),
             word("Body", 100, 600), word("text", 140, 600), word("below.", 170, 600)]
    [picture] = find_pictures(4, WIDTH, HEIGHT, [], bar_chart(), words)
    assert (picture.page, picture.kind) == (4, "drawing")
    assert picture.box == (100.0, 200.0, 400.0, 404.0)
    assert picture.caption == "Figure 3: Revenue per region"
    assert "Revenue by region" in picture.text and "42.5" in picture.text
    assert "Body" not in picture.text


def test_decorations_scans_rules_icons_and_ruled_tables_are_not_pictures():
    icon = box(50, 50, 70, 70)  # 0.08% of the page
    scan = box(0, 0, WIDTH, HEIGHT)  # the page itself: OCR reads it
    rule = box(50, 400, 560, 410)  # a banner 51 times as wide as it is tall
    photo = box(100, 450, 400, 650)
    pictures = find_pictures(1, WIDTH, HEIGHT, [icon, scan, rule, photo], [], [])
    assert [(p.kind, p.box) for p in pictures] == [("image", (100.0, 450.0, 400.0, 650.0))]
    # a few strokes (an underline and a box) are no chart
    assert find_pictures(1, WIDTH, HEIGHT, [], bar_chart()[:5], []) == []
    # a grid the table finders read as a table is the table's, not a picture
    assert find_pictures(1, WIDTH, HEIGHT, [], bar_chart(), [], tables=[(95, 195, 405, 410)]) == []


def test_prose_that_refers_to_a_figure_is_no_caption_and_a_caption_set_close_under_it_is():
    chart = bar_chart()
    reference = [word("Figure", 100, 170), word("3-5", 140, 170), word("shows", 165, 170), word("the", 200, 170),
                 word("difference", 220, 170)]  # prose above, within the caption distance
    caption = [word("Figure", 100, 400), word("3-5", 140, 400), word("Special", 165, 400),
               word("registers", 215, 400), word("and", 275, 400), word("adopted", 300, 400),
               word("authority", 350, 400)]  # set across the chart's bottom edge (404), running on past its right
    [picture] = find_pictures(1, WIDTH, HEIGHT, [], chart, reference + caption)
    assert picture.caption == "Figure 3-5 Special registers and adopted authority"
    [picture] = find_pictures(1, WIDTH, HEIGHT, [], chart, reference)
    assert picture.caption is None
    # "Chart 2: Revenue" and a label with a title in lower case after its colon are captions; "Chart of accounts" is not
    assert is_caption("Chart 2: Revenue") and is_caption("Figure 1: overview") and is_caption("Fig. 2.1 Results")
    assert is_caption("Figure 3a: Distribution") and is_caption("Fig. 2b Results") and is_caption("Figure S1 Flow")
    assert not is_caption("Chart of accounts") and not is_caption("Figure 4 compares the two")
    assert not is_caption("Figure S1 shows the flow") and not is_caption("Figure 3a shows the flow")


def test_a_diagram_the_table_finders_read_as_a_grid_is_a_picture_when_its_caption_names_a_figure():
    grid = (95, 195, 405, 410)
    caption = [word("Figure", 100, 430), word("2", 140, 430), word("Data", 160, 430), word("flow", 195, 430)]
    [picture] = find_pictures(1, WIDTH, HEIGHT, [], bar_chart(), caption, tables=[grid])
    assert picture.caption == "Figure 2 Data flow"
    table_caption = [word("Table", 100, 430), word("2", 140, 430), word("Data", 160, 430), word("flow", 195, 430)]
    assert find_pictures(1, WIDTH, HEIGHT, [], bar_chart(), table_caption, tables=[grid]) == []
    # the caption of a figure set above the table, prose that names a figure under it, and a table's own header
    # row ("Exhibit No.") leave the grid the table's
    above = [word("Figure", 100, 170), word("1", 140, 170), word("Sales", 160, 170), word("by", 200, 170),
             word("year", 220, 170)]
    prose = [word("Figure", 100, 430), word("2", 140, 430), word("shows", 160, 430), word("the", 200, 430),
             word("flow", 230, 430)]
    header = [word("Exhibit", 100, 205), word("No.", 150, 205), word("Description", 180, 205)]
    for words in (above, prose, header):
        assert find_pictures(1, WIDTH, HEIGHT, [], bar_chart(), words, tables=[grid]) == [], words


@pytest.mark.torture
def test_a_real_manuals_diagrams_keep_their_captions_and_words():
    """IBM's Redbook (../shared/torture): a syntax diagram the table finder reads as a grid, a diagram of boxes
    under prose that names it ("Figure 3-5 shows …"), and a screenshot whose caption is set inside its margin."""
    from rag_pipeline.parsing.pdf import parse_pdf

    pages = {page.page: page for page in parse_pdf(TORTURE / "docs" / "docling_redp5110_sampled.pdf", None)}
    captions = {picture.caption: picture for number in (10, 11, 14) for record in pages[number].signals["pictures"]
                if (picture := picture_from_record(number, record))}
    assert "CREATE PERMISSION" in captions["Figure 3-1 CREATE PERMISSION SQL statement"].text
    assert "Owner = JOE" in captions["Figure 3-5 Special registers and adopted authority"].text
    assert "Figure 3-11 Selecting the EMPLOYEES table from System i Navigator" in captions
    # Table 3-1, a ruled table above prose that names Figure 3-5, stays a table: the diagram is page 11's one picture
    assert [p.caption for p in captions.values() if p.page == 11] == ["Figure 3-5 Special registers and adopted authority"]


def test_a_region_the_layout_model_calls_a_figure_is_a_picture_unless_one_found_already_covers_it():
    diagram = [word("Client", 120, 220), word("Gateway", 260, 220), word("Index", 400, 220),
               word("requests", 180, 260), word("queries", 330, 260)]  # boxes' labels, no drawing to group
    caption = [word("Figure", 120, 330), word("2:", 160, 330), word("Request", 180, 330), word("flow", 230, 330)]
    region = (110.0, 210.0, 460.0, 300.0)
    [picture] = region_pictures(3, WIDTH, HEIGHT, [region], diagram + caption)
    assert (picture.page, picture.kind, picture.box) == (3, "figure", region)
    assert picture.caption == "Figure 2: Request flow" and "Gateway" in picture.text
    found = Picture(3, "drawing", (100.0, 200.0, 450.0, 310.0), None, "")
    assert region_pictures(3, WIDTH, HEIGHT, [region], diagram, known=[found]) == []
    # a small image inside the region (a logo in the diagram) leaves the rest of its words to the region
    logo = Picture(3, "image", (115.0, 212.0, 165.0, 240.0), None, "")
    assert [p.box for p in region_pictures(3, WIDTH, HEIGHT, [region], diagram, known=[logo])] == [region]
    # an icon-sized region, one off the page and a page of no size add nothing
    assert region_pictures(3, WIDTH, HEIGHT, [(10.0, 10.0, 20.0, 20.0), (900.0, 900.0, 990.0, 990.0)], diagram) == []
    assert region_pictures(3, 0.0, HEIGHT, [region], diagram) == []
    assert picture_from_record(3, picture_record(picture)) == picture


def test_a_picture_repeated_at_the_same_place_on_many_pages_is_page_furniture():
    logo = [Picture(page, "image", (20.0, 20.0, 120.0, 60.0), None, "") for page in (1, 2, 3)]
    chart = Picture(2, "drawing", (100.0, 200.0, 400.0, 404.0), "Figure 1", "")
    assert without_furniture(logo + [chart]) == [chart]
    assert without_furniture(logo[:2] + [chart]) == logo[:2] + [chart]  # on two pages: could be a figure repeated


def test_grouping_is_transitive_and_bounded():
    left, right = bar_chart(50, 100), bar_chart(50, 450)
    groups = sorted(group_drawings([(b["x0"], b["top"], b["x1"], b["bottom"]) for b in left + right]))
    assert [count for _, count in groups] == [22, 22]
    # a page drawn with a hundred thousand tiny paths (a hostile or a hatched one) is grouped in bounded time
    hatch = [box(1 + (i % 300) * 2, 1 + (i // 300) * 2, 2 + (i % 300) * 2, 2 + (i // 300) * 2) for i in range(100_000)]
    started = time.perf_counter()
    pictures = find_pictures(1, WIDTH, HEIGHT, [], hatch, [])
    assert time.perf_counter() - started < 30
    assert len(pictures) <= 1 and MAX_OBJECTS < len(hatch)


def test_hostile_objects_neither_crash_nor_stall_the_search():
    inf = float("inf")
    broken = [box(0, 0, inf, 10), box(float("nan"), 5, 20, 30), {"x0": "x"}, box(1e9, 1e9, 2e9, 2e9)]
    assert find_pictures(1, WIDTH, HEIGHT, broken, broken + bar_chart(), [word("ok", 10, 10), box(inf, 0, 1, 1, text="x")])
    # thousands of images off the page or piled on it: bounded
    piles = [box(100 + (i % 50), 100, 300 + (i % 50), 300) for i in range(6000)]
    started = time.perf_counter()
    assert len(find_pictures(1, WIDTH, HEIGHT, piles, [], [word("a", 150, 150)] * 5000)) <= 100
    assert time.perf_counter() - started < 30
    assert find_pictures(1, float("nan"), HEIGHT, piles, [], []) == []


def test_a_page_sized_background_does_not_swallow_the_charts_drawn_on_it():
    background = box(0, 0, WIDTH, HEIGHT)
    [chart] = find_pictures(1, WIDTH, HEIGHT, [], [background] + bar_chart(), [])
    assert chart.box == (100.0, 200.0, 400.0, 404.0)


def test_furniture_is_matched_within_a_tolerance_not_a_rounding_bucket():
    logo = [Picture(page, "image", (20.9 + 0.2 * (page % 2), 20.0, 120.9, 60.0), None, "") for page in (1, 2, 3)]
    assert without_furniture(logo) == []


@pytest.mark.mmlongbench
def test_real_charts_keep_their_labels_and_numbers():
    """A Pew report's vector charts and a paper's plotted accuracy curve, read from the real PDFs."""
    import pdfplumber

    with pdfplumber.open(MMLONGBENCH / "pdfs" / "PP_2020.08.06_COVID-19-Restrictions_FINAL-1.pdf") as pdf:
        page = pdf.pages[7]
        pictures = page_pictures(page, 8)
    chart = next(p for p in pictures if p.kind == "drawing")
    assert "Major reason" in chart.text and "75" in chart.text.split()
    with pdfplumber.open(MMLONGBENCH / "pdfs" / "STEPBACK.pdf") as pdf:
        pictures = [p for number in (1, 2) for p in page_pictures(pdf.pages[number - 1], number)]
    assert any(p.caption and p.caption.startswith("Figure 2") for p in pictures)
    assert any(p.kind == "image" and p.page == 1 for p in pictures)


# --- pictures kept with their page, and chunked as figures ---------------------------------------------------------

def test_a_picture_survives_its_page_record_and_a_bad_record_is_skipped():
    chart = Picture(4, "drawing", (100.0, 200.0, 400.0, 404.0), "Figure 3: Revenue per region", "North South\n42.5")
    assert picture_from_record(4, picture_record(chart)) == chart
    long = Picture(1, "image", (1.0, 2.0, 3.0, 4.0), None, "word " * 5000)
    assert len(picture_record(long)["text"]) == MAX_PICTURE_CHARS
    for bad in (None, "chart", {"kind": "video", "box": [1, 2, 3, 4], "caption": None, "text": ""},
                {"kind": "image", "box": [1, 2, 3], "caption": None, "text": ""},
                {"kind": "image", "box": [1, 2, 3, float("nan")], "caption": None, "text": ""},
                {"kind": "image", "box": [1, 2, 3, 4], "caption": 7, "text": ""}):
        assert picture_from_record(1, bad) is None
    # what a PDF draws is untrusted: no NUL (jsonb refuses it), no terminal escapes, no unmapped glyphs
    hostile = Picture(1, "drawing", (1.0, 2.0, 3.0, 4.0), "Figure 1\x1b[2J" + "x" * 5000,
                      "Sales\x00 (cid:12)ﬁrst\ufffd")
    record = picture_record(hostile)
    assert record["text"] == "Sales first" and record["caption"].startswith("Figure 1[2J")
    assert len(record["caption"]) == MAX_CAPTION_CHARS


def _text_chunk(ordinal: int, page: int, section: str) -> Chunk:
    return Chunk(f"c{ordinal}", ordinal, "Some prose.", section, page, page, "text", 3, f"h{ordinal}")


def _words(text: str) -> int:
    return len(text.split())


def _first_words(text: str, tokens: int) -> str:  # as truncate_to_tokens cuts: only what is over
    return text if _words(text) <= tokens else " ".join(text.split()[:tokens])


def test_each_picture_that_says_something_is_a_figure_chunk_in_its_pages_section():
    chart = Picture(5, "drawing", (100.0, 200.0, 400.0, 404.0), "Figure 3: Revenue per region",
                    "Figure 3: Revenue per region\nRevenue by region\nNorth 42.5\nSouth 17.1")
    photo = Picture(6, "image", (100.0, 450.0, 400.0, 650.0), "Photo 1: the plant", "")  # its caption alone
    logo = [Picture(page, "drawing", (20.0, 20.0, 120.0, 60.0), None, "Acme Corp quality since 1900")
            for page in (1, 2, 3)]
    chunks = [_text_chunk(0, 1, "Overview"), _text_chunk(1, 4, "Results"), _text_chunk(2, 7, "Outlook")]
    [figure] = figure_chunks("doc", "v", [photo, *logo, chart], chunks, _words, _first_words, 100)
    assert figure.text == "Figure 3: Revenue per region\nRevenue by region\nNorth 42.5\nSouth 17.1"
    assert (figure.page_start, figure.page_end, figure.content_type) == (5, 5, "figure")
    assert figure.section_path == "Results"  # the page's section: the prefix keeps it whole
    assert figure.ordinal == 3 and figure.chunk_id not in {c.chunk_id for c in chunks}
    # the same pictures give the same chunk
    assert figure_chunks("doc", "v", [chart], chunks, _words, _first_words, 100) == [figure]
    [short] = figure_chunks("doc", "v", [chart], chunks, _words, _first_words, 8)
    assert short.text == "Figure 3: Revenue per region Revenue by region" and short.token_count == 8
    # a chart's title as its caption, or none: the chunk still says it is a figure
    titled = Picture(2, "drawing", chart.box, "Latino perceptions of finances", "60% 51 General public 43")
    assert figure_text(titled) == "Figure: Latino perceptions of finances\n60% 51 General public 43"
    assert figure_text(replace(titled, caption=None)) == "Figure\n60% 51 General public 43"
    assert figure_text(Picture(2, "image", chart.box, None, "two words")) is None


def test_a_chart_in_the_same_place_with_other_figures_on_every_page_is_no_furniture():
    deck = [Picture(page, "drawing", (50.0, 100.0, 550.0, 500.0), f"Slide {page}", f"Sales {page * 10} units west")
            for page in range(1, 6)]
    assert without_furniture(deck) == deck
    logo = [Picture(page, "image", (20.0, 20.0, 120.0, 60.0), None, "") for page in range(1, 200)]
    assert without_furniture(logo * 50) == []  # many at one place: bounded, and all furniture


@pytest.mark.mmlongbench
def test_parsing_keeps_a_real_reports_charts_with_their_pages():
    from rag_pipeline.parsing.pdf import parse_pdf

    pages = {page.page: page for page in parse_pdf(MMLONGBENCH / "pdfs" / "PH_2016.06.08_Economy-Final.pdf", None)}
    charts = [picture_from_record(9, record) for record in pages[9].signals["pictures"]]
    text = "\n".join(figure_text(chart) or "" for chart in charts if chart)
    assert "Latino perceptions of personal finances" in text and "General public" in text


@pytest.mark.mmlongbench
def test_a_page_the_layout_tier_reads_keeps_the_figures_its_model_finds():
    """A paper's page of plotted F1 scores: tier 1 reads its plots as a table and finds no picture; the page
    escalates to the layout tier, whose model calls the two rows of plots figures, kept with their words and caption."""
    from rag_pipeline.config import ParsingConfig
    from rag_pipeline.parsing.cascade import Cascade
    from rag_pipeline.parsing.pdf import parse_pdf

    path = MMLONGBENCH / "pdfs" / "2303.08559v2.pdf"
    [page] = [p for p in parse_pdf(path, None) if p.page == 19]
    assert not page.signals.get("pictures")
    [page] = Cascade(ParsingConfig()).run(path, [page])
    assert page.tier == "layout"
    figures = [picture_from_record(19, record) for record in page.signals["pictures"]]
    assert [p.kind for p in figures if p] == ["figure", "figure"]
    assert any(p and p.caption and p.caption.startswith("Figure 8: Relationship between demo number") and
               "Vicuna (13B)" in p.text for p in figures)


def test_a_drawn_chart_is_parsed_listed_and_indexed_as_a_figure_chunk(tmp_path, make_settings, db):
    import subprocess
    import sys

    from dagster import DagsterInstance

    from rag_pipeline.defs.runs import run_ingest
    from rag_pipeline.retrieval.search import search

    root = tmp_path / "reports"
    root.mkdir()
    report_with_a_chart(root / "plants.pdf")
    listed = subprocess.run([sys.executable, "-m", "rag_pipeline.cli", "parse", str(root / "plants.pdf")],
                            capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "picture 1: drawing at " in listed.stdout and "'Figure 1: Robots shipped by plant'" in listed.stdout
    settings = make_settings([{"name": "reports", "root": str(root), "acl_labels": ["staff"]}])
    with DagsterInstance.ephemeral() as instance:
        assert run_ingest(settings, instance=instance)["success"]
    [(text, section, page)] = db.execute(
        "SELECT text, section_path, page_start FROM chunks WHERE content_type = 'figure'").fetchall()
    assert text.startswith("Figure 1: Robots shipped by plant\n") and page == 1
    assert all(word in text.split() for word in ("Lyon", "Turin", "420", "310")) and "Our" not in text.split()
    assert text.split("\n")[1:] == ["420", "310", "260", "180", "Lyon Turin Graz Porto"]
    hits = search(db, "how many robots did the Turin plant ship", ["staff"], k=3)
    assert any(hit.content_type == "figure" and "Turin" in hit.text for hit in hits)

    # An index parsed before pictures were kept (rp8): the next refresh parses its PDFs again, once, and chunks
    # them for their figures; the unchanged text is not embedded again.
    db.execute("UPDATE documents SET parser_version = 'rp8;pdfplumber=0'")
    db.execute("UPDATE document_pages SET signals = signals - 'pictures'")
    db.execute("DELETE FROM chunks WHERE content_type = 'figure'")
    with DagsterInstance.ephemeral() as instance:
        again = run_ingest(settings, instance=instance)
    assert again["success"] and again["requeued_for_new_parser"] == 1 and again["documents_chunked"] == 1
    assert again["vectors_embedded"] == 0  # the text unchanged, the figure's input in the embedding cache
    assert db.execute("SELECT count(*) FROM chunks WHERE content_type = 'figure'").fetchone()[0] == 1
    with DagsterInstance.ephemeral() as instance:
        still = run_ingest(settings, instance=instance)
    assert still["requeued_for_new_parser"] == 0 and still["documents_chunked"] == 0


def test_a_raster_pictures_words_are_read_by_ocr_of_its_region(tmp_path):
    """A screenshot holds its words as pixels: OCR of its region puts them in its picture record (and so in its
    figure chunk), once, marked as read by OCR; without OCR, or with the reading off, it keeps none."""
    from rag_pipeline.config import ParsingConfig
    from rag_pipeline.parsing.cascade import Cascade, parse_document

    path = tmp_path / "app.pdf"
    raster_screenshot(path)  # the torture set's: a screenshot of a page's tabs pasted as an image
    [page] = parse_document(path, None, Cascade(ParsingConfig()))
    [record] = page.signals["pictures"]
    assert record["kind"] == "image" and record["text_read_by"] == "ocr"
    assert {"Home", "Features", "Started"} <= set(record["text"].split()), record["text"]
    assert "Features" not in page.markdown  # the page's own text is what its text layer says
    assert "Home" in (figure_text(picture_from_record(1, record)) or "")
    for config in (ParsingConfig(ocr_engine="none"), ParsingConfig(max_pictures_read=0)):
        [page] = parse_document(path, None, Cascade(config))
        [record] = page.signals["pictures"]
        assert record["text"] == "" and "text_read_by" not in record


def _cropped_page_with_a_black_box(path, rotate: int = 0) -> None:
    """A page whose CropBox is 36 points inside its MediaBox, with a black box drawn at known PDF coordinates."""
    from reportlab.lib.pagesizes import letter
    from reportlab.pdfgen import canvas

    pdf = canvas.Canvas(str(path), pagesize=letter)
    pdf.setCropBox((36, 36, 576, 756))
    if rotate:
        pdf.setPageRotation(rotate)
    pdf.rect(100, 400, 200, 100, fill=1)
    pdf.showPage()
    pdf.save()


def test_a_pictures_box_is_cut_from_the_rendered_page_where_it_is_drawn_whatever_the_cropbox(tmp_path):
    """pdfplumber measures a box from the MediaBox, pdfium renders the CropBox: the crop is shifted back, so what
    is sent to OCR or a model is the picture, not the prose beside it. A page turned by /Rotate is not cut."""
    import pdfplumber

    from rag_pipeline.parsing.cascade import PagePlacement, render_page

    path = tmp_path / "cropped.pdf"
    _cropped_page_with_a_black_box(path)
    with pdfplumber.open(path) as pdf:
        [rect] = pdf.pages[0].rects
        box = (rect["x0"], rect["top"], rect["x1"], rect["bottom"])
    image = render_page(path, 1, 72, None).convert("L")
    place = PagePlacement.of(path, 1, None, image.width)
    crop = place.crop(image, box)
    assert crop.size == (200, 100)
    assert sum(crop.getdata()) / (200 * 100) < 10  # all black: the box itself, not 36 points beside it
    _cropped_page_with_a_black_box(tmp_path / "turned.pdf", rotate=90)
    assert PagePlacement.of(tmp_path / "turned.pdf", 1, None, 720) is None


def test_a_picture_is_placed_on_a_page_whose_mediabox_it_inherits_from_the_page_tree(tmp_path):
    """A landscape A4 page whose MediaBox is set on its /Pages node (as some producers write it): pdfium's box getters
    read the page's own dictionary only and take it for US Letter; tier 1 records the box pdfplumber reads through
    the page tree, and pictures are cut from the rendering by that."""
    from rag_pipeline.config import ParsingConfig
    from rag_pipeline.parsing.cascade import PagePlacement, render_page
    from rag_pipeline.parsing.pdf import parse_pdf

    content = b"BT /F1 24 Tf 100 300 Td (Inherited box) Tj ET"
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               b"<< /Type /Pages /Kids [3 0 R] /Count 1 /MediaBox [0 0 842 595] >>",
               b"<< /Type /Page /Parent 2 0 R /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>",
               b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream",
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    pdf, offsets = bytearray(b"%PDF-1.4\n"), []
    for number, body in enumerate(objects, 1):
        offsets.append(len(pdf))
        pdf += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(pdf)
    pdf += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1) + b"".join(b"%010d 00000 n \n" % o for o in offsets)
    pdf += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    path = tmp_path / "inherited.pdf"
    path.write_bytes(bytes(pdf))
    [page] = list(parse_pdf(path, None))
    assert page.signals["crop_box"] == [0.0, 0.0, 842.0, 595.0]
    image = render_page(path, 1, 72, None, ParsingConfig().max_render_pixels)
    assert image.size == (842, 595)
    assert PagePlacement.of_page(page, image.width) == PagePlacement(1.0, 0.0, 0.0)


def test_a_page_that_cannot_be_rendered_loses_its_pictures_words_not_the_document(tmp_path, monkeypatch):
    from rag_pipeline.config import ParsingConfig
    from rag_pipeline.parsing import cascade
    from rag_pipeline.parsing.cascade import Cascade, parse_document

    path = tmp_path / "app.pdf"
    raster_screenshot(path)  # the torture set's: a screenshot of a page's tabs pasted as an image

    def broken(*args, **kwargs):
        raise RuntimeError("pdfium could not load the page")

    monkeypatch.setattr(cascade, "render_page", broken)
    [page] = parse_document(path, None, Cascade(ParsingConfig()))
    assert "connected app" in page.markdown and page.signals["pictures"][0]["text"] == ""
