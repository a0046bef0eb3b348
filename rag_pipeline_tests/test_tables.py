"""Tables found by aligned figures (rag_pipeline.parsing.tables) on words placed by hand, and through the parser and
chunker on generated financial statements whose cells are known."""

from pathlib import Path

import pytest

from rag_pipeline.embedding.locations import load_tokenizer, resolve_model
from rag_pipeline.parsing.formats import parse_file
from rag_pipeline.parsing.tables import find_tables, is_figure
from rag_pipeline.text.chunking import TABLE_SEPARATOR_RE, Chunker
from rag_pipeline_tests.conftest import FINANCEBENCH, SAMPLE_CORPUS
from torture_set.generate import financial_statements
from torture_set.harness import markdown_tables, table_cell_f1, table_cell_recall

CHAR = 5.0  # width of one character of the hand-placed words, in points


def words_at(top: float, *placed: tuple[float, str]) -> list[dict]:
    """Words of one line: (x, phrase) pairs; a phrase's words are one space apart."""
    out = []
    for x, phrase in placed:
        for word in phrase.split(" "):
            out.append({"text": word, "x0": x, "x1": x + CHAR * len(word), "top": top, "bottom": top + 9})
            x += CHAR * (len(word) + 1)
    return out


def right(x1: float, text: str) -> tuple[float, str]:
    """A right-aligned figure ending at x1."""
    return x1 - CHAR * len(text), text


def test_figures_and_placeholders():
    for text in ("1,234", "(1,234)", "$4,512", "12.5%", "—", "(X)", "-0.3", "2023"):
        assert is_figure(text), text
    for text in ("Net", "1a", "Q3 sales", "abc123"):
        assert not is_figure(text), text


def test_lettered_footnote_markers_stay_with_their_figures_and_take_no_column():
    assert is_figure("444 (f)") and is_figure("— (c)") and is_figure("5,405 (c)(d)") and is_figure("(1)")
    assert not is_figure("(c)") and not is_figure("Deposits(a)") and not is_figure("1a (b)")
    lines = [
        words_at(10, right(180, "2022"), right(240, "2021")),
        words_at(22, (20, "Debt instruments"), right(170, "(1,255)"), (176, "(f)"), right(240, "444"), (246, "(c)")),
        words_at(34, (20, "Deposits(a)"), right(180, "382"), right(240, "(258)")),
        words_at(46, (20, "Other assets"), right(180, "—"), (186, "(c)(d)"), right(240, "(1)")),
    ]
    [table] = find_tables([w for line in lines for w in line])
    # Before, a marker ended the row's run of figures: the row's figures before it were read as its label.
    assert table.rows == [
        ["", "2022", "2021"],
        ["Debt instruments", "(1,255) (f)", "444 (c)"],
        ["Deposits(a)", "382", "(258)"],
        ["Other assets", "— (c)(d)", "(1)"],
    ]
    # A year that carries a marker still heads its column.
    lines = [
        words_at(10, right(180, "2022(a)"), right(240, "2021")),
        words_at(22, (20, "Coal"), right(180, "12.3"), right(240, "4.5")),
        words_at(34, (20, "Gas"), right(180, "8.1"), right(240, "2.0")),
    ]
    [table] = find_tables([w for line in lines for w in line])
    assert table.header_lines == 1 and table.rows[0] == ["", "2022(a)", "2021"]


