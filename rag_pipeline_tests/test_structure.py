"""A report's structure in the index: contents lines and furniture are never sections, parts, items, statements
and the notes anchor the section path, a statement's title block is its tables' caption (also on the page it runs
on to), prose set as a table is text, and words split by character spacing are whole again. Real filings
(../shared/financebench-dev) where they are beside the checkout."""

from __future__ import annotations

import pdfplumber
import pytest

from rag_pipeline.embedding.locations import load_tokenizer, resolve_model
from rag_pipeline.parsing.pdf import _pdf_page, render_aware
from rag_pipeline.text import structure
from rag_pipeline.text.chunking import Chunker, sections_of
from rag_pipeline_tests.conftest import FINANCEBENCH


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_model("all-MiniLM-L6-v2").location)


@pytest.fixture(scope="module")
def chunker(tokenizer):
    return Chunker(tokenizer, max_tokens=200)


@pytest.mark.parametrize("line", ["Item 16. Form 10-K Summary 115", "PART I 1", "ITEM 1. Business 1",
                                  "Employees 6", "Results of Operations ........ 24",
                                  "Consolidated Statements of Cash Flows 45"])
def test_contents_entries_are_titles_with_their_page_number(line):
    assert structure.is_contents_entry(line)


@pytest.mark.parametrize("line", ["Note 12", "Fiscal 2019", "Tier 1", "Part 2", "Item 7A", "COVID-19 Pandemic",
                                  "Revenue grew 12 percent"])
def test_numbered_headings_are_not_contents_entries(line):
    assert not structure.is_contents_entry(line)


@pytest.mark.parametrize(("line", "name"), [
    ("CONSOLIDATED BALANCE SHEETS", "CONSOLIDATED BALANCE SHEETS"),
    ("NIKE, Inc. Consolidated Statements of Income", "Consolidated Statements of Income"),
    ("Condensed Consolidated Statements of Operations (Unaudited)", "Condensed Consolidated Statements of Operations"),
    ("Consolidated Statements of Cash Flows (continued)", "Consolidated Statements of Cash Flows"),
    ("STATEMENT OF FINANCIAL POSITION", "STATEMENT OF FINANCIAL POSITION"),
    ("Consolidated Balance Sheets as of December 31", "Consolidated Balance Sheets"),
])
def test_statement_titles_are_named(line, name):
    assert structure.statement_name(line) == name


@pytest.mark.parametrize("line", [
    "See the Consolidated Balance Sheets", "Balance sheet data was restated as described in Note 2",
    "The accompanying notes are an integral part of these consolidated financial statements.",
    "Consolidated statements of income (unaudited) 80",  # a contents entry
    "Cash flows from operating activities were strong in a year when our customers paid on time, as the "
    "Consolidated Statements of Cash Flows show",
    # the last line of a wrapped sentence, and a label in a note's table (real filings)
    "Consolidated Balance Sheets.", "Balance Sheets. See Note 6—Acquisitions and Divestitures for additional "
    "information.", "Statements of Income:",
])
def test_sentences_about_statements_are_not_their_titles(line):
    assert structure.statement_name(line) is None


def test_words_split_by_character_spacing_are_joined_and_words_are_left_alone(tokenizer):
    def is_word(word: str) -> bool:
        return len(tokenizer.tokenize(word)) == 1

    for split, whole in [("Consolidated Statements of Cash Flow s", "Consolidated Statements of Cash Flows"),
                         ("TABLE OF CONTE NTS", "TABLE OF CONTENTS"), ("Statement of Incom e", "Statement of Income"),
                         ("CONSOLIDATED STATEMENTS OF INCOM E", "CONSOLIDATED STATEMENTS OF INCOME"),
                         ("payable fo r the year", "payable for the year")]:
        assert structure.join_split_words(split, is_word) == whole
    for kept in ["I have a dog", "Item 1A. Risk Factors", "The U S dollar", "in the year it a rose",
                 "per share data s", "Net sales of $5 billion"]:
        assert structure.join_split_words(kept, is_word) == kept


def test_prose_set_as_a_table_is_text_and_a_column_of_names_stays_a_table():
    prose = ("| | The increase was primarily attributable to higher net sales of approximately |\n|---|---|\n"
             "| million for helicopter programs due to higher volume on production contracts, which | |\n"
             "| $55 million decrease for various programs due to lower volume. | |")
    assert structure.prose_of_table(prose) == (
        "The increase was primarily attributable to higher net sales of approximately\n"
        "million for helicopter programs due to higher volume on production contracts, which\n"
        "$55 million decrease for various programs due to lower volume.")
    assert structure.prose_of_table("| Segment |\n|---|\n| Americas |\n| Europe |\n| Asia Pacific |") is None
    assert structure.prose_of_table("| Net sales | 1,234 | 1,111 |\n|---|---|---|\n| Cost of sales | 800 | 700 |") is None


