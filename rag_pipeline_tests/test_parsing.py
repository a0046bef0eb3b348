import subprocess
import sys
from pathlib import Path

import pytest

from rag_pipeline.parsing.formats import parse_file
from rag_pipeline.parsing.pages import DeadLetter
from rag_pipeline.parsing.ruled_tables import table_to_markdown
from rag_pipeline_tests.conftest import MMLONGBENCH, SAMPLE_CORPUS, TORTURE

TORTURE_DOCS = TORTURE / "docs"


def test_pdf_pages_text_and_tables():
    pages = list(parse_file(SAMPLE_CORPUS / "finance" / "q3-report.pdf"))
    assert [p.page for p in pages] == [1, 2]
    assert all(p.tier == "pdfplumber" for p in pages)
    first = pages[0]
    assert first.tables == 1
    assert "| Segment | Q2 revenue (EUR m) | Q3 revenue (EUR m) | Change |" in first.markdown
    assert "| Welding arms | 28.4 | 26.1 | -8% |" in first.markdown
    assert first.signals["text_layer"] is True and first.signals["cid_glyphs"] == 0
    assert "Outlook" in pages[1].markdown


def test_table_markdown_pads_and_escapes():
    md = table_to_markdown([["a", "b|c"], ["1"], [None, None]])
    assert md.splitlines() == ["| a | b\\|c |", "|---|---|", "| 1 |  |"]


def test_docling_formats():
    docx = list(parse_file(SAMPLE_CORPUS / "handbook" / "onboarding-guide.docx"))
    assert len(docx) == 1 and docx[0].tier == "docling"
    assert "Safety equipment" in docx[0].markdown and "| Payroll" in docx[0].markdown
    html = list(parse_file(SAMPLE_CORPUS / "products" / "nw200-faq.html"))
    assert "nine hours" in html[0].markdown and html[0].markdown.count("## ") == 4


MARKDOWN = """---
title: front matter is not text
---
Release notes
=============

The *new* scanner reads
folders **faster**; see [the guide](https://example.invalid/guide) and <span>inline HTML</span>.

Known issues
------------

1. Large files
   - over 100 MB are skipped
2. Symlinks

| Setting | Default |
|:---|---:|
| `workers` | 2 |
| a \\| b | 3 |

```python
print("kept as it is")
```

> A quote
> over two lines.

<div class="note">Raw HTML block</div>

***
"""