@pytest.mark.financebench
def test_real_statements_keep_the_reading_whose_rows_hold_together():
    """NIKE's 10-K shades every other row of its statements: the grid pdfplumber cuts from the shading puts a
    row's label in one row and its figures in the next. The aligned reading of the same table is kept instead (it
    used to give way to any grid with as many columns), so the page needs no model tier. A JPMorgan row whose
    figures carry lettered footnote markers keeps every figure in its column."""
    import pdfplumber

    from rag_pipeline.config import ParsingConfig
    from rag_pipeline.parsing.ruled_tables import find_page_tables, ragged_ratio

    def row_of(file: str, page: int, label: str) -> tuple[list[str], float]:
        with pdfplumber.open(FINANCEBENCH / "pdfs" / file) as pdf:
            tables, _ = find_page_tables(pdf.pages[page - 1])
        [(row, ragged)] = [(r, ragged_ratio(t.rows)) for t in tables for r in t.rows if r and r[0] == label]
        return row, ragged

    row, ragged = row_of("NIKE_2018_10K.pdf", 23, "Cost of sales")
    assert [c for c in row[1:] if c] == ["20,441", "19,038", "7 %", "17,405", "9 %"]
    assert ragged <= ParsingConfig().max_ragged_table_ratio
    row, _ = row_of("JPMORGAN_2022Q2_10Q.pdf", 109, "Debt and equity instruments, excluding loans")
    assert row[1:] == ["(1,255)", "—", "(1,255)", "444 (f)", "(1) (c)", "443"]


def test_a_statement_is_one_table_with_its_header_of_periods_and_section_rows():
    lines = [
        words_at(10, (150, "Year Ended December 31,")),
        words_at(22, right(180, "2023"), right(240, "2022")),
        words_at(34, (20, "Operating activities:")),
        words_at(46, (30, "Net income"), (140, "$"), right(180, "4,512"), (200, "$"), right(240, "3,987")),
        words_at(58, (30, "Depreciation"), right(180, "1,203"), right(240, "1,150")),
        words_at(70, (30, "Deferred taxes"), right(180, "(88)"), right(240, "—")),
        words_at(82, (20, "Net cash from operations"), right(180, "5,627"), right(240, "5,137")),
        words_at(100, (20, "(1) Includes restricted cash.")),
    ]
    [table] = find_tables([w for line in lines for w in line])
    assert table.rows == [
        ["", "Year Ended December 31, 2023", "Year Ended December 31, 2022"],
        ["Operating activities:", "", ""],
        ["Net income", "$4,512", "$3,987"],
        ["Depreciation", "1,203", "1,150"],
        ["Deferred taxes", "(88)", "—"],
        ["Net cash from operations", "5,627", "5,137"],
    ]
    assert table.bbox[3] < 100  # the footnote stays text


def test_prose_with_numbers_is_not_a_table():
    lines = [words_at(10 + 12 * i, (20, f"Revenue grew {i + 2}% to $4,{i}12 million in 2023 as margins rose by 140"))
             for i in range(4)]
    assert find_tables([w for line in lines for w in line]) == []


def test_a_lone_row_of_figures_is_not_a_table_but_a_header_and_one_row_is():
    lone = words_at(10, (20, "Total"), right(180, "1,234"), right(240, "1,111"))
    assert find_tables(lone) == []
    with_header = words_at(0, right(180, "2023"), right(240, "2022")) + [dict(w, top=12, bottom=21) for w in lone]
    [table] = find_tables(with_header)
    assert table.rows == [["", "2023", "2022"], ["Total", "1,234", "1,111"]]


def test_group_headers_head_the_columns_beneath_them():
    lines = [
        words_at(0, (118, "Male"), (238, "Female")),
        words_at(12, right(120, "Total"), right(160, "Minors"), right(240, "Total"), right(280, "Minors")),
        words_at(24, (20, "Robbery"), right(120, "90.0"), right(160, "22.9"), right(240, "12.1"), right(280, "2.5")),
        words_at(36, (20, "Arson"), right(120, "8.1"), right(160, "3.7"), right(240, "1.7"), right(280, "0.6")),
    ]
    [table] = find_tables([w for line in lines for w in line])
    assert table.rows[0] == ["", "Male Total", "Male Minors", "Female Total", "Female Minors"]


@pytest.fixture(scope="module")
def statements(tmp_path_factory) -> tuple[list, dict]:
    path = tmp_path_factory.mktemp("statements") / "statements.pdf"
    truth = financial_statements(path)
    return list(parse_file(path)), truth


