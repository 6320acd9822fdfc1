"""The one table printer, jaxil.runs.measure.format_table, that the
benchmarks and every program's results table use."""

import pytest

from jaxil.runs.measure import format_table
from jaxil.runs.summary import mean_std


def test_format_table_aligns_columns_marks_missing_values_and_joins_fields():
    """Each column is as wide as its widest cell (header included), numbers
    right-aligned and text columns (`"<"`) left-aligned, a missing or NaN
    value printed as `-`, and a tuple key formatted from all its fields
    (a mean ± std cell). Fails if a width is fixed or taken from the header
    only, if NaN prints as `nan ± nan`, or if the fields of a tuple key are
    passed in another order."""
    rows = [dict(name="bc", n=3, return_mean=-0.347, return_std=0.011),
            dict(name="misodice", n=12, return_mean=1.004, return_std=float("nan")),
            dict(name="x")]
    table = format_table(rows, [("name", "learner", "{}", "<"), ("n", "seeds", "{}"),
                                mean_std("return", "return")])
    assert table.splitlines() == [
        "learner   seeds          return",
        "--------  -----  --------------",
        "bc            3  -0.347 ± 0.011",
        "misodice     12               -",
        "x             -               -",
    ]
    assert format_table([], [("a", "alpha", "{:.1f}")]) == "alpha\n-----"
    with pytest.raises(ValueError, match="a column is"):
        format_table(rows, [("n", "seeds", "{}", "^")])
