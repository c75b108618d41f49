"""A sweep's summary (populace.client.sweep.summary): per cell, the last round's key column
across seeds with a 95% Student-t CI, checked against figures computed by hand; and the plain
Python t quantile it uses, against scipy's."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from rich.console import Console
from scipy import stats

from populace.cli.display import sweep_plan_table, sweep_summary_table
from populace.client.sweep import plan, summary
from populace.client.t_interval import mean_ci, t_quantile


def row(cell: str, seed: int, rnd: int | None, mean: float | None, n: int = 10, n_valid: int = 10) -> dict:
    return {"sweep": "s", "cell": cell, "run_id": f"r-{cell}-{seed}", "status": "completed", "seed": seed,
            "round": rnd, "n": n, "n_valid": n_valid, "mean": mean, "target": None if mean is None else 2 * mean}


ROWS = [
    # cell a: three seeds, last round 3 holds 30, 40, 50 (earlier rounds must not count)
    *(row("a", s, r, 99.0 * r) for s in (1, 2, 3) for r in (1, 2)),
    row("a", 1, 3, 30.0), row("a", 2, 3, 40.0, n_valid=8), row("a", 3, 3, 50.0),
    # cell b: two seeds, 10 and 14 in round 2 (the rows arrive out of order)
    row("b", 1, 2, 10.0), row("b", 1, 1, -5.0), row("b", 2, 2, 14.0), row("b", 2, 1, -5.0),
    # cell c: one seed played, one stalled (a row without a round)
    row("c", 1, 1, 7.0),
    {**row("c", 2, None, None), "status": "stalled: no progress", "n": None, "n_valid": None},
]


def test_each_cell_has_the_mean_and_95_ci_of_its_last_rounds():
    got = {s["cell"]: s for s in summary(ROWS)}
    assert set(got) == {"a", "b", "c"}
    a, b, c = got["a"], got["b"], got["c"]
    # a: mean 40, sample sd 10, t(0.975, 2 df) = 4.302652729749464: half-width 4.3027 · 10/√3
    assert (a["key"], a["runs"], a["last_round"]) == ("mean", 3, 3)
    assert a["mean"] == pytest.approx(40.0)
    assert (a["ci_low"], a["ci_high"]) == pytest.approx((40.0 - 24.841377117503313, 40.0 + 24.841377117503313))
    assert a["valid"] == pytest.approx(28 / 30)
    # b: mean 12, sd 2√2, se 2, t(0.975, 1 df) = 12.706204736174703
    assert (b["runs"], b["last_round"]) == (2, 2)
    assert (b["mean"], b["ci_low"], b["ci_high"]) == pytest.approx((12.0, 12.0 - 25.412409472349406,
                                                                     12.0 + 25.412409472349406))
    # c: one seed has no interval; the stalled run is not a run of the cell's summary
    assert (c["runs"], c["mean"], c["ci_low"], c["ci_high"]) == (1, 7.0, None, None)


def test_a_run_whose_last_round_has_no_value_is_left_out_of_the_mean():
    rows = [row("a", 1, 2, 30.0), row("a", 2, 2, None, n_valid=0), row("a", 3, 2, 50.0)]
    (a,) = summary(rows)
    assert (a["runs"], a["mean"]) == (3, pytest.approx(40.0))
    # two values: sd 10√2, se 10, t(0.975, 1 df) = 12.706204736174703
    assert (a["ci_low"], a["ci_high"]) == pytest.approx((40.0 - 127.06204736174703, 40.0 + 127.06204736174703))


def test_no_numeric_column_gives_dashes_not_an_error():
    rows = [{**row("a", s, 1, None), "target": None} for s in (1, 2)]
    (a,) = summary(rows)
    assert (a["key"], a["mean"], a["ci_low"]) == (None, None, None)


def rendered(table) -> dict[str, list[str]]:
    """A rich table's body rows as {first cell: the other cells}."""
    console = Console(width=200, record=True)
    console.print(table)
    return {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in console.export_text().splitlines() if line.count("│") > 4}


def test_the_printed_table_carries_the_numbers():
    lines = rendered(sweep_summary_table(ROWS, "s"))
    assert lines["a"] == ["3", "3", "40.00", "[15.16, 64.84]", "93%"]
    assert lines["b"] == ["2", "2", "12.00", "[-13.41, 37.41]", "100%"]
    assert lines["c"] == ["1", "1", "7.00", "—", "100%"]


def test_the_t_quantile_is_scipys():
    for df in (*range(1, 41), 57, 100, 333, 1000):
        for level in (0.5, 0.9, 0.95, 0.99):
            assert t_quantile(level, df) == pytest.approx(stats.t.ppf(0.5 + level / 2, df), rel=1e-12), (df, level)


def test_mean_ci_matches_the_analysis_library():
    from populace.analysis.stats import mean_ci as analysis_mean_ci

    values = [3.5, None, 1.25, math.nan, 8.0, 2.0, 2.0]
    mine, theirs = mean_ci(values), analysis_mean_ci(values)
    assert (mine["n"], mine["mean"]) == (theirs["n"], pytest.approx(theirs["mean"]))
    assert (mine["low"], mine["high"]) == pytest.approx((theirs["low"], theirs["high"]), rel=1e-12)
    assert mean_ci([]) == {"mean": None, "low": None, "high": None, "n": 0}


@pytest.mark.parametrize("level, df", [(0, 3), (1, 3), (0.95, 0)])
def test_t_quantile_refuses_what_has_no_answer(level, df):
    with pytest.raises(ValueError):
        t_quantile(level, df)


def test_the_plan_lists_every_run_with_its_cell_seed_and_size():
    sp = plan(Path(__file__).resolve().parents[2] / "examples" / "sweeps" / "ratios.yaml")
    cells = ["game={ratio: 2/3}", "game={ratio: 1/2, offset: 5}"]
    assert rendered(sweep_plan_table(sp)) == {
        str(i): [cells[i // 3], str(1 + i % 3), "50", "3", "dummy"] for i in range(6)}