def test_generated_statements_are_whole_tables_with_headers_and_captions(statements):
    pages, truth = statements
    text = "\n\n".join(p.markdown for p in pages)
    tables = markdown_tables(text)
    assert len(tables) == 2 and all(len(t) >= 10 for t in tables)  # no one-row "tables" between the rules
    assert table_cell_f1(tables, truth["tables"]) >= 0.9
    assert table_cell_recall(tables, truth["tables"]) >= 0.95
    assert "Table: CONSOLIDATED STATEMENTS OF CASH FLOWS (In millions)" in text
    assert "Revenue grew 12% to $31,870 million" in text  # the prose before a statement stays prose
    assert all(p.signals["ragged_table_ratio"] == 0 for p in pages)  # section rows are not broken rows


def test_every_table_chunk_carries_its_caption_and_header_row(statements):
    pages, _ = statements
    chunker = Chunker(load_tokenizer(resolve_model("all-MiniLM-L6-v2").location), max_tokens=120)
    chunks = chunker.chunk("doc", [(p.page, p.markdown) for p in pages])
    table_chunks = [c for c in chunks if c.content_type == "table"]
    assert len(table_chunks) >= 4  # the statements are cut between rows
    for chunk in table_chunks:
        lines = chunk.text.split("\n")
        assert lines[0].startswith("Table: ") and "CONSOLIDATED" in lines[0], chunk.text
        assert TABLE_SEPARATOR_RE.match(lines[2]) and "December 31" in lines[1], chunk.text
        assert len(lines) >= 4  # a header and at least one row
    # the title block above a statement (its company's name, then its title) is its caption, on every piece
    cash_flows = [c for c in table_chunks if "CASH FLOWS" in c.text.split("\n")[0]]
    assert cash_flows and all(c.text.startswith("Table: ACME INDUSTRIES, INC. — CONSOLIDATED STATEMENTS OF CASH FLOWS")
                              for c in cash_flows)


@pytest.mark.torture
def test_torture_census_tables_cells_by_text():
    import csv

    from rag_pipeline_tests.conftest import TORTURE

    document = TORTURE / "docs" / "camelot_12s0324_borderless_2tables.pdf"

    truth_dir = TORTURE / "groundtruth" / "camelot_12s0324_borderless_2tables"
    truth = [list(csv.reader(p.read_text(encoding="utf-8").splitlines())) for p in sorted(truth_dir.glob("*.csv"))]
    tables = markdown_tables("\n\n".join(p.markdown for p in parse_file(Path(document))))
    assert len(tables) == 2
    assert table_cell_recall(tables, truth) >= 0.85


def _canvas_pdf(path, draw) -> Path:
    from reportlab.lib.pagesizes import letter
    from reportlab.pdfgen import canvas

    pdf = canvas.Canvas(str(path), pagesize=letter)
    draw(pdf, letter[1])
    pdf.showPage()
    pdf.save()
    return path


STATEMENT_ROWS = [("Revenue", "1,234", "1,100"), ("Cost of sales", "(500)", "(450)"), ("Gross profit", "734", "650"),
                  ("Net income", "300", "250")]


def _rows(pdf, y: float, step: float = 12) -> float:
    for label, first, second in STATEMENT_ROWS:
        pdf.drawString(72, y, label)
        pdf.drawRightString(400, y, first)
        pdf.drawRightString(480, y, second)
        y -= step
    return y


def test_rows_of_years_alone_are_text_not_a_table_nor_a_failure(tmp_path):
    def draw(pdf, height):
        pdf.drawString(72, 700, "Editions of the survey were published in these years:")
        for r, row in enumerate([("1998", "2001", "2004"), ("2007", "2010", "2013")]):
            for k, year in enumerate(row):
                pdf.drawString(100 + k * 80, 680 - r * 14, year)

    [page] = parse_file(_canvas_pdf(tmp_path / "years.pdf", draw))
    assert page.tables == 0 and "2007 2010 2013" in page.markdown


