from pathlib import Path

import pytest

from rag_pipeline.embedding.locations import (
    FastTokenizer,
    load_chunking_tokenizer,
    load_tokenizer,
    max_sequence_length,
    resolve_model,
)
from rag_pipeline.text.chunking import (
    Chunker,
    fitted_prefix,
    sections_of,
    template_prefix,
    truncate_to_tokens,
)
from rag_pipeline.text.cleaning import clean_text, content_hash
from rag_pipeline_tests.conftest import TORTURE


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_model("all-MiniLM-L6-v2").location)


def test_clean_text_normalises_representation_only():
    raw = "Ｆｕｌｌ\u00a0width\tand  spaces \r\n\r\n\r\n\r\nﬁne\x00 line   \n"
    assert clean_text(raw) == "Full width and spaces\n\nfine line"


def test_content_hash_depends_on_text_and_page_boundaries():
    assert content_hash(["a", "b"]) == content_hash(["a", "b"])
    assert content_hash(["a", "b"]) != content_hash(["ab"])
    assert content_hash(["a"]) != content_hash(["b"])


def test_sections_follow_headings_across_pages():
    pages = [(1, "# Guide\nintro\n## Setup\nstep one"), (2, "step two\n# Appendix\n## Terms\nwords")]
    sections = sections_of(pages)
    assert [(s.page, s.path) for s in sections] == [
        (1, ("Guide",)),
        (1, ("Guide", "Setup")),
        (2, ("Guide", "Setup")),
        (2, ("Appendix", "Terms")),  # heading directly followed by a sub-heading: no heading-only section
    ]


def test_a_title_set_as_two_headings_stays_one_title():
    # a statement page: its title and its unit line both set as headings, then the table
    page = ("## Item 8. Financial statements\n### Consolidated Statements of Cash Flows\n### (in millions of USD)\n"
            "| | 2019 |\n|---|---|\n| Capital expenditures | (1,518) |")
    [section] = sections_of([(8, page)])
    assert section.path == ("Item 8. Financial statements", "Consolidated Statements of Cash Flows (in millions of USD)")
    # headings with text between them still replace each other
    sections = sections_of([(1, "## Income\nRevenue rose.\n## Cash flows\nCapital spending fell.")])
    assert [s.path for s in sections] == [("Income",), ("Cash flows",)]
    # a table of contents is a list of headings: numbered ones never join; others join up to a title's length,
    # then each replaces the last
    contents = "\n".join(f"## Item {n}. Section number {n} of the annual report" for n in range(1, 9)) + "\nText."
    assert sections_of([(2, contents)])[-1].path == ("Item 8. Section number 8 of the annual report",)
    contents = "\n".join(f"## Part {n} of a contents page that lists many parts" for n in range(1, 7)) + "\nText."
    assert sections_of([(2, contents)])[-1].path == ("Part 6 of a contents page that lists many parts",)
    # a page of headings only does not join the first heading of the next page
    sections = sections_of([(1, "## Cover title"), (2, "## Chapter one\nText.")])
    assert sections[-1].path == ("Chapter one",)


