# SPDX-License-Identifier: BSD-3-Clause
"""fa2patch.common.values: a file's true is not a count, NaN and infinity are not times."""

import pytest

from fa2patch.common.values import finite_number, whole_number


@pytest.mark.parametrize(
    ("value", "low", "ok"),
    [
        (1, 1, True),
        (0, 0, True),
        (7, 8, False),
        (True, 1, False),
        (False, 0, False),
        (1.0, 1, False),
        ("2", 1, False),
        (None, 0, False),
    ],
)
def test_whole_number(value, low, ok):
    assert whole_number(value, low) is ok


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (0, True),
        (2.5, True),
        (-1e300, True),
        (float("nan"), False),
        (float("inf"), False),
        (True, False),
        ("1", False),
        (None, False),
    ],
)
def test_finite_number(value, ok):
    assert finite_number(value) is ok