def test_a_paragraph_above_a_table_stays_text_and_headerless_tables_keep_an_empty_header(tmp_path):
    paragraph = [f"Line {i} of a paragraph about operating results that runs across the page, as prose does, and"
                 for i in range(6)]

    def draw(pdf, height):
        pdf.setFont("Helvetica", 9)
        y = height - 72
        for line in paragraph:
            pdf.drawString(72, y, line)
            y -= 12
        _rows(pdf, y)

    [page] = parse_file(_canvas_pdf(tmp_path / "caption.pdf", draw))
    assert "Table:" not in page.markdown
    for line in paragraph:
        assert line in page.markdown
    # Without a header the first row stays a row: the header line is empty, not "Revenue".
    assert "|  |  |  |\n|---|---|---|\n| Revenue | 1,234 | 1,100 |" in page.markdown


def test_a_heading_over_a_paragraph_over_a_table_stays_a_heading_and_text(tmp_path):
    paragraph = ["Deliveries rose by a fifth in the half year, carried by the new depot in the north and by two",
                 "contracts signed in the spring. Costs grew less than volumes, so the margin improved again."]

    def draw(pdf, height):
        pdf.setFont("Helvetica-Bold", 14)
        pdf.drawString(72, height - 72, "Half-year operations review")
        pdf.setFont("Helvetica", 10)
        y = height - 96
        for line in paragraph:
            pdf.drawString(72, y, line)
            y -= 13
        _rows(pdf, y - 14, 14)

    [page] = parse_file(_canvas_pdf(tmp_path / "review.pdf", draw))
    assert page.tables == 1 and "| Revenue | 1,234 | 1,100 |" in page.markdown
    assert "## Half-year operations review" in page.markdown.splitlines()
    assert "Table:" not in page.markdown  # the paragraph is the page's text, not the table's caption
    assert " ".join(paragraph) in " ".join(page.markdown.split())

    def titled(pdf, height):  # a title block right above the table is still its caption
        pdf.setFont("Helvetica-Bold", 11)
        pdf.drawString(72, height - 72, "CONSOLIDATED STATEMENTS OF INCOME")
        pdf.setFont("Helvetica", 9)
        pdf.drawString(72, height - 86, "(in thousands, except per share data)")
        pdf.setFont("Helvetica", 10)
        _rows(pdf, height - 110, 14)

    [page] = parse_file(_canvas_pdf(tmp_path / "titled.pdf", titled))
    assert "CONSOLIDATED STATEMENTS OF INCOME (in thousands, except per share data)" in page.markdown
    assert not page.markdown.startswith("#")


def test_the_sample_quarterly_report_keeps_its_heading():
    [first, _] = parse_file(SAMPLE_CORPUS / "finance" / "q3-report.pdf")
    assert first.markdown.startswith("## Q3 financial report\nRevenue grew seven percent")
    assert "Table:" not in first.markdown and first.tables == 1


def test_text_beside_a_table_is_kept(tmp_path):
    def draw(pdf, height):
        top = height - 150
        for r, (name, quantity) in enumerate([("Name", "Qty"), ("Apples", "12"), ("Pears", "7"), ("Plums", "30")]):
            pdf.drawString(80, top - r * 20 - 14, name)
            pdf.drawString(180, top - r * 20 - 14, quantity)
        for r in range(5):
            pdf.line(72, top - r * 20, 260, top - r * 20)
        for x in (72, 170, 260):
            pdf.line(x, top, x, top - 80)
        pdf.drawString(300, top - 20, "Shipments are counted at the dock")

    [page] = parse_file(_canvas_pdf(tmp_path / "side.pdf", draw))
    assert page.tables == 1 and "Shipments are counted at the dock" in page.markdown


def _sideways(pdf, x: float, y: float, text: str, font: str, size: float) -> None:
    """`text` running up the page from (x, y), as a margin stamp or a side tab is set."""
    pdf.saveState()
    pdf.translate(x, y)
    pdf.rotate(90)
    pdf.setFont(font, size)
    pdf.drawString(0, 0, text)
    pdf.restoreState()