def test_contents_lines_never_enter_a_section_path():
    contents = ("# TABLE OF CONTENTS\n## PART I 1\nITEM 1. Business 1\nITEM 1A. Risk Factors 8\n"
                "ITEM 8. Financial Statements and Supplementary Data 45\nITEM 16. Form 10-K Summary 90")
    statement = "NIKE, INC.\n# CONSOLIDATED BALANCE SHEETS\n\n| (in millions) | 2019 |\n|---|---|\n| Cash | 4,466 |"
    sections = sections_of([(2, contents), (54, statement)])
    assert sections[-1].path == ("CONSOLIDATED BALANCE SHEETS",)
    assert not any(structure.is_contents_entry(part) for s in sections for part in s.path)
    assert "TABLE OF CONTENTS" not in {part for s in sections for part in s.path}


def test_a_heading_ending_in_a_number_is_a_contents_entry_only_on_a_contents_page():
    [section] = sections_of([(7, "# Release notes\n## PostgreSQL 15\nWhat changed.")])
    assert section.path == ("Release notes", "PostgreSQL 15")
    contents = "# Contents\n## PostgreSQL 15 7\nRelease 14 9\nRelease 13 12\nOlder releases 20"
    assert all(s.path == () for s in sections_of([(2, contents)]))


def test_a_bold_table_row_with_an_amount_is_not_a_heading():
    [section] = sections_of([(69, "# NOTE 7 — SHORT-TERM BORROWINGS\nNotes payable at May 31.\n"
                                  "### TOTAL NOTES PAYABLE $ 336\nThe weighted average interest rate was 2.1%.")])
    assert section.path == ("NOTE 7 — SHORT-TERM BORROWINGS",)
    assert "TOTAL NOTES PAYABLE $ 336" in section.text and "###" not in section.text


def test_headings_ending_in_a_number_each_over_their_text_do_not_make_a_contents_page():
    body = "\n".join(f"## Widget {i}\nWidget {i} is the part the assembly fits after the housing and before the "
                     f"cover plate." for i in range(1, 6))
    sections = sections_of([(3, "# Assembly\n" + body)])
    assert [s.path for s in sections] == [("Assembly", f"Widget {i}") for i in range(1, 6)]


def test_statements_anchor_under_their_item_and_do_not_govern_the_pages_after_them():
    pages = [
        (49, "# Report of Independent Registered Public Accounting Firm\n## Critical Audit Matters\nWe audited."),
        (50, "# ITEM 8. FINANCIAL STATEMENTS\n## Critical Audit Matters\nMore audit text."),
        (51, "ACME, INC.\n### Consolidated Statements of Income\n| | 2019 |\n|---|---|\n| Net sales | 10 |"),
        (52, "| Net income | 3 |\n|---|---|\n| Diluted | 1 |\nThe notes are part of these statements."),
        (53, "### Consolidated Balance Sheets\n| | 2019 |\n|---|---|\n| Total assets | 90 |"),
        (54, "Revenue is recognised when control passes.\n## Inventories\nAt cost."),
    ]
    sections = sections_of(pages)
    path = {s.page: s.path for s in sections}
    # a statement replaces the sub-headings of its item ("Critical Audit Matters"), not the item
    assert path[51] == ("ITEM 8. FINANCIAL STATEMENTS", "Consolidated Statements of Income")
    # the page that goes on with its table keeps the statement; the page after the last statement does not
    assert path[52] == path[51]
    assert path[53] == ("ITEM 8. FINANCIAL STATEMENTS", "Consolidated Balance Sheets")
    assert [s.path for s in sections if s.page == 54] == [("ITEM 8. FINANCIAL STATEMENTS",),
                                                         ("ITEM 8. FINANCIAL STATEMENTS", "Inventories")]
    # an ordinary heading, however large its type, does not replace an item
    [section] = sections_of([(3, "# ITEM 1. BUSINESS\n# GENERAL\nWe make shoes.")])
    assert section.path == ("ITEM 1. BUSINESS", "GENERAL")


def test_a_statement_title_in_body_type_opens_its_section():
    page = ("Our MD&A text ends here.\nConsolidated Statements of Cash Flows\n(in millions)\n"
            "| | 2020 |\n|---|---|\n| Purchases of property and equipment | (96) |")
    sections = sections_of([(60, page)])
    assert sections[-1].path == ("Consolidated Statements of Cash Flows",)


