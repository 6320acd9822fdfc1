"""Range-checked argument types for the ``jaxil`` command line.

``type=positive_int`` and friends make argparse refuse a bad value at parse
time with the allowed range in its one-line message (exit status 2), before
any data is loaded or built.
"""

from __future__ import annotations

import argparse
import math
from typing import Callable


def _number(kind: type, lo: float, hi: float, lo_open: bool, hi_open: bool) -> Callable:
    lo_s = "(" if lo_open or lo == -math.inf else "["
    hi_s = ")" if hi_open or hi == math.inf else "]"
    allowed = f"{lo_s}{lo:g}, {hi:g}{hi_s}"
    name = "an integer" if kind is int else "a number"

    def parse(text: str):
        try:
            x = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {name} in {allowed}, got {text!r}") from None
        ok = (x > lo if lo_open else x >= lo) and (x < hi if hi_open else x <= hi)
        if not ok:  # NaN fails both comparisons
            raise argparse.ArgumentTypeError(f"must be in {allowed}, got {text}")
        return x

    parse.__name__ = f"{kind.__name__} in {allowed}"
    return parse


positive_int = _number(int, 1, math.inf, False, False)
nonneg_int = _number(int, 0, math.inf, False, False)
positive_float = _number(float, 0.0, math.inf, True, False)
nonneg_float = _number(float, 0.0, math.inf, False, False)
probability = _number(float, 0.0, 1.0, False, False)
discount = _number(float, 0.0, 1.0, False, True)