def test_a_prefix_over_its_budget_keeps_the_innermost_section_and_drops_outer_ones_whole(tokenizer):
    count = lambda text: len(tokenizer.tokenize(text))  # noqa: E731
    outer = "Item 7. Management's Discussion and Analysis of Financial Condition and Results of Operations"
    path = f"{outer} › Consolidated Statements of Cash Flows (in millions of USD)"
    assert count(template_prefix("GLOBEX_2019_10K", path, 8, 8)) > 32
    prefix = fitted_prefix(count, "GLOBEX_2019_10K", path, 8, 8, 32)
    assert prefix == "GLOBEX_2019_10K › Consolidated Statements of Cash Flows (in millions of USD) › p. 8"
    assert count(prefix) <= 32
    # a document's name that does not fit beside the innermost section is shortened from its end, by whole words
    name = "Globex Industries FY2019: annual report on the company's business, risks and financial statements"
    shortened = fitted_prefix(count, name, path, 8, 8, 32)
    assert shortened.startswith("Globex Industries FY2019") and shortened.endswith("(in millions of USD) › p. 8")
    assert count(shortened) <= 32 and name not in shortened
    # within budget: the whole template; a section longer than the budget: shortened by whole words
    assert fitted_prefix(count, "Handbook", "Travel › Hotels", 3, 3, 32) == "Handbook › Travel › Hotels › p. 3"
    long = " ".join(["Consolidated"] * 40)
    shortened = fitted_prefix(count, "Doc", long, 1, 1, 32)
    assert count(shortened) <= 32 and shortened.startswith("Consolidated") and shortened.endswith("› p. 1")
    assert fitted_prefix(count, "Doc", "Hotels", 1, 1, 0) == ""
    # a section that only repeats the document's name says nothing new ("CREATE TABLE › CREATE TABLE")
    assert fitted_prefix(count, "CREATE TABLE", "CREATE TABLE › Parameters", 2, 2, 32) == "CREATE TABLE › Parameters › p. 2"
    assert fitted_prefix(count, "Travel Handbook", "Handbook › Hotels", 3, 3, 32) == "Travel Handbook › Hotels › p. 3"
    # the innermost section stays even when the name says it: the name may be the part shortened away
    tight = fitted_prefix(count, "Walmart Inc. FY2020: Balance Sheet", "Financial Statements › Balance Sheet", 40, 40, 12)
    assert "Balance Sheet" in tight and count(tight) <= 12


def test_model_limits_from_the_packaged_model():
    assert max_sequence_length(resolve_model("all-MiniLM-L6-v2").location) == 256


def test_chunks_fit_the_token_budget_and_are_stable(tokenizer):
    paragraph = "The warehouse robot carries shelves between picking stations. " * 12
    text = "# Manual\n" + "\n\n".join(paragraph for _ in range(8))
    chunker = Chunker(tokenizer, max_tokens=100)
    chunks = chunker.chunk("doc1", [(1, text), (2, "| a | b |\n|---|---|\n| 1 | 2 |")])
    assert len(chunks) > 8
    assert all(c.token_count <= 100 for c in chunks)
    assert [c.ordinal for c in chunks] == list(range(len(chunks)))
    assert chunks[0].section_path == "Manual" and chunks[0].page_start == 1
    assert chunks[-1].content_type == "table" and chunks[-1].page_start == 2
    again = chunker.chunk("doc1", [(1, text), (2, "| a | b |\n|---|---|\n| 1 | 2 |")])
    assert [c.chunk_id for c in again] == [c.chunk_id for c in chunks]
    assert Chunker(tokenizer, max_tokens=90).version != chunker.version
    other_doc = chunker.chunk("doc2", [(1, text)])
    assert other_doc[0].chunk_id != chunks[0].chunk_id


def test_prefix_template_and_truncation(tokenizer):
    assert template_prefix("Handbook", "Travel › Hotels", 3, 3) == "Handbook › Travel › Hotels › p. 3"
    assert template_prefix(None, "", 1, 2) == "pp. 1-2"
    long = "word " * 100
    cut = truncate_to_tokens(tokenizer, long, 10)
    assert len(tokenizer.encode(cut, add_special_tokens=False)) <= 10


def test_invalid_chunker_settings(tokenizer):
    with pytest.raises(ValueError):
        Chunker(tokenizer, max_tokens=8)
    with pytest.raises(ValueError):
        Chunker(tokenizer, max_tokens=100, overlap_tokens=100)


def test_numbered_sections_open_sections():
    text = "Item 1A. Risk Factors\nOur business is risky.\n3.2 Scope\nThis applies to all plants.\n3.2.1 Lyon\nThe Lyon plant."
    sections = sections_of([(1, text)])
    assert [s.path for s in sections] == [
        ("Item 1A. Risk Factors",),
        ("Item 1A. Risk Factors", "3.2 Scope"),
        ("Item 1A. Risk Factors", "3.2 Scope", "3.2.1 Lyon"),
    ]
    # Ordinary sentences that start with a number are not headings.
    assert len(sections_of([(1, "Intro\n12 robots were shipped in May.\nmore")])) == 1


