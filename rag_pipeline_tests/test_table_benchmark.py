"""The ICDAR-2013 table benchmark's scoring (bench.tables_icdar): detection, spurious tables, cells and adjacency,
on constructed tables where the right answer is known, and its reading of the real structure files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.tables_icdar import FOLDER, TruthTable, adjacency, half_of, read_truth, score_document, summary

STRUCTURE = """<?xml version="1.0" encoding="UTF-8"?>
<document filename="x-str.xml">
  <table id="1"><region id="1" page="2">
    <cell id="1" start-row="0" start-col="1" end-row="0" end-col="2"><content>Releases</content></cell>
    <cell id="2" start-row="1" start-col="0"><content>Country</content></cell>
    <cell id="3" start-row="1" start-col="1"><content>to air
kg/year</content></cell>
    <cell id="4" start-row="1" start-col="2"><content>to water</content></cell>
    <cell id="5" start-row="2" start-col="0"><content>Austria</content></cell>
    <cell id="6" start-row="2" start-col="1"><content>10</content></cell>
    <cell id="7" start-row="2" start-col="2"><content>20</content></cell>
    <cell id="8" start-row="3" start-col="0"><content>Belgium</content></cell>
    <cell id="9" start-row="3" start-col="1"><content>30</content></cell>
    <cell id="10" start-row="3" start-col="2"><content>40</content></cell>
  </region></table>
</document>
"""

RIGHT = """Some prose above the table.

|  | Releases | Releases |
|---|---|---|
| Country | to air kg/year | to water |
| Austria | 10 | 20 |
| Belgium | 30 | 40 |
"""

# every cell found, but the figures one column to the left of their headers
SHIFTED = """| Country | to air kg/year | to water |
|---|---|---|
| Austria 10 | 20 |  |
| Belgium 30 | 40 |  |
"""


@pytest.fixture
def truth(tmp_path: Path) -> list[TruthTable]:
    path = tmp_path / "x-str.xml"
    path.write_text(STRUCTURE, encoding="utf-8")
    return read_truth(path)


def test_a_table_read_right_scores_full_marks(truth: list[TruthTable]) -> None:
    assert len(truth) == 1 and truth[0].page == 2
    assert truth[0].grid()[0] == ["", "Releases", "Releases"]  # the spanning cell fills both slots
    score = score_document("x.pdf", "tune", "cascade", {1: "Prose only.", 2: RIGHT}, truth)
    result = summary([score])
    assert (score.detected, score.spurious) == (1, 0)
    assert result["cell_recall"] == 1.0 and result["adjacency_recall"] == 1.0
    # a spanning header repeated in each column it covers is one cell: no extra cell, no extra relation
    assert result["cell_precision"] < 1.0  # "Releases" twice against once
    assert result["adjacency_precision"] == 1.0


def test_a_table_on_another_page_or_a_paragraph_table_is_not_a_detection(truth: list[TruthTable]) -> None:
    elsewhere = score_document("x.pdf", "tune", "cascade", {1: RIGHT, 2: "Prose only."}, truth)
    assert elsewhere.detected == 0 and elsewhere.missed_pages == [2]
    assert elsewhere.spurious == 1  # produced on a page whose truth holds no table
    prose = "| The quick brown | fox jumps |\n|---|---|\n| over the | lazy dog |\n"
    extra = score_document("x.pdf", "tune", "cascade", {2: RIGHT + "\nText.\n\n" + prose}, truth)
    assert (extra.detected, extra.spurious, extra.produced_tables) == (1, 1, 2)


def test_adjacency_sees_a_shifted_column_that_cell_texts_do_not(truth: list[TruthTable]) -> None:
    right = summary([score_document("x.pdf", "tune", "cascade", {2: RIGHT}, truth)])
    shifted = summary([score_document("x.pdf", "tune", "cascade", {2: SHIFTED}, truth)])
    assert shifted["cell_recall"] < right["cell_recall"]  # "Austria 10" is no cell
    assert shifted["adjacency_f1"] < 0.5 < right["adjacency_f1"]
    # relations are directed and positioned: a row read backwards relates nothing the truth relates
    assert adjacency([["a", "b"]]) == {("a", "b", "h"): 1}
    assert adjacency([["b", "a"]])[("a", "b", "h")] == 0
    assert adjacency([["a"], [""], ["b"]]) == {("a", "b", "v"): 1}  # an empty slot is skipped


def test_a_document_the_parser_loses_scores_nothing(truth: list[TruthTable]) -> None:
    score = score_document("x.pdf", "held-out", "cascade", {}, truth)
    result = summary([score])
    assert (result["detection"], result["cell_recall"], result["cell_f1"]) == (0.0, 0.0, 0.0)


def test_halves_are_fixed_by_the_file_number() -> None:
    assert half_of(Path("eu-001.pdf")) == "tune"
    assert half_of(Path("eu-002.pdf")) == "held-out"
    assert half_of(Path("eu-027.pdf")) == "tune"
    assert half_of(Path("eu-009a.pdf")) == "tune"


@pytest.mark.icdar
def test_the_real_structure_files_are_read_whole() -> None:
    """Every table of the shared ICDAR-EU documents is read, with its cells: as many as camelot's own counts say."""
    expected = found = 0
    for pdf in sorted(FOLDER.glob("eu-*.pdf")):
        tables = read_truth(pdf.with_name(f"{pdf.stem}-str.xml"))
        assert tables and all(table.cells and table.page >= 1 for table in tables), pdf.name
        assert all(sum(table.texts().values()) >= 2 for table in tables), pdf.name
        found += len(tables)
        expected += json.loads(pdf.with_suffix(".json").read_text())["numExpectedTables"]
    assert found == expected > 70