def test_a_sideways_margin_stamp_joins_no_row(tmp_path):
    def draw(pdf, height):
        _sideways(pdf, 30, 250, "arXiv:2101.00001v1 [cs.CL] 1 Jan 2021", "Times-Roman", 20)
        pdf.setFont("Helvetica", 10)
        _rows(pdf, height - 300, 14)

    [page] = parse_file(_canvas_pdf(tmp_path / "stamp.pdf", draw))
    assert "| Revenue | 1,234 | 1,100 |" in page.markdown and "Table:" not in page.markdown


def test_a_page_framed_by_rules_is_prose_not_a_table_and_its_side_tab_is_no_heading(tmp_path):
    """A report's page drawn in a frame, its text box beside a side tab that runs up the margin: the rules make a
    grid, but no row of it sets two values side by side."""
    prose = [f"Paragraph line {i} of the report says what the rezoning did to the city." for i in range(12)]

    def draw(pdf, height):
        pdf.rect(40, 60, 520, 680)
        pdf.line(100, 60, 100, 740)  # the side tab's edge, the page's height
        pdf.line(40, 400, 100, 400)  # the tab's own box, in the margin only
        for i, line in enumerate(prose):
            pdf.drawString(110, 720 - i * 14, line)
        _sideways(pdf, 75, 100, "Rezoning and growth", "Helvetica-Bold", 18)

    [page] = parse_file(_canvas_pdf(tmp_path / "framed.pdf", draw))
    assert page.tables == 0 and page.signals["ruled_tables"] == 0
    assert all(line in page.markdown for line in prose) and "|" not in page.markdown
    assert not any(line.startswith("#") for line in page.markdown.splitlines())


COUNTRY_ROWS = [("Austria", "92.9", "7.1", "5,821"), ("Belgium", "0", "100.0", "5,906"),
                ("Cyprus", "100.0", "0", "17"), ("Denmark", "10.0", "77.9", "3,868"), ("Estonia", "86.8", "13.2", "114")]


def _country_table(pdf, top: float, rules: bool) -> None:
    """A header over four columns and a row per country; with `rules`, the way statistical yearbooks draw it: a
    frame, lines between the header's columns, then a rule under each row and none between the columns."""
    left, right, columns = 72.0, 480.0, (200.0, 300.0, 400.0)
    pdf.drawString(76, top - 12, "Country")
    for x, name in zip(columns, ("Home", "Abroad", "Cases"), strict=True):
        pdf.drawRightString(x + 80, top - 12, name)
    if rules:
        pdf.rect(left, top - 16, right - left, 16)
        for x in columns:
            pdf.line(x, top, x, top - 16)
    y = top - 30
    for label, *figures in COUNTRY_ROWS:
        pdf.drawString(76, y, label)
        for x, figure in zip(columns, figures, strict=True):
            pdf.drawRightString(x + 80, y, figure)
        if rules:
            pdf.line(left, y - 4, right, y - 4)
        y -= 16
    if rules:
        pdf.line(left, top, left, y + 12)
        pdf.line(right, top, right, y + 12)


def test_a_grid_of_row_rules_alone_gives_way_to_the_aligned_reading_of_its_rows(tmp_path):
    """Rules under each row and none between the columns leave each row's words in one cell of the grid: the
    aligned reading of the same rows sets the figures in their columns."""
    def draw(pdf, height):
        _country_table(pdf, height - 100, rules=True)

    [page] = parse_file(_canvas_pdf(tmp_path / "row-rules.pdf", draw))
    [table] = markdown_tables(page.markdown)
    rows = {row[0]: row[1:] for row in table}
    assert rows["Austria"] == ["92.9", "7.1", "5,821"], page.markdown
    assert rows["Denmark"] == ["10.0", "77.9", "3,868"]


def test_a_line_naming_a_table_above_its_header_is_its_caption_not_a_header_line(tmp_path):
    def draw(pdf, height):
        pdf.drawString(76, height - 86, "Table 8.19  -  Campylobacter cases by country of origin, 2007")
        _country_table(pdf, height - 90, rules=False)

    [page] = parse_file(_canvas_pdf(tmp_path / "captioned.pdf", draw))
    [table] = markdown_tables(page.markdown)
    assert table[0] == ["Country", "Home", "Abroad", "Cases"], page.markdown
    assert "Table 8.19 - Campylobacter cases by country of origin, 2007" in " ".join(page.markdown.split())