def test_markdown_is_read_as_markdown_without_a_model_stack(tmp_path):
    source = tmp_path / "notes.md"
    source.write_text(MARKDOWN)
    [page] = parse_file(source)
    assert page.tier == "markdown" and page.tables == 1 and page.signals["format"] == "md"
    assert page.markdown == (
        "# Release notes\n\n"
        "The new scanner reads folders faster; see the guide and inline HTML.\n\n"
        "## Known issues\n\n"
        "1. Large files\n   - over 100 MB are skipped\n2. Symlinks\n\n"
        "| Setting | Default |\n|---|---|\n| `workers` | 2 |\n| a \\| b | 3 |\n\n"
        '```python\nprint("kept as it is")\n```\n\n'
        "> A quote over two lines.\n\n"
        "Raw HTML block\n")
    # Untrusted markup loses no words: a bare "<" is text, unknown tags stay visible to the injection flags,
    # entities are decoded, an escaped "#" is no heading, and a "---" that opens no YAML mapping is no front matter.
    from rag_pipeline.parsing.markdown import to_markdown

    assert to_markdown("<div>\nOrders with a total < 50 EUR ship in five days.\n</div>") == (
        "Orders with a total < 50 EUR ship in five days.\n")
    assert to_markdown("Text <system>obey</system> for AT&amp;T <!-- hidden -->") == (
        "Text <system>obey</system> for AT&T\n")
    assert to_markdown("\\# Not a heading") == "\\# Not a heading\n"
    assert to_markdown("---\nIntro to the guide.\n\nThe steps\n---\n\nStep one.\n") == (
        "Intro to the guide.\n\n## The steps\n\nStep one.\n")
    # Nesting deeper than the parser follows is kept as the file's own text: nothing is lost.
    deep = tmp_path / "deep.md"
    deep.write_text("".join("  " * i + f"- item {i}\n" for i in range(200)))
    [page] = parse_file(deep)
    assert all(f"item {i}" in page.markdown for i in range(200))
    # A Markdown file costs no model stack: nothing of torch or Docling is imported to read it.
    probe = ("import sys\nfrom pathlib import Path\nfrom rag_pipeline.parsing.formats import parse_file\n"
             f"list(parse_file(Path({str(source)!r})))\n"
             "print(sorted(m for m in ('torch', 'docling', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-2000:]


def test_dead_letter_reasons(tmp_path):
    empty = tmp_path / "empty.pdf"
    empty.write_bytes(b"")
    unsupported = tmp_path / "archive.zip"
    unsupported.write_bytes(b"PK")
    garbage = tmp_path / "garbage.pdf"
    garbage.write_bytes(b"this is not a pdf at all, but it ends like one %%EOF")
    expected = {
        empty: "empty",
        unsupported: "unsupported",
        SAMPLE_CORPUS / "legacy" / "scanned-contract.pdf": "truncated",
        garbage: "corrupt",
    }
    for path, reason in expected.items():
        with pytest.raises(DeadLetter) as caught:
            list(parse_file(path))
        assert caught.value.reason == reason, path


@pytest.mark.torture
def test_torture_encrypted_and_broken_files():
    encrypted = TORTURE_DOCS / "camelot_health_protected_encrypted.pdf"
    with pytest.raises(DeadLetter) as caught:
        list(parse_file(encrypted))
    assert caught.value.reason == "encrypted"
    pages = list(parse_file(encrypted, password="userpass"))
    assert pages and any(p.markdown.strip() for p in pages)
    for name, reason in [("pdfplumber_empty_0byte.pdf", "empty"), ("derived_fedreg_truncated40pct.pdf", "truncated")]:
        with pytest.raises(DeadLetter) as caught:
            list(parse_file(TORTURE_DOCS / name))
        assert caught.value.reason == reason


@pytest.mark.torture
def test_torture_office_formats_parse():
    pptx = list(parse_file(TORTURE_DOCS / "docling_powerpoint_sample.pptx"))
    assert [p.page for p in pptx] == [1, 2, 3]
    # each slide's speaker notes follow its content, said as such; a slide without notes has none
    assert pptx[1].markdown.endswith("\n\nSpeaker notes: Some notes on the second slide.")
    assert pptx[2].markdown.endswith("Speaker notes: Final notes on the third slide. Second line of notes.")
    assert "Speaker notes" not in pptx[0].markdown
    xlsx = list(parse_file(TORTURE_DOCS / "docling_xlsx_01.xlsx"))
    assert len(xlsx) == 4 and sum(p.tables for p in xlsx) >= 1


def test_text_files(tmp_path: Path):
    path = tmp_path / "notes.txt"
    path.write_bytes("caf\xe9 ok".encode("latin-1"))
    (page,) = parse_file(path)
    assert page.tier == "text" and page.markdown.startswith("caf")


@pytest.mark.torture
def test_three_column_pages_read_column_by_column_without_furniture():
    from rag_pipeline.text.cleaning import clean_document

    pages = list(parse_file(TORTURE_DOCS / "fedreg_2020-17221_3col.pdf"))
    assert pages[1].signals["columns"] == 3
    cleaned, removed = clean_document([p.markdown for p in pages])
    flat = [" ".join(page.split()) for page in cleaned]
    # A sentence that runs down the first column of page 2 comes out whole, not interleaved with column 2.
    assert "Investigation of the accident has been completed by the Indonesian authorities" in flat[1]
    assert "continued safe flight and landing" in flat[1]
    import re

    assert not any(re.search(r"Federal Register\s*/\s*Vol\. 85", page) for page in cleaned)
    assert removed["running_header_footer"] > 1000


def test_font_size_headings_become_markdown_headings():
    pages = list(parse_file(SAMPLE_CORPUS / "handbook" / "security-policy.pdf"))
    assert pages[0].markdown.splitlines()[1] == "## 1. Purpose and scope"
    assert pages[0].signals["headings"] == 1


def test_borderless_tables_are_found_only_where_they_look_like_data(tmp_path):
    from torture_set import generate

    generate.borderless_table(tmp_path / "table.pdf")
    (page,) = parse_file(tmp_path / "table.pdf")
    assert page.tables == 1
    assert "| Station | Altitude | Snow depth |" in page.markdown and "| Grindelwald | 1034 | 60 |" in page.markdown
    # Prose in two columns is not a table, however well its words line up.
    generate.two_columns(tmp_path / "prose.pdf")
    (prose,) = parse_file(tmp_path / "prose.pdf")
    assert prose.tables == 0


def test_right_to_left_paragraphs_come_out_in_logical_order(tmp_path):
    from torture_set.generate import RTL_PARAGRAPHS, rtl_paragraphs

    path = tmp_path / "rtl.pdf"
    rtl_paragraphs(path)
    [page] = parse_file(path)
    # Lines wrap where the PDF wrapped them; joined, each paragraph reads as written (numbers and Latin inside).
    flowing = " ".join(page.markdown.split())
    for paragraph in RTL_PARAGRAPHS:
        assert " ".join(paragraph.split()) in flowing
    assert page.signals["rtl_lines"] >= 5


def test_rtl_lines_unit():
    from rag_pipeline.parsing.rtl import logical_text

    visual = "ملاعلاب ابحرم"  # as a PDF's glyph positions give it
    assert logical_text(visual) == "مرحبا بالعالم"
    # A line of mostly Latin keeps its direction; the Arabic words inside it are put in order.
    assert logical_text(f"The greeting {visual} opens the letter") == "The greeting مرحبا بالعالم opens the letter"
    # A line of mostly Arabic reads right to left: what stands at its left edge comes last.
    assert logical_text(f"2023 {visual}") == "مرحبا بالعالم 2023"
    assert logical_text("## " + visual) == "## مرحبا بالعالم"  # the heading mark stays in front
    assert logical_text("| 2023 | " + visual + " |") == "| 2023 | مرحبا بالعالم |"  # cells stay in their columns
    assert logical_text("plain English (with brackets)") == "plain English (with brackets)"


@pytest.mark.torture
def test_mixed_scripts_page_has_arabic_in_logical_order():
    [page] = parse_file(TORTURE_DOCS / "pypdf_multilang.pdf")
    for expected in ("Hello World", "مرحبا بالعالم", "Привет, мир", "你好世界", "こんにちは世界"):
        assert expected in page.markdown


def test_filled_form_values_and_notes_become_text(tmp_path):
    from torture_set.generate import filled_form

    path = tmp_path / "form.pdf"
    truth = filled_form(path)
    [page] = parse_file(path)
    for line in truth["must_contain"]:
        assert line in page.markdown
    assert "relocation" not in page.markdown  # an unchecked box says nothing
    assert page.signals["form_fields"] == 4 and page.signals["annotations"] == 1


def test_hostile_annotation_dictionaries_are_bounded():
    from rag_pipeline.parsing.forms import MAX_VALUE_CHARS, annotation_lines

    parent: dict = {"T": b"outer"}
    node = parent
    for depth in range(100):  # a parent chain deeper than anything real
        node = {"T": f"n{depth}".encode(), "Parent": node}
    widget = dict(node, Subtype=_literal("Widget"), V=b"x" * 10_000)
    signature = {"Subtype": _literal("Widget"), "FT": _literal("Sig"), "T": b"sig", "V": {"Contents": b"\x00" * 99}}
    lines, stats = annotation_lines([widget, "not a dictionary", None, signature])  # type: ignore[list-item]
    assert stats == {"form_fields": 1, "annotations": 0}
    name, value = lines[0].removeprefix("Form field ").split(": ", 1)
    assert len(value) == MAX_VALUE_CHARS and name.count(".") < 20


def _literal(name: str):
    from pdfminer.psparser import LIT

    return LIT(name)


def _raw_pdf(objects: dict[int, bytes]) -> bytes:
    """A minimal PDF from numbered object bodies (object 1 the catalog), with a correct xref table."""
    out, offsets = bytearray(b"%PDF-1.4\n"), {}
    for number, body in objects.items():
        offsets[number] = len(out)
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    start, size = len(out), max(objects) + 1
    out += b"xref\n0 %d\n" % size
    for number in range(size):
        out += b"%010d 00000 n \n" % offsets[number] if number in offsets else b"0000000000 65535 f \n"
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (size, start)
    return bytes(out)


PAGE_WITH_ANNOTS = {
    1: b"<< /Type /Catalog /Pages 2 0 R >>",
    2: b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
    3: b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Annots [6 0 R] >>",
    4: b"<< /Length 0 >>\nstream\n\nendstream",
}


def test_form_widgets_without_a_type_and_shared_references_are_read_quickly(tmp_path):
    import time

    form = tmp_path / "form.pdf"
    form.write_bytes(_raw_pdf({**PAGE_WITH_ANNOTS,
                               5: b"<< /T (person) /Kids [6 0 R] /FT /Tx /V (Alice) >>",
                               6: b"<< /Subtype /Widget /Parent 5 0 R /T (first) /Rect [100 700 300 720] >>"}))
    [page] = parse_file(form)
    assert "Form field person.first: Alice" in page.markdown
    # An annotation whose key leads to arrays of 20 references to the next array, six deep: 64 million paths.
    chain = {10 + d: b"[" + b" ".join([b"%d 0 R" % (11 + d)] * 20) + b"]" for d in range(6)}
    shared = tmp_path / "shared.pdf"
    shared.write_bytes(_raw_pdf({**PAGE_WITH_ANNOTS, **chain, 16: b"(leaf)",
                                 6: b"<< /Type /Annot /Subtype /Text /Rect [100 700 300 720] /Contents (hi) /X 10 0 R >>"}))
    started = time.perf_counter()
    [page] = parse_file(shared)
    assert "Annotation: hi" in page.markdown and time.perf_counter() - started < 5


def test_escaped_pipes_in_rtl_table_cells():
    from rag_pipeline.parsing.rtl import logical_text

    assert logical_text("| א\\|ב | 12 |") == "| ב\\|א | 12 |"


def test_a_missing_font_package_is_a_named_skip_here_and_a_failure_in_ci(monkeypatch, tmp_path):
    """make test on a machine without the generated documents' fonts: skipped with the package named; in CI, which
    installs them, a failure."""
    from rag_pipeline_tests.conftest import skip_for_missing_package
    from torture_set import generate

    monkeypatch.setattr(generate, "WQY_MICROHEI", tmp_path / "absent.ttc")
    with pytest.raises(generate.MissingSystemPackage) as missing:
        generate.cjk_font_without_unicode_map(tmp_path / "cjk.pdf")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install fonts-wqy-microhei"):
        skip_for_missing_package(missing.value)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(generate.MissingSystemPackage):
        skip_for_missing_package(missing.value)


def test_words_set_apart_by_gaps_alone_are_read_as_words_and_overprinted_bold_once(tmp_path):
    """A pdfTeX-like text layer draws no spaces: its words are 0.2 em apart, under pdfplumber's 3-point tolerance."""
    from reportlab.pdfbase.pdfmetrics import stringWidth
    from reportlab.pdfgen import canvas

    def set_apart(pdf, x, y, words, font, size, word_gap, letter_gap=0.0):
        for word in words:
            for letter in word:
                pdf.setFont(font, size)
                pdf.drawString(x, y, letter)
                x += stringWidth(letter, font, size) + letter_gap * size
            x += (word_gap - letter_gap) * size

    body = "This is version 0.21 of the Shared MIME-info Database specification".split()
    tracked = "ANNUAL REVIEW".split()
    path = tmp_path / "pdftex.pdf"
    pdf = canvas.Canvas(str(path))
    set_apart(pdf, 72, 700, body, "Times-Roman", 10, word_gap=0.2)
    pdf.saveState()  # a sideways margin stamp drawn between the lines, as arXiv stamps a paper's first page
    pdf.translate(30, 300)
    pdf.rotate(90)
    pdf.drawString(0, 0, "arXiv:2312.09390v1 [cs.CL] 14 Dec 2023")
    pdf.restoreState()
    set_apart(pdf, 72, 680, ["I", "am", "a", "short", "line"], "Times-Roman", 10, word_gap=0.2)
    set_apart(pdf, 72, 660, tracked, "Helvetica-Bold", 12, word_gap=0.5, letter_gap=0.12)  # a tracked heading
    pdf.setFont("Helvetica", 10)
    pdf.drawString(72, 620, "A line that draws its own spaces stays as it is.")
    for offset in (0.0, 0.3, 0.6):  # bold faked by printing the line three times a hair apart
        pdf.drawString(72 + offset, 580, "Residential Home")
    pdf.showPage()
    pdf.save()

    [page] = parse_file(path)
    lines = page.markdown.splitlines()
    assert " ".join(body) in lines and "I am a short line" in lines
    assert any(line.lstrip("# ") == "ANNUAL REVIEW" for line in lines)  # letters apart, words whole
    assert "A line that draws its own spaces stays as it is." in lines and "Residential Home" in lines
    assert page.signals["word_gaps_spaced"] == len(body) - 1 + 4 and page.signals["overprinted_glyphs"] == 2 * len("Residential Home")


def test_word_gaps_put_no_space_between_chinese_characters_nor_inside_a_drawn_space():
    from rag_pipeline.parsing.word_gaps import word_gap_spaces

    def line(text, gap):
        x, out = 0.0, []
        for ch in text:
            out.append({"text": ch, "x0": x, "x1": x + 10, "top": 100.0, "bottom": 110.0, "size": 10.0})
            x += 10 + (gap if ch != " " else 0)
        return out

    assert word_gap_spaces(line("中文字符的句子", 1.5)) == []
    assert word_gap_spaces(line("a b c d", 0.0)) == []
    [(glyph, space)] = word_gap_spaces(line("wordsx", 0.0)[:3] + [dict(c, x0=c["x0"] + 2, x1=c["x1"] + 2)
                                                                 for c in line("wordsx", 0.0)[3:]])
    assert glyph["text"] == "r" and space["text"] == " " and (space["x0"], space["x1"]) == (30.0, 32.0)


def test_a_real_pdftex_manual_reads_as_words():
    """Debian's shared-mime-info specification, set by pdfTeX without space characters."""
    from torture_set.generate import MissingSystemPackage

    spec = Path("/usr/share/doc/shared-mime-info/shared-mime-info-spec.pdf")
    if not spec.exists():
        raise MissingSystemPackage(spec, "shared-mime-info")
    pages = list(parse_file(spec))
    first = pages[0]
    assert "This is version 0.21 of the Shared MIME-info Database specification" in first.markdown
    assert first.signals["word_gaps_spaced"] > 100
    # its example globs file opens with "# This file was automatically generated": text, not a heading
    lines = [line for page in pages for line in page.markdown.splitlines()]
    assert "\\# This file was automatically generated by the" in lines
    assert not [line for line in lines if line.startswith("# This file")]


def test_a_text_line_that_opens_as_markdown_is_escaped_unless_its_type_makes_it_a_heading(tmp_path):
    """A comment in a code listing, a quote mark or a pipe at the start of a line is text; a line set large is the
    page's heading; list marks and numbers are left to the chunker (list items and numbered headings)."""
    from reportlab.lib.pagesizes import letter
    from reportlab.pdfgen import canvas

    from rag_pipeline.text.chunking import sections_of

    lines = ["The configuration file reads as follows.", "# the cache directory", "cache_dir = /var/cache",
             "> not a quotation", "| not a table row", "#include <stdio.h>", "- an item", "1. Scope"]
    path = tmp_path / "listing.pdf"
    pdf = canvas.Canvas(str(path), pagesize=letter)
    pdf.setFont("Helvetica-Bold", 20)
    pdf.drawString(72, 720, "Installing the service")
    pdf.setFont("Courier", 10)
    for i, line in enumerate(lines):
        pdf.drawString(72, 690 - i * 14, line)
    pdf.showPage()
    pdf.save()
    [page] = parse_file(path)
    text = page.markdown.splitlines()
    assert text[0] == "# Installing the service"
    for escaped in ("\\# the cache directory", "\\> not a quotation", "\\| not a table row"):
        assert escaped in text
    for kept in ("#include <stdio.h>", "- an item", "1. Scope", "cache_dir = /var/cache"):
        assert kept in text
    sections = sections_of([(1, page.markdown)])
    titles = {title for section in sections for title in section.path}
    assert "Installing the service" in titles and not any("cache directory" in title for title in titles)


@pytest.mark.mmlongbench
def test_a_slide_read_by_ocr_that_opens_a_line_with_a_hash_names_no_section():
    """A SlideShare deck is pictures of slides, read by OCR: Caltrain's slide 18 lists "# train cars", "# people per
    car". Read as a heading, it named the section of every later slide; as text, no section at all."""
    from rag_pipeline.config import ParsingConfig
    from rag_pipeline.parsing.cascade import ocr_page
    from rag_pipeline.text.chunking import sections_of

    deck = MMLONGBENCH / "pdfs" / "caltraincapacitymountainview1-150701205750-lva1-app6891_95.pdf"
    text = ocr_page(deck, 18, ParsingConfig(), None)
    assert "\\# train cars" in text.splitlines()
    assert not [line for line in text.splitlines() if line.startswith("#")]
    assert all(not section.path for section in sections_of([(18, text)]))


def test_the_layout_tiers_text_that_opens_as_markdown_is_escaped():
    """In the regions the model finds, and in the words no region holds (a figure's)."""
    from rag_pipeline.parsing.layout import _unheld_blocks, _words_text

    words = [{"text": "#", "x0": 72.0, "x1": 78.0, "top": 100.0, "bottom": 110.0},
             {"text": "comment", "x0": 82.0, "x1": 130.0, "top": 100.0, "bottom": 110.0},
             {"text": "value", "x0": 72.0, "x1": 100.0, "top": 114.0, "bottom": 124.0}]
    assert _words_text(words).splitlines() == ["\\# comment", "value"]
    [(_, text)] = _unheld_blocks(words, [])
    assert text.splitlines() == ["\\# comment", "value"]


@pytest.mark.torture
def test_a_deck_parsed_before_its_notes_were_kept_is_parsed_again_once(tmp_path, make_settings, db):
    """A PPTX indexed by rp13, which left speaker notes out, is parsed again by the next refresh, and its notes are
    found by search; a Word file is not parsed again."""
    import shutil

    from dagster import DagsterInstance

    from rag_pipeline.defs.runs import run_ingest
    from rag_pipeline.retrieval.search import search

    root = tmp_path / "decks"
    root.mkdir()
    shutil.copy(TORTURE_DOCS / "docling_powerpoint_sample.pptx", root / "deck.pptx")
    shutil.copy(TORTURE_DOCS / "docling_word_sample.docx", root / "memo.docx")
    settings = make_settings([{"name": "decks", "root": str(root), "acl_labels": ["staff"]}])
    with DagsterInstance.ephemeral() as instance:
        assert run_ingest(settings, instance=instance)["success"]
    db.execute("UPDATE documents SET parser_version = 'rp13;pdfplumber=0'")
    with DagsterInstance.ephemeral() as instance:
        again = run_ingest(settings, instance=instance)
    assert again["success"] and again["requeued_for_new_parser"] == 1
    hits = search(db, "final notes on the third slide", ["staff"], k=3)
    assert hits and hits[0].page_start == 3 and "Speaker notes: Final notes" in hits[0].text


def test_a_hidden_slides_speaker_notes_are_left_out_with_it(tmp_path):
    from pptx import Presentation

    deck = Presentation()
    for number, hidden in ((1, False), (2, True)):
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        slide.shapes.title.text = f"Slide {number} title"
        slide.placeholders[1].text = f"Body of slide {number}"
        slide.notes_slide.notes_text_frame.text = f"Notes of slide {number}"
        if hidden:
            slide._element.set("show", "0")  # PowerPoint's "Hide slide"
    deck.save(tmp_path / "deck.pptx")
    pages = list(parse_file(tmp_path / "deck.pptx"))
    assert "Speaker notes: Notes of slide 1" in pages[0].markdown
    assert "slide 2" not in "\n".join(page.markdown for page in pages)
