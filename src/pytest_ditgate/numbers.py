"""One test of "a real number" for every value the plugin reads back from records, options and traces."""

from __future__ import annotations

import math
from typing import Any


def finite_number(value: Any) -> bool:
    """An int or float that is finite and not a bool (JSON's true is an int to Python, and NaN passes ``<``)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