def test_a_large_table_is_split_by_rows_repeating_caption_and_header(tokenizer):
    header = "| Region | Plant | Robots shipped | Revenue (EUR m) |\n|---|---|---|---|"
    rows = "\n".join(f"| Region {i} | Plant number {i} | {i * 7} | {i * 1.5:.1f} |" for i in range(60))
    section = f"## Shipments\nSome context first.\nTable 4-2 Shipments by plant\n{header}\n{rows}\nAfter the table."
    chunker = Chunker(tokenizer, max_tokens=120)
    chunks = chunker.chunk("doc", [(3, section)])
    tables = [c for c in chunks if c.content_type == "table"]
    assert len(tables) >= 3
    for piece in tables:
        lines = piece.text.split("\n")
        assert lines[0] == "Table 4-2 Shipments by plant"
        assert lines[1:3] == header.split("\n")
        assert piece.token_count <= 120
        assert piece.section_path == "Shipments"
    body_rows = [line for piece in tables for line in piece.text.split("\n")[3:]]
    assert body_rows == rows.split("\n")  # every row exactly once, in order
    prose = [c.text for c in chunks if c.content_type == "prose"]
    assert prose == ["## Shipments\nSome context first.", "After the table."]
    assert not [c for c in chunks if c.content_type == "heading"]


def test_content_types(tokenizer):
    chunker = Chunker(tokenizer, max_tokens=200)
    pages = [(1, "# A\n- one\n- two\n- three"), (2, "# B\nFigure 1-2 Existing row and column controls"),
             (3, "# C\n| a | b |\n|---|---|\n| 1 | 2 |")]
    assert [c.content_type for c in chunker.chunk("d", pages)] == ["list", "figure_caption", "table"]


def test_clean_document_strips_page_furniture_and_records_it():
    from rag_pipeline.text.cleaning import clean_document

    pages = [
        f"ACME Corp — Annual Report {2020 + i}\nCONFIDENTIAL\nBody text of page {i} talks about inter-\nnational sales.\n"
        f"Introduction ........ {i + 3}\n{i + 1}"
        for i in range(5)
    ]
    cleaned, removed = clean_document(pages)
    for index, page in enumerate(cleaned):
        assert page == f"Body text of page {index} talks about international sales."
    assert removed["running_header_footer"] > 0 and removed["toc_leader"] > 0 and removed["hyphenation"] == 5 * len("-\n")
    # A one-page document has nothing to compare: only the per-line rules apply.
    single, _ = clean_document(["Title\nA sentence.\n7"])
    assert single == ["Title\nA sentence."]


def test_repeated_table_headers_are_not_furniture():
    from rag_pipeline.text.cleaning import clean_document

    page = "| Name | City |\n|---|---|\n| Ann | Lyon |"
    cleaned, _ = clean_document([page, page.replace("Ann", "Bob"), page.replace("Ann", "Cy")])
    assert all(p.startswith("| Name | City |") for p in cleaned)


def test_tables_continued_over_page_breaks_are_joined():
    from rag_pipeline.text.cleaning import join_continued_tables

    header = "| Name | City |\n|---|---|"
    pages = [
        f"Intro text.\n\n{header}\n| Ann | Lyon |",
        f"{header}\n| Bob | Turin |",  # repeated header: dropped
        "| Cy | Geneva |\n|---|---|\n| Di | Bern |",  # no header: the parser's "header" is a data row
        "Closing words.\n\n| A | B | C |\n|---|---|---|\n| 1 | 2 | 3 |",  # prose first: a new table
        "| X | Y |\n|---|---|\n| 1 | 2 |",  # different width from the table above: not joined
    ]
    joined, reaches = join_continued_tables(pages)
    assert joined[0] == "Intro text.\n\n| Name | City |\n|---|---|\n| Ann | Lyon |\n| Bob | Turin |\n| Cy | Geneva |\n| Di | Bern |"
    assert joined[1] == "" and joined[2] == ""
    assert reaches == {0: 2}
    assert joined[3] == pages[3] and joined[4] == pages[4]


