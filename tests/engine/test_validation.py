"""The checks' fast paths (an exact int / float / bool / list taken first) give what the full checks give:
the same value back, and the same refusal at and past every edge (tests/reliability/test_validation.py
holds the hostile values)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvscope.engine.validation import UINT64_MAX, check_bool, check_int, check_real, token_ids


@pytest.mark.parametrize("value, lo, hi, ok", [
    (1, 1, None, True), (0, 1, None, False), (10**30, 1, None, True), (UINT64_MAX, 0, UINT64_MAX, True),
    (UINT64_MAX + 1, 0, UINT64_MAX, False), (-1, 0, UINT64_MAX, False), (5, 5, 5, True), (6, 5, 5, False),
])
def test_check_int_edges(value, lo, hi, ok):
    if ok:
        assert check_int("n", value, lo, hi) is value
        if value < 2**63:
            assert check_int("n", np.int64(value), lo, hi) == value  # the full path agrees
    else:
        with pytest.raises(ValueError, match=rf"^n={value} must be an integer"):
            check_int("n", value, lo, hi)
    with pytest.raises(TypeError, match="not bool"):
        check_int("n", True, 0, hi)


@pytest.mark.parametrize("value, lo, hi, lo_open, ok", [
    (0.0, 0.0, math.inf, False, True), (0.0, 0.0, 1.0, True, False), (1.0, 0.0, 1.0, True, True),
    (1.0000000000000002, 0.0, 1.0, True, False), (-0.0, 0.0, math.inf, False, True),
    (1e308, 0.0, math.inf, False, True),
    (math.inf, 0.0, math.inf, False, False), (-math.inf, -math.inf, math.inf, False, False),
    (math.nan, 0.0, math.inf, False, False), (-1e-300, 0.0, math.inf, False, False),
])
def test_check_real_edges(value, lo, hi, lo_open, ok):
    if ok:
        assert check_real("x", value, lo, hi, lo_open=lo_open) is value
        assert check_real("x", np.float64(value), lo, hi, lo_open=lo_open) == value  # the full path agrees
    else:
        with pytest.raises(ValueError, match=r"^x=.* must be a finite number"):
            check_real("x", value, lo, hi, lo_open=lo_open)
    assert type(check_real("x", 1, 0.0, 2.0)) is float  # ints become floats


def test_check_bool_takes_bools_and_numpy_bools_only():
    assert check_bool("b", True) is True and check_bool("b", False) is False
    assert check_bool("b", np.bool_(True)) is True
    for bad in (1, 0, None, "True"):
        with pytest.raises(TypeError, match=r"^b=.* must be True or False"):
            check_bool("b", bad)


def test_token_ids_lists_are_copied_and_checked_item_by_item():
    ids = [3, 1, 2]
    out = token_ids(ids)
    assert out == ids and out is not ids
    assert token_ids([np.int32(4), 5]) == [4, 5] and type(token_ids([np.int32(4)])[0]) is int
    with pytest.raises(TypeError, match=r"item 1 is True \(bool\)"):
        token_ids([1, True])
    with pytest.raises(TypeError, match=r"item 0 is 1.0 \(float\)"):
        token_ids([1.0])

    class Ids(list):  # a list subclass with an array's attributes is read as an array, as before
        ndim, dtype, shape = 2, np.dtype("int64"), (1, 1)

        def tolist(self) -> list:
            return [list(self)]

    with pytest.raises(ValueError, match="must be 1-D token ids"):
        token_ids(Ids([1]))
    assert token_ids((1, 2)) == [1, 2] and token_ids(range(2)) == [0, 1]
    assert token_ids({3, 1}, set_ok=True) == [1, 3]