def test_every_piece_of_a_statement_carries_its_title_block_also_on_the_next_page(chunker):
    rows = "\n".join(f"| Line item number {i} of the statement | {i},000 | {i},100 |" for i in range(40))
    pages = [(56, "Our report ends here.\n\nAMD, INC.\n# CONSOLIDATED STATEMENTS OF CASH FLOWS\n(In millions)\n"
                  f"| | 2015 | 2014 |\n|---|---|---|\n{rows}"),
             (57, "| Net cash used in financing activities | (11) | (12) |\n|---|---|---|\n"
                  "| Purchases of property, plant and equipment | (96) | (95) |")]
    chunks = chunker.chunk("doc", pages)
    tables = [c for c in chunks if c.content_type == "table"]
    assert len([c for c in tables if c.page_start == 56]) >= 3
    for chunk in tables:
        first = chunk.text.split("\n", 1)[0]
        assert first.startswith("Table: AMD, INC. — CONSOLIDATED STATEMENTS OF CASH FLOWS — (In millions)"), chunk.text
        assert chunk.section_path == "CONSOLIDATED STATEMENTS OF CASH FLOWS"
    assert [c.text.split("\n", 1)[0] for c in tables if c.page_start == 57] == [
        "Table: AMD, INC. — CONSOLIDATED STATEMENTS OF CASH FLOWS — (In millions) (continued)"]
    # the paragraph before the title keeps its own text and is no caption
    assert any(c.text == "Our report ends here." for c in chunks)


def test_the_last_line_of_a_wrapped_paragraph_is_not_a_title(chunker):
    page = ("The following table shows the amounts by segment for the fiscal years ended in 2019 and in\n"
            "2018 and 2017 respectively\n| Segment | 2019 |\n|---|---|\n| North America | 10 |")
    [*_, table] = chunker.chunk("doc", [(4, page)])
    assert table.content_type == "table" and table.text.startswith("| Segment")


# --- real filings ---------------------------------------------------------------------------------------------


def _tier_one(filing: str, page_numbers: list[int]) -> list[tuple[int, str]]:
    with pdfplumber.open(FINANCEBENCH / "pdfs" / filing) as pdf:
        return [(n, _pdf_page(render_aware(pdf.pages[n - 1]))[0]) for n in page_numbers]


@pytest.mark.financebench
def test_a_real_contents_page_gives_no_section_and_its_kerned_title_is_whole(chunker):
    pages = _tier_one("NIKE_2019_10K.pdf", [2, 54])
    assert "CONTE NTS" in pages[0][1]  # the text layer splits the tracked title
    chunks = chunker.chunk("nike", pages)
    assert any("TABLE OF CONTENTS" in c.text for c in chunks)
    assert not any(structure.is_contents_entry(part) for c in chunks for part in c.section_path.split(" › "))
    balance = [c for c in chunks if c.page_start == 54 and c.content_type == "table"]
    assert balance and all(c.text.startswith("Table: NIKE, INC. — CONSOLIDATED BALANCE SHEETS") for c in balance)
    assert all(c.section_path == "CONSOLIDATED BALANCE SHEETS" for c in balance)


@pytest.mark.financebench
def test_real_mdna_prose_with_figures_stays_prose(chunker):
    [(page, markdown)] = _tier_one("LOCKHEEDMARTIN_2020_10K.pdf", [47])
    chunks = chunker.chunk("lmt", [(page, markdown)])
    said = [c for c in chunks if "primarily attributable to higher net sales" in c.text]
    assert said and all(c.content_type == "prose" and "|" not in c.text for c in said)
    # the segment's figures are still a table
    assert any(c.content_type == "table" and "15,995" in c.text for c in chunks)


@pytest.mark.financebench
def test_a_statement_title_the_layout_model_leaves_unboxed_stays_above_its_table(chunker):
    from rag_pipeline.config import ParsingConfig
    from rag_pipeline.parsing.cascade import layout_page

    markdown = layout_page(FINANCEBENCH / "pdfs" / "NIKE_2018_10K.pdf", 50, ParsingConfig(), None)
    title = "NIKE, Inc. Consolidated Statements of Shareholders’ Equity"
    assert markdown.index(title) < markdown.index("| ")
    tables = [c for c in chunker.chunk("nike", [(50, markdown)]) if c.content_type == "table"]
    assert tables and all("Shareholders’ Equity" in c.text.split("\n", 1)[0] for c in tables)


def test_words_no_layout_region_holds_are_kept_where_they_stand():
    from rag_pipeline.parsing.layout import _unheld_blocks

    def word(text, top, x0):
        return {"text": text, "top": top, "bottom": top + 8, "x0": x0, "x1": x0 + 6 * len(text)}

    words = [word("Statements", 60, 100), word("Equity", 60, 170), word("(in", 72, 100), word("millions)", 72, 120),
             word("48", 640, 300)]
    blocks = _unheld_blocks(words, block_tops=[116.0])  # a table's region starts at 116
    assert blocks == [((60.0, 100.0), "Statements Equity\n(in millions)"), ((640.0, 300.0), "48")]