@pytest.mark.torture
def test_a_sixteen_page_table_becomes_one_table_whose_pieces_repeat_the_header(tokenizer):
    from rag_pipeline.parsing.formats import parse_file
    from rag_pipeline.text.cleaning import clean_parsed_pages

    pages = list(parse_file(TORTURE / "docs" / "pdfplumber_WARN_report_16p_table.pdf"))
    clean_parsed_pages(pages)
    assert pages[0].signals["table_continues_to"] >= 15
    reach = {p.page: p.signals["table_continues_to"] for p in pages if "table_continues_to" in p.signals}
    chunks = Chunker(tokenizer, max_tokens=222).chunk("warn", [(p.page, p.markdown) for p in pages], reach)
    big = [c for c in chunks if c.content_type == "table" and c.page_start == 1 and c.page_end >= 15]
    assert len(big) > 10
    headers = {c.text.split("\n")[0] for c in big}
    assert len(headers) == 1 and "Company" in headers.pop()
    assert all(c.text.split("\n")[1].startswith("|---") for c in big)
    assert "Maxim Integrated Product" in " ".join(c.text for c in big)


def test_chunk_sizes_that_leave_no_room_are_refused_before_any_document_is_touched(tmp_path):
    from rag_pipeline.config import ConfigError, load_settings
    from rag_pipeline.stages.chunk import chunk_size

    location = resolve_model("all-MiniLM-L6-v2").location
    config = tmp_path / "rag.yaml"
    config.write_text("chunking: {prefix_token_budget: 1000}\n")
    with pytest.raises(ConfigError, match=r"chunking\.prefix_token_budget: 1000 leaves -746 tokens"):
        chunk_size(load_settings(config), location)
    config.write_text("chunking: {overlap_tokens: 400}\n")
    with pytest.raises(ConfigError, match=r"chunking\.overlap_tokens: 400 is not smaller than the chunk size of 222"):
        chunk_size(load_settings(config), location)
    config.write_text("chunking: {overlap_tokens: 20}\n")
    assert chunk_size(load_settings(config), location) == 256 - 2 - 32


@pytest.mark.parametrize("model", ["all-MiniLM-L6-v2", "all-mpnet-base-v2"])
def test_the_workers_tokenizer_cuts_the_same_chunks_as_transformers(model):
    """Parse workers size chunks with `tokenizers` alone (transformers costs 2 s to import in each): the chunks,
    the token counts and the cut prefixes must be the ones transformers' tokenizer gives."""
    location = resolve_model(model).location
    fast, full = load_chunking_tokenizer(location), load_tokenizer(location)
    assert isinstance(fast, FastTokenizer)
    pages = [(1, "# Travel\n" + ("Flights are booked two weeks ahead; hotels up to EUR 140 a night. " * 60)),
             (2, "| Item | 2023 | 2022 |\n|---|---|---|\n" + "".join(f"| Row {i} déjà vu | {i},000 | ({i}) |\n"
                                                                    for i in range(80))),
             (3, "Ünïcödé 東京 résumé — $1,234.56 (in millions) \u200b" * 30 + (Path(__file__).parents[1] / "README.md").read_text()[:5000])]
    ours, theirs = Chunker(fast, 120), Chunker(full, 120)
    assert [c.text for c in ours.chunk("d", pages)] == [c.text for c in theirs.chunk("d", pages)]
    for _, page in pages:
        assert ours.count_tokens(page) == theirs.count_tokens(page)
        assert truncate_to_tokens(fast, page, 50) == truncate_to_tokens(full, page, 50)