def test_a_header_that_starts_with_note_or_a_word_after_table_stays_the_header(tmp_path):
    """Only a line that numbers a table ("Table 8.19") is a caption: a header that starts with "Note" (over a
    column of note references) or with "Table" and a word ("Table name") heads its columns."""
    def draw(pdf, height):
        pdf.drawString(76, height - 102, "Note")
        for x, name in zip((200.0, 300.0, 400.0), ("Home", "Abroad", "Cases"), strict=True):
            pdf.drawRightString(x + 80, height - 102, name)
        for i, (label, *figures) in enumerate(COUNTRY_ROWS):
            pdf.drawString(76, height - 120 - 16 * i, label)
            for x, figure in zip((200.0, 300.0, 400.0), figures, strict=True):
                pdf.drawRightString(x + 80, height - 120 - 16 * i, figure)

    [page] = parse_file(_canvas_pdf(tmp_path / "note-header.pdf", draw))
    [table] = markdown_tables(page.markdown)
    assert table[0] == ["Note", "Home", "Abroad", "Cases"], page.markdown


def test_a_fully_ruled_grid_with_two_lines_in_a_cell_keeps_its_cells(tmp_path):
    """Each figure over its share ("104" over "(1.0%)") in a grid ruled between every column: the aligned reading
    of the same words makes more, emptier rows; the grid holds each row whole and stays."""
    rows = [("Austria", "104", "(1.0%)", "12", "(0.1%)"), ("Belgium", "230", "(2.2%)", "31", "(0.3%)"),
            ("Cyprus", "17", "(0.2%)", "2", "(0.0%)"), ("Denmark", "388", "(3.7%)", "40", "(0.4%)")]
    left, columns, right = 72.0, (200.0, 300.0), 400.0

    def draw(pdf, height):
        top = height - 100
        pdf.drawString(76, top - 12, "Country")
        pdf.drawRightString(columns[0] + 90, top - 12, "Cases")
        pdf.drawRightString(columns[1] + 90, top - 12, "Deaths")
        edges = [top, top - 16]
        for i, (label, cases, share, deaths, death_share) in enumerate(rows):
            y = top - 30 - 30 * i
            pdf.drawString(76, y, label)
            for x, figure, part in ((columns[0], cases, share), (columns[1], deaths, death_share)):
                pdf.drawRightString(x + 90, y, figure)
                pdf.drawRightString(x + 90, y - 12, part)
            edges.append(y - 16)
        for y in edges:
            pdf.line(left, y, right, y)
        for x in (left, *columns, right):
            pdf.line(x, top, x, edges[-1])

    [page] = parse_file(_canvas_pdf(tmp_path / "stacked.pdf", draw))
    [table] = markdown_tables(page.markdown)
    assert page.signals["ruled_tables"] == 1, page.markdown
    assert ["Austria", "104 (1.0%)", "12 (0.1%)"] in table, page.markdown


def test_a_table_in_one_column_of_two_takes_nothing_from_the_other(tmp_path):
    left = "In this section we describe the method used to collect the data for every firm"

    def draw(pdf, height):
        pdf.setFont("Helvetica", 9)
        for i in range(30):
            pdf.drawString(50, 760 - i * 11, left[: 40 + i % 5])
            if i < 10 or i > 18:
                pdf.drawString(320, 760 - i * 11, "Right column prose continues here with words")
        for r, (a, b, c) in enumerate([("Sector", "2022", "2023"), ("Mining", "120", "131"), ("Retail", "340", "352"),
                                       ("Services", "980", "1,004"), ("Energy", "55", "61")]):
            y = 760 - (11 + r) * 11
            pdf.drawString(320, y, a)
            pdf.drawRightString(470, y, b)
            pdf.drawRightString(540, y, c)

    [page] = parse_file(_canvas_pdf(tmp_path / "columns.pdf", draw))
    [table] = markdown_tables(page.markdown)
    assert table[0] == ["Sector", "2022", "2023"] and ["Mining", "120", "131"] in table
    assert page.markdown.count(left[:40]) == 30  # every line of the other column is still text


