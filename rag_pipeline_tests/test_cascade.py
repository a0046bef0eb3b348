"""The parser cascade: structural check, per-page escalation, tier availability, the `parse` CLI."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rag_pipeline.config import ParsingConfig, VlmConfig
from rag_pipeline.parsing.cascade import Cascade, escalation_reason, parse_document
from rag_pipeline.parsing.formats import parse_file
from rag_pipeline.text.cleaning import clean_parsed_pages
from rag_pipeline_tests.chat_server import FakeChatServer
from rag_pipeline_tests.conftest import MMLONGBENCH, SAMPLE_CORPUS, TORTURE

SCANNED = TORTURE / "docs" / "docling_ocr_test_scanned.pdf"


def test_structural_check():
    config = ParsingConfig()
    good = {"chars": 2000, "image_coverage": 0.1, "bad_glyph_ratio": 0.0, "ragged_table_ratio": 0.0}
    assert escalation_reason(good, config) is None
    assert escalation_reason({**good, "chars": 0, "image_coverage": 0.9}, config) == "image_only"
    assert escalation_reason({**good, "chars": 0, "image_coverage": 0.0}, config) is None  # a blank page
    assert escalation_reason({**good, "bad_glyph_ratio": 0.2}, config) == "glyph_failure"
    assert escalation_reason({**good, "ragged_table_ratio": 0.8}, config) == "table_structure"
    strict = ParsingConfig(max_bad_glyph_ratio=0.0)
    assert escalation_reason({**good, "bad_glyph_ratio": 0.01}, strict) == "glyph_failure"
    assert escalation_reason({**good, "invisible_ratio": 0.3}, config) is None  # counted, hidden text dropped
    assert escalation_reason({**good, "invisible_ratio": 0.9}, config) == "invisible_text"


def test_hidden_text_is_never_extracted_and_a_lying_ocr_layer_loses_to_the_image(tmp_path):
    from torture_set import generate

    truth = generate.hidden_text(tmp_path / "hidden.pdf")
    (page,) = parse_file(tmp_path / "hidden.pdf")
    assert generate.HIDDEN_INSTRUCTION not in page.markdown and "Aletsch glacier" in page.markdown
    assert page.signals["invisible_chars"] >= len(generate.HIDDEN_INSTRUCTION.replace(" ", ""))
    assert 0 < page.signals["invisible_ratio"] < 0.5 and truth["absent"] == [generate.HIDDEN_INSTRUCTION]

    generate.lying_ocr_layer(tmp_path / "scan.pdf")
    (tier_one,) = parse_file(tmp_path / "scan.pdf")
    assert tier_one.signals["invisible_ratio"] == 1.0 and "9999" not in tier_one.markdown
    (page,) = parse_document(tmp_path / "scan.pdf", None, Cascade(ParsingConfig()))
    assert page.tier == "ocr" and "1250" in page.markdown and "9999" not in page.markdown


def test_a_scan_stamped_with_a_line_of_text_is_read_by_ocr_and_words_over_a_photograph_keep_their_layer(tmp_path):
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.utils import ImageReader
    from reportlab.pdfgen import canvas

    from torture_set import generate

    truth = generate.stamped_scan(tmp_path / "stamped.pdf")
    (tier_one,) = parse_file(tmp_path / "stamped.pdf")
    assert tier_one.signals["chars"] > ParsingConfig().min_chars_per_page  # more than an empty scan's threshold
    assert escalation_reason(tier_one.signals, ParsingConfig()) == "thin_text_layer"
    (page,) = parse_document(tmp_path / "stamped.pdf", None, Cascade(ParsingConfig()))
    assert page.tier == "ocr" and page.signals["escalation"] == "thin_text_layer"
    assert "jointly request an extension" in page.markdown and len(page.markdown) > 3 * tier_one.signals["chars"]
    assert truth["text"].startswith("Dear Judge")

    # A brochure's page: a photograph over the whole page, its words in the text layer. OCR reads no more than
    # the layer holds, so the layer stays, and the reading tried is on record.
    from PIL import Image

    photo = Image.linear_gradient("L").resize((600, 850)).convert("RGB")
    words = ["Study at the business school", "Four years in the heart of the city", "Apply by the first of March"]
    pdf = canvas.Canvas(str(tmp_path / "brochure.pdf"), pagesize=A4)
    pdf.drawImage(ImageReader(photo), 0, 0, width=A4[0], height=A4[1])
    pdf.setFont("Helvetica-Bold", 20)
    for i, line in enumerate(words):
        pdf.drawString(60, 700 - i * 40, line)
    pdf.showPage()
    pdf.save()
    (brochure,) = parse_document(tmp_path / "brochure.pdf", None, Cascade(ParsingConfig()))
    assert brochure.tier == "pdfplumber" and brochure.signals["escalation"] == "thin_text_layer"
    assert [a["outcome"] for a in brochure.signals["attempts"]] == ["no more than the text layer"]
    assert all(line in brochure.markdown for line in words)
    assert escalation_reason({"chars": 900, "image_coverage": 1.0}, ParsingConfig()) is None  # a full text layer


def test_font_without_unicode_map_escalates_and_rotation_is_honoured(tmp_path):
    from torture_set import generate

    generate.font_without_unicode_map(tmp_path / "nomap.pdf")
    (tier_one,) = parse_file(tmp_path / "nomap.pdf")
    assert tier_one.signals["cid_glyphs"] > 0 and "Aletsch" not in tier_one.markdown
    (page,) = parse_document(tmp_path / "nomap.pdf", None, Cascade(ParsingConfig()))
    assert page.tier == "ocr" and page.signals["escalation"] == "glyph_failure"
    assert "Aletsch glacier" in page.markdown
    # Where no tier can read them (no OCR here), the unmapped glyphs are removed and counted, never indexed.
    (unread,) = parse_document(tmp_path / "nomap.pdf", None, Cascade(ParsingConfig(ocr_engine="none")))
    removed = clean_parsed_pages([unread])
    assert "(cid:" not in unread.markdown and "\ufffd" not in unread.markdown
    assert unread.signals["unmapped_glyphs_removed"] == tier_one.signals["cid_glyphs"] > 0
    assert removed["unmapped_glyphs"] > 0
    # One word of unmapped glyphs below the share threshold still escalates: the page is read by a tier that can.
    # Isolated ones (symbol-font bullets) do not: cleaning removes them, and OCR would read the page worse.
    assert tier_one.signals["unmapped_run"] >= 2
    word = {"chars": 500, "cid_glyphs": 4, "unmapped_run": 4, "bad_glyph_ratio": 0.008}
    assert escalation_reason(word, ParsingConfig()) == "glyph_failure"
    assert escalation_reason({**word, "unmapped_run": 1}, ParsingConfig()) is None

    generate.rotated_page(tmp_path / "rotated.pdf")
    (page,) = parse_file(tmp_path / "rotated.pdf")
    assert page.signals["rotation"] == 90
    assert " ".join(page.markdown.split()) == " ".join(generate.SURVEY)


def test_text_layer_pages_stay_in_tier_one():
    cascade = Cascade(ParsingConfig())
    pages = parse_document(SAMPLE_CORPUS / "finance" / "q3-report.pdf", None, cascade)
    assert [p.tier for p in pages] == ["pdfplumber", "pdfplumber"]
    assert not any("escalation" in p.signals for p in pages)


@pytest.mark.torture
def test_image_only_page_is_read_by_ocr_and_docling_absence_is_reported():
    cascade = Cascade(ParsingConfig())
    (page,) = parse_document(SCANNED, None, cascade)
    assert page.tier == "ocr" and page.signals["escalation"] == "image_only"
    text = " ".join(page.markdown.split())
    assert "Docling bundles PDF document conversion to JSON and Markdown" in text
    assert page.signals["attempts"][-1]["outcome"] == "ok"
    glyphs = Cascade(ParsingConfig(docling_artifacts_path="/nonexistent/models", ocr_engine="none"))
    unresolved = glyphs._escalate(SCANNED, page, "glyph_failure", None)
    assert unresolved.signals["unresolved"] is True
    assert "not found at /nonexistent/models" in glyphs.unavailable["docling"]
    assert [a["outcome"] for a in unresolved.signals["attempts"]] == ["unavailable", "unavailable", "unavailable"]


@pytest.mark.torture
def test_vision_language_model_tier_over_http_with_a_page_budget():
    server = FakeChatServer()
    try:
        vlm = VlmConfig(endpoint=server.url, model="vlm-test", page_budget=1, max_retries=0)
        cascade = Cascade(ParsingConfig(ocr_engine="none", vlm=vlm))
        (page,) = parse_document(SCANNED, None, cascade)
        assert page.tier == "vlm" and page.markdown.startswith("# Transcribed page")
        assert server.images == 1 and server.bodies[-1]["model"] == "vlm-test"
        (again,) = parse_document(SCANNED, None, cascade)  # the budget of one page is spent
        assert again.tier == "pdfplumber" and again.signals["unresolved"]
        assert "budget" in cascade.unavailable["vlm"]
        assert server.images == 1
        cascade.close()
    finally:
        server.stop()


def test_parse_cli_contract(tmp_path):
    cli = [sys.executable, "-m", "rag_pipeline.cli", "parse"]
    ok = subprocess.run([*cli, str(SAMPLE_CORPUS / "finance" / "q3-report.pdf"), "--json"],
                        capture_output=True, text=True, cwd=tmp_path, timeout=120)
    report = json.loads(ok.stdout)
    assert report["status"] == "ok" and report["reason"] is None and report["parser_version"]
    first = report["pages"][0]
    assert {"page", "tier", "signals", "markdown", "tables", "seconds"} <= set(first)
    assert first["page"] == 1 and first["tier"] == "pdfplumber" and first["tables"] == 1
    broken = subprocess.run([*cli, str(SAMPLE_CORPUS / "legacy" / "scanned-contract.pdf"), "--json"],
                            capture_output=True, text=True, cwd=tmp_path, timeout=120)
    report = json.loads(broken.stdout)
    assert report["status"] == "dead_letter" and report["reason"] == "truncated" and report["pages"] == []
    assert broken.returncode == 1 and ok.returncode == 0  # a dead letter is a failure to the shell

    # As text: each page's tier, signals and Markdown, as the README promises; a dead letter exits 1 there too.
    text = subprocess.run([*cli, str(SAMPLE_CORPUS / "finance" / "q3-report.pdf")], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert text.returncode == 0, text.stderr[-2000:]
    assert text.stdout.startswith("=== page 1: tier pdfplumber, ")
    signals = next(line for line in text.stdout.splitlines() if line.startswith("signals: "))
    # the page's pictures are listed each on a line of its own, after its Markdown
    listed = {key: value for key, value in first["signals"].items() if key != "pictures"}
    assert json.loads(signals.removeprefix("signals: ")) == json.loads(json.dumps(listed, default=str))
    assert first["markdown"].strip() in text.stdout
    dead = subprocess.run([*cli, str(SAMPLE_CORPUS / "legacy" / "scanned-contract.pdf")], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120)
    assert dead.returncode == 1 and "dead letter (truncated)" in dead.stdout


def test_scans_turned_sideways_or_upside_down_are_read_upright(tmp_path):
    from rag_pipeline.parsing.cascade import ocr_page
    from torture_set.generate import ROTATED_SCANS, rotated_scans

    path = tmp_path / "turned.pdf"
    rotated_scans(path)
    for number, (turned, _, lines) in enumerate(ROTATED_SCANS, start=1):
        text = ocr_page(path, number, ParsingConfig(), None)
        assert text.split("\n") == lines, f"page turned by {turned}: {text!r}"


def test_spanning_cells_of_the_table_model_fill_their_columns_and_header_rows_merge():
    from rag_pipeline.parsing.layout import html_table_rows

    markup = ("<table><tr><td rowspan='2'>Offense</td><td colspan='2'>Male</td><td>Female</td></tr>"
              "<tr><td>Total</td><td>Minors</td><td>Total</td></tr>"
              "<tr><td>Robbery</td><td>90.0</td><td>22.9</td><td>12.1</td></tr>"
              "<tr><td>Arson</td><td>8.1</td><td></td><td>1.7</td></tr></table>")
    assert html_table_rows(markup) == [
        ["Offense", "Male Total", "Male Minors", "Female Total"],
        ["Robbery", "90.0", "22.9", "12.1"],
        ["Arson", "8.1", "", "1.7"],
    ]
    assert html_table_rows("<table><tr><td colspan='999999'>x</td></tr></table>") == [["x"] * 50]  # bounded


@pytest.mark.torture
def test_layout_tier_reads_borderless_tables_offline():
    import csv

    from rag_pipeline.parsing.cascade import layout_page
    from torture_set.harness import markdown_tables, table_cell_recall

    truth_dir = TORTURE / "groundtruth" / "camelot_12s0324_borderless_2tables"
    truth = [list(csv.reader(p.read_text(encoding="utf-8").splitlines())) for p in sorted(truth_dir.glob("*.csv"))]
    markdown = layout_page(TORTURE / "docs" / "camelot_12s0324_borderless_2tables.pdf", 1, ParsingConfig(), None)
    tables = markdown_tables(markdown)
    assert len(tables) == 2
    assert table_cell_recall(tables, truth) >= 0.8
    assert "Table 324. Arrests by Sex and Age: 2009" in markdown  # its caption, read from the text layer


@pytest.mark.torture
def test_the_layout_tier_reads_a_page_whose_cropbox_is_not_its_mediabox_as_it_reads_the_page_itself(tmp_path):
    """A printer's PDF draws on a larger MediaBox and shows its CropBox: the rendering is of the CropBox, pdfplumber
    measures words from the MediaBox. The same page drawn with 100 points of margin outside its CropBox reads the
    same, and its figures come back where pdfplumber measures them."""
    import pypdfium2 as pdfium

    from rag_pipeline.parsing.cascade import layout_page

    original = TORTURE / "docs" / "camelot_12s0324_borderless_2tables.pdf"
    framed = tmp_path / "framed.pdf"
    pdf = pdfium.PdfDocument(str(original))
    page = pdf[0]
    left, bottom, right, top = page.get_mediabox()
    page.set_mediabox(left - 100, bottom - 60, right + 40, top + 80)
    page.set_cropbox(left, bottom, right, top)
    pdf.save(str(framed))
    pdf.close()
    expected = layout_page(original, 1, ParsingConfig(), None)
    assert "|" in expected and layout_page(framed, 1, ParsingConfig(), None) == expected


def _page_drawn_elsewhere(source: Path, index: int, out: Path, dx: float, dy: float) -> None:
    """The page `index` of `source` drawn dx, dy points away from the origin, its MediaBox moved with it: it
    renders the same, while pdfplumber measures its words dx points further right (x as the PDF says it)."""
    import pypdfium2 as pdfium

    original, moved = pdfium.PdfDocument(str(source)), pdfium.PdfDocument.new()
    width, height = original[index].get_size()
    drawing = original.page_as_xobject(index, moved).as_pageobject()
    drawing.transform(pdfium.PdfMatrix().translate(dx, dy))
    page = moved.new_page(width + dx, height + dy)
    page.insert_obj(drawing)
    page.gen_content()
    page.set_mediabox(dx, dy, dx + width, dy + height)
    moved.save(str(out))
    moved.close()
    original.close()


@pytest.mark.torture
@pytest.mark.mmlongbench
def test_the_layout_tier_reads_a_page_drawn_away_from_the_origin_as_the_page_itself(tmp_path):
    """The tier renders the page and measures its words as pdfplumber does, in two frames: a page whose MediaBox
    starts at x = 200 reads the same, and the figures its model finds come back where pdfplumber measures them."""
    import pdfplumber

    from rag_pipeline.parsing.cascade import layout_reading

    for source, index in ((TORTURE / "docs" / "camelot_12s0324_borderless_2tables.pdf", 0),
                          (MMLONGBENCH / "pdfs" / "2303.08559v2.pdf", 18)):
        alone, moved = tmp_path / f"alone-{source.name}", tmp_path / f"moved-{source.name}"
        _page_drawn_elsewhere(source, index, alone, 0, 0)
        _page_drawn_elsewhere(source, index, moved, 200, 100)
        with pdfplumber.open(alone) as a, pdfplumber.open(moved) as b:
            first, again = a.pages[0].extract_words()[0], b.pages[0].extract_words()[0]
        shift = (round(again["x0"] - first["x0"], 1), round(again["top"] - first["top"], 1))
        assert shift[0] == 200  # the frames differ, or the test tests nothing
        (expected, figures), (markdown, found) = (layout_reading(path, 1, ParsingConfig(), None)
                                                  for path in (alone, moved))
        assert "|" in expected and markdown == expected
        assert [p.box for p in found] == [tuple(round(v + shift[i % 2], 1) for i, v in enumerate(p.box))
                                          for p in figures]
    assert len(figures) == 2  # the paper's page: its two rows of plots


@pytest.mark.financebench
def test_the_layout_tier_reads_the_pages_of_one_open_filing_as_it_reads_each_alone():
    """A cascade keeps the file open for all the pages it escalates (opening a filing walks its whole page tree);
    nothing of one page may leak into the next."""
    from rag_pipeline.parsing.cascade import OpenPdf, layout_page
    from rag_pipeline_tests.conftest import FINANCEBENCH

    path = FINANCEBENCH / "pdfs" / "COCACOLA_2017_10K.pdf"
    opened = OpenPdf(path, None)
    try:
        together = [layout_page(path, number, ParsingConfig(), None, opened) for number in (60, 47, 121)]
    finally:
        opened.close()
    assert together == [layout_page(path, number, ParsingConfig(), None) for number in (60, 47, 121)]
    assert all("|" in markdown for markdown in together)  # each page's statement tables were read


@pytest.mark.torture
def test_the_layout_tier_reads_tier_ones_text_layer_as_it_reads_the_file(tmp_path, monkeypatch):
    """Tier 1 hands the layout tier the words it read (reading a filing page twice was half that tier's time): the
    same Markdown as reading the page again; the cascade reads no page twice; no page leaves parse_document holding
    words, and only a page the layout tier may read keeps them meanwhile."""
    from rag_pipeline.parsing import cascade
    from rag_pipeline.parsing.cascade import layout_may_read, layout_page

    path = TORTURE / "docs" / "camelot_12s0324_borderless_2tables.pdf"
    [page] = parse_file(path)
    assert page.text_layer is not None and len(page.text_layer.words) > 100
    assert layout_page(path, 1, ParsingConfig(), None, text_layer=page.text_layer) == layout_page(
        path, 1, ParsingConfig(), None)

    staggered = tmp_path / "staggered.pdf"
    _staggered_figures(staggered)
    from fpdf import FPDF

    plain, pdf = tmp_path / "plain.pdf", FPDF()
    pdf.add_page()
    pdf.set_font("Helvetica", size=11)
    pdf.multi_cell(0, 6, "Quarterly letter to shareholders. Nothing on this page is a table.")
    pdf.output(str(plain))
    def read_again(*args, **kwargs):
        raise AssertionError("the cascade read a page tier 1 had read")

    with monkeypatch.context() as patched:
        patched.setattr(cascade, "read_text_layer", read_again)
        for file, tier in ((staggered, "layout"), (plain, "pdfplumber")):
            [parsed] = parse_document(file, None, Cascade(ParsingConfig()))
            assert parsed.tier == tier and parsed.text_layer is None

    table_trouble, broken_glyphs = {"chars": 900, "stray_figure_rows": 5}, {"chars": 900, "bad_glyph_ratio": 0.5}
    assert cascade.escalation_reason(broken_glyphs, ParsingConfig()) == "glyph_failure"
    assert layout_may_read(table_trouble, ParsingConfig())
    assert not layout_may_read(broken_glyphs, ParsingConfig())  # Docling, OCR or a VLM: they read the file
    assert not layout_may_read(table_trouble, ParsingConfig(layout_engine="none"))


def _staggered_figures(path):
    """Rows of a label and figures whose columns do not line up (a table tier 1 cannot assemble)."""
    from fpdf import FPDF

    pdf = FPDF(format="A4")
    pdf.add_page()
    pdf.set_font("Helvetica", size=10)
    pdf.set_xy(20, 20)
    pdf.cell(0, 6, "Regional output, staggered as a careless export prints it")
    for row, (label, first, second) in enumerate([("North", "1,204", "1,310"), ("South", "988", "1,042"),
                                                  ("East", "2,431", "2,502"), ("West", "745", "790"),
                                                  ("Central", "1,876", "1,911")]):
        y = 40 + row * 8
        pdf.set_xy(20, y)
        pdf.cell(30, 6, label)
        pdf.set_xy(70 + row * 14, y)
        pdf.cell(20, 6, first)
        pdf.set_xy(140 + row * 9, y)
        pdf.cell(20, 6, second)
    pdf.output(str(path))


def test_figures_outside_any_table_escalate_to_the_layout_tier(tmp_path):
    path = tmp_path / "staggered.pdf"
    _staggered_figures(path)
    [page] = parse_file(path)
    assert page.signals["stray_figure_rows"] == 5 and page.tables == 0
    [escalated] = parse_document(path, None, Cascade(ParsingConfig()))
    assert escalated.signals["escalation"] == "table_structure"
    assert [a["tier"] for a in escalated.signals["attempts"]] == ["docling", "layout"]
    assert escalated.tier == "layout"
    for word in ("North", "1,204", "1,310", "Central", "1,911"):
        assert word in escalated.markdown  # the tier may misplace words, never drop them

    [off] = parse_document(path, None, Cascade(ParsingConfig(layout_engine="none")))
    assert off.signals["unresolved"] is True and off.tier == "pdfplumber"
    assert off.signals["attempts"][1] == {"tier": "layout", "outcome": "unavailable",
                                          "detail": "the layout tier is switched off (parsing.layout_engine: none)"}


def test_ocr_says_when_a_page_needs_a_script_its_models_do_not_read(tmp_path):
    from dataclasses import replace

    from rag_pipeline.parsing.fonts import unmapped_scripts
    from torture_set.generate import image_only

    assert unmapped_scripts([{"text": "(cid:52970)", "fontname": "ABCDEF+HYGoThic-Medium-UniKS-UCS2-H"},
                             {"text": "a", "fontname": "SimSun"}]) == ["Korean"]
    path = tmp_path / "scan.pdf"
    image_only(path)
    [page] = parse_file(path)
    page = replace(page, signals={**page.signals, "unmapped_scripts": ["Korean"]})
    escalated = Cascade(ParsingConfig())._escalate(path, page, "glyph_failure", None)
    ocr = [a for a in escalated.signals["attempts"] if a["tier"] == "ocr"][0]
    assert ocr["outcome"] == "ok" and "Korean" in ocr["detail"] and escalated.tier == "ocr"


def test_text_from_a_font_without_a_unicode_map_is_not_trusted_however_plausible(tmp_path):
    from torture_set.generate import CJK_LINES, cjk_font_without_unicode_map

    path = tmp_path / "cjk.pdf"
    cjk_font_without_unicode_map(path)
    [page] = parse_file(path)
    assert page.signals["unmapped_font_share"] == 1.0
    assert not any(line in page.markdown for line in CJK_LINES)  # Chinese characters, but not the ones drawn
    [read] = parse_document(path, None, Cascade(ParsingConfig()))
    assert read.signals["escalation"] == "glyph_failure" and read.tier == "ocr"
    assert read.markdown.split("\n") == CJK_LINES  # the OCR models read Chinese
