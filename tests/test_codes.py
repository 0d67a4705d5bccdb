"""``code2wav.codes.drop_trailing_padding``: the official trailing ``-1`` padding rule."""

from __future__ import annotations

import numpy as np

from code2wav.codes import drop_trailing_padding


def test_trailing_padding_is_dropped():
    arr = np.array([[3, 1], [4, 1], [-1, -1], [-1, -1]])
    assert drop_trailing_padding(arr).tolist() == [[3, 1], [4, 1]]


def test_only_codebook_0_marks_padding():
    arr = np.array([[3, 1], [5, -1]])  # -1 outside codebook 0: a (bad) frame, not padding
    assert drop_trailing_padding(arr).tolist() == [[3, 1], [5, -1]]


def test_inner_padding_is_left_alone():
    arr = np.array([[3, 1], [-1, -1], [4, 1], [-1, -1]])
    assert drop_trailing_padding(arr).tolist() == [[3, 1], [-1, -1], [4, 1]]


def test_all_padding_gives_no_rows():
    arr = np.full((3, 2), -1)
    out = drop_trailing_padding(arr)
    assert out.shape == (0, 2)
    assert drop_trailing_padding(np.zeros((0, 2), dtype=np.int64)).shape == (0, 2)