def test_zero_height_words_and_hostile_pages_are_handled():
    flat = [dict(w, bottom=w["top"]) for w in words_at(10, (20, "Revenue"), right(180, "1,234"), right(240, "1,100"))
            + words_at(22, (20, "Net income"), right(180, "300"), right(240, "250"))
            + words_at(0, right(180, "2023"), right(240, "2022"))]
    [table] = find_tables(flat)
    assert table.rows == [["", "2023", "2022"], ["Revenue", "1,234", "1,100"], ["Net income", "300", "250"]]
    # Six thousand rows whose figures line up only loosely: the finder must not re-read the page per row (that
    # was minutes here); a generous bound, ten times what it takes.
    import time

    staggered = [w for i in range(6000) for w in words_at(i * 12.0, (10, "Row"), right(100 + (i % 97) * 40, "1,234"),
                                                           right(4100 + (i % 89) * 40, "5,678"))]
    started = time.perf_counter()
    find_tables(staggered)
    assert time.perf_counter() - started < 30


# Statement pages of real filings that the cascade sends to the layout-and-table tier (tables tier 1 broke).
STATEMENT_PAGES = (("JPMORGAN_2023Q2_10Q.pdf", (23, 28)), ("NIKE_2018_10K.pdf", (26,)),
                   ("AMERICANWATERWORKS_2021_10K.pdf", (55,)), ("COCACOLA_2017_10K.pdf", (121,)))


@pytest.mark.financebench
def test_the_vectorised_cell_matcher_assigns_every_word_as_rapid_tables_own_does(monkeypatch):
    """The layout tier reads tables with rapid-table's model and our matcher (its own was two thirds of the tier's
    time): on real statement tables, and on boxes built to tie, the two must give the same cells."""
    import numpy as np
    from rapid_table.table_matcher.matcher import TableMatch

    from rag_pipeline.config import ParsingConfig
    from rag_pipeline.parsing import table_matching
    from rag_pipeline.parsing.cascade import layout_page
    from rag_pipeline_tests.conftest import FINANCEBENCH

    compared = []

    def both(self, dt_boxes, pred_bboxes):
        theirs = TableMatch.match_result(TableMatch(), dt_boxes, pred_bboxes)
        compared.append((len(dt_boxes), theirs == table_matching.match_result(dt_boxes, pred_bboxes)))
        return theirs

    from rag_pipeline.parsing import layout

    monkeypatch.setattr(type(layout._table_engine().table_matcher), "match_result", both)
    for name, pages in STATEMENT_PAGES:
        for page in pages:
            layout_page(FINANCEBENCH / "pdfs" / name, page, ParsingConfig(), None)
    assert len(compared) >= 5 and sum(words for words, _ in compared) > 500
    assert all(same for _, same in compared)

    # Cells that tie on IoU and distance, 8-value cells, words outside every cell, one word and no cell.
    generator = np.random.default_rng(7)
    for _ in range(40):
        cells = generator.integers(0, 60, size=(generator.integers(1, 30), 4)).astype(np.float32)
        cells[:, 2:] += cells[:, :2] + 1
        cells[generator.integers(0, len(cells))] = cells[0]  # a duplicate cell: the first must win
        words = generator.integers(0, 80, size=(generator.integers(1, 60), 4)).astype(np.float64)
        words[:, 2:] += words[:, :2]
        corners = np.stack([cells[:, 0], cells[:, 1], cells[:, 2], cells[:, 1], cells[:, 2], cells[:, 3],
                            cells[:, 0], cells[:, 3]], axis=1)
        for boxes in (cells, corners):
            assert table_matching.match_result(words, boxes) == TableMatch().match_result(list(words), boxes)
    assert table_matching.match_result(np.zeros((3, 4)), np.zeros((0, 4), dtype=np.float32)) == {}
