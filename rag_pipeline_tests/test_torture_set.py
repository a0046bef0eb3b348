"""The torture set, scored: every document reaches its expected outcome and the scores pinned in
torture_set/pinned_scores.json (a regression fails the build; re-pin with `--pin` after an improvement)."""

import json

import pytest

from rag_pipeline_tests.conftest import TORTURE
from torture_set.harness import (
    PINNED,
    PINNED_TIERS,
    reading_order_errors,
    regressions,
    run,
    table_cell_f1,
    text_recall,
)


def test_metrics():
    assert text_recall("the cat sat", "The cat sat on the mat") == pytest.approx(3 / 6)
    assert reading_order_errors("b c d e f g a", "a b c d e f g", stride=1) == 0  # anchors not found are not errors
    truth = "one two three four five six seven eight nine ten eleven twelve"
    swapped = "seven eight nine ten eleven twelve one two three four five six"
    assert reading_order_errors(truth, truth, stride=1) == 0
    assert reading_order_errors(swapped, truth, stride=1) > 0
    table = [["Name", "City"], ["Ann", "Lyon"]]
    assert table_cell_f1([table], [table]) == 1.0
    assert table_cell_f1([[["Name", "City"]]], [table]) == pytest.approx(2 * 1 * 0.5 / 1.5, abs=1e-3)


@pytest.mark.torture
def test_torture_scores_do_not_regress():
    scores = run(TORTURE, PINNED_TIERS)
    crashes = [(s.file, s.tier, s.outcome) for s in scores if s.outcome.startswith("crash")]
    assert crashes == []
    assert [(s.file, s.tier, s.outcome) for s in scores if not s.outcome_ok] == []
    pinned = json.loads(PINNED.read_text())
    assert len(pinned) >= 30
    assert regressions(scores, pinned) == []
    by_key = {f"{s.file}|{s.tier}": s for s in scores}
    # What the cascade is for, in numbers: scans become text, tables over page breaks become one table.
    assert by_key["docs/docling_ocr_test_scanned.pdf|cascade"].text_recall >= 0.95
    assert by_key["generated/gen_image_only.pdf|cascade"].text_recall >= 0.95
    assert by_key["generated/gen_stamped_scan.pdf|cascade"].text_recall >= 0.95  # a text layer that is a stamp
    assert by_key["generated/gen_table_over_page_break.pdf|cascade"].single_table is True
    assert by_key["docs/fedreg_2020-17221_3col.pdf|cascade"].must_be_absent == 1.0
    # Pictures keep their words: a drawn chart's from the text layer, a pasted screenshot's by OCR of its region.
    assert by_key["generated/gen_drawn_chart.pdf|cascade"].picture_text_recall >= 0.85
    assert by_key["generated/gen_raster_screenshot.pdf|cascade"].picture_text_recall >= 0.95
