# SPDX-License-Identifier: BSD-3-Clause
"""What the product's parsers accept as a number from JSON or TOML, in one place: Python's bool is an
int (``True == 1``), so a file's ``true`` must not pass for a count, and NaN or infinity for a time."""

import math
from typing import TypeGuard


def whole_number(value, low: int) -> TypeGuard[int]:
    """An int (not a bool) of at least ``low``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def finite_number(value) -> bool:
    """An int or float (not a bool) that is finite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
