"""Which table cell each word goes to, for rapid-table's SLANet reader: its own matcher, vectorised.

rapid-table (0.3) assigns every word box to the predicted cell with the highest IoU, then the smallest L1 distance,
then the first cell, in a Python loop over words × cells that calls numpy on scalars: on statement pages it was two
thirds of the layout-and-table tier's time (1.6 s of 2.4 s a table on 2 cores), while the model itself took 0.1 s.
`match_result` below computes the same keys, in the same order of operations and the same dtypes, for all pairs
at once (rag_pipeline_tests/test_tables.py compares the two on real tables).
"""

from __future__ import annotations

from typing import Any

import numpy as np

ROWS_AT_ONCE = 256  # words per block: bounds the pair arrays (words × cells) for a very large table


def _corners(pred_bboxes: Any) -> np.ndarray:
    """Cells as (x0, y0, x1, y1) in the model's own dtype; 8-value boxes (four corners) reduced as the library
    does."""
    pred = np.asarray(pred_bboxes)
    if pred.ndim == 2 and pred.shape[1] == 8:
        return np.stack([pred[:, 0::2].min(1), pred[:, 1::2].min(1), pred[:, 0::2].max(1), pred[:, 1::2].max(1)],
                        axis=1)
    return pred.reshape(-1, 4)


def _block(gt: np.ndarray, pred: np.ndarray) -> np.ndarray:
    """The chosen cell of each word in `gt`: rapid_table.table_matcher.utils.distance and compute_iou, pairwise."""
    g = [gt[:, k, None] for k in range(4)]
    p = [pred[None, :, k] for k in range(4)]
    a, b, c, d = (np.abs(p[k] - g[k]) for k in range(4))
    dist = a + b + c + d + np.minimum(a + b, c + d)  # ((a + b) + c) + d, then the nearer corner, as the library sums
    # compute_iou reads a box as (top, left, bottom, right); its arithmetic on the cell's own values stays in the
    # cell's dtype, as the scalar code's does.
    area_gt = (g[2] - g[0]) * (g[3] - g[1])
    area_pred = (pred[:, 2] - pred[:, 0]) * (pred[:, 3] - pred[:, 1])
    left, right = np.maximum(g[1], p[1]), np.minimum(g[3], p[3])
    top, bottom = np.maximum(g[0], p[0]), np.minimum(g[2], p[2])
    overlap = (left < right) & (top < bottom)
    intersect = np.where(overlap, (right - left) * (bottom - top), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = np.where(overlap, intersect / (area_gt + area_pred[None, :] - intersect) * 1.0, 0.0)
    miss = 1.0 - iou
    best = miss.min(axis=1, keepdims=True)
    # The smallest (1 - IoU), then the smallest distance, then the first cell: argmin returns the first minimum.
    return np.where(miss == best, dist, np.inf).argmin(axis=1)


def match_result(dt_boxes: Any, pred_bboxes: Any) -> dict[int, list[int]]:
    """{cell index: [word indexes in order]}, as rapid_table's TableMatch.match_result returns it."""
    gt = np.asarray(dt_boxes, dtype=np.float64).reshape(-1, 4)
    pred = _corners(pred_bboxes)
    matched: dict[int, list[int]] = {}
    if len(pred) == 0:
        return matched
    for start in range(0, len(gt), ROWS_AT_ONCE):
        for offset, cell in enumerate(_block(gt[start:start + ROWS_AT_ONCE], pred)):
            matched.setdefault(int(cell), []).append(start + offset)
    return matched
