"""Human reference data that ships (issue 37, item 9): the ratio game carries Nagel's (1995)
first-period summaries for p = 1/2, 2/3 and 4/3 with their citation. A run's report puts its
round-1 mean and median, each with its 95% interval, beside the people's figures of its own
treatment; a run of a game Nagel did not play says so. `results --reference` reads a file of
summaries too, and a file with absurd numbers is refused in one line, exit 2. Runs recorded by the
recorder's Store from local runs (tests/integration/recorded_locally.py)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import duckdb
import pytest
from recorded_locally import play, record
from scipy import stats

from populace.analysis.reference import builtin_references, compare, load_reference
from populace.analysis.report.page import render_report
from populace.client.prepare import prepare
from populace.core.contracts import RunConfig

pytestmark = pytest.mark.integration

NAGEL = Path(__import__("populace_ratio_game").__file__).parent / "references" / "nagel-1995.csv"
CITATION = ("Nagel, R. (1995). Unraveling in Guessing Games: An Experimental Study. American Economic Review 85(5), "
            "1313–1326.")
RUNS = {"two-thirds": "2/3", "half": "0.5", "fifty-one": "51/100"}


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("nagel") / "runs.duckdb"
    for run_id, ratio in RUNS.items():
        prepared = prepare(RunConfig.model_validate({"simulation": "ratio-game", "agents": 150, "rounds": 2,
                                                     "seed": 3, "game": {"ratio": ratio}}))
        record(path, prepared, play(prepared), run_id)
    return path


def round_one(db: Path, run_id: str) -> list[float]:
    with duckdb.connect(str(db), read_only=True) as con:
        return [v for (v,) in con.execute("SELECT value FROM guesses WHERE run_id = ? AND round = 1 AND valid AND "
                                          "value IS NOT NULL", [run_id]).fetchall()]


def test_the_ratio_game_ships_nagels_first_period_with_its_citation():
    ref = load_reference(NAGEL)
    assert ref.citation == CITATION and ref.synthetic is None and ref.kind == "summaries"
    figures = {dict(k[5])["game.ratio"]: (v["n"], v["mean"], v["median"]) for k, v in ref.summaries.items()}
    assert figures == {"1/2": (48, 27.05, 17), "2/3": (67, 36.73, 33), "4/3": (51, 60.12, 66)}
    assert all(k[:4] == ("measure", "value", None, 1) for k in ref.summaries)  # round 1: the first period


def test_a_run_meets_the_row_of_its_own_treatment_with_its_mean_and_median_and_their_intervals(db):
    with duckdb.connect(str(db), read_only=True) as con:
        [nagel] = builtin_references(con, "two-thirds")
        [row] = compare(con, ["two-thirds"], nagel)
        [half] = compare(con, ["half"], nagel)  # 0.5 is the paper's 1/2, by value
    xs = sorted(round_one(db, "two-thirds"))
    n = len(xs)
    mean, sd = statistics.fmean(xs), statistics.stdev(xs)
    t = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    # the median's interval, from the binomial directly: the widest symmetric ranks (j, n+1-j)
    # whose central binomial mass is still at least 95%
    j = max(j for j in range(1, n // 2 + 1) if stats.binom.cdf(n - j, n, 0.5) - stats.binom.cdf(j - 1, n, 0.5) >= 0.95)
    assert row["params"] == {"game.ratio": "2/3", "game.offset": "0", "game.max_value": "100"}
    assert (row["round"], row["n_sim"], row["n_ref"]) == (1, n, 67)
    assert math.isclose(row["mean_sim"], mean) and math.isclose(row["sd_sim"], sd)
    assert math.isclose(row["mean_sim_low"], mean - t) and math.isclose(row["mean_sim_high"], mean + t)
    assert row["median_sim"] == statistics.median(xs)
    assert (row["median_sim_low"], row["median_sim_high"]) == (xs[j - 1], xs[n - j])
    assert (row["mean_ref"], row["median_ref"]) == (36.73, 33)
    assert math.isclose(row["mean_diff"], 36.73 - mean)
    assert row["mean_inside"] == (mean - t <= 36.73 <= mean + t)
    assert half["params"]["game.ratio"] == "1/2" and (half["mean_ref"], half["n_ref"]) == (27.05, 48)


def test_the_report_of_a_ratio_game_run_shows_nagel_beside_the_runs_figures(db):
    with duckdb.connect(str(db), read_only=True) as con:
        html = render_report(con, "two-thirds")
        [row] = compare(con, ["two-thirds"], load_reference(NAGEL))
        other = render_report(con, "fifty-one")
    assert "Against human data (shipped with the simulation)" in html
    assert CITATION in html and "measure value, round 1 (game.ratio = 2/3, game.offset = 0, game.max_value = 100)" in html
    part = html[html.index("measure value, round 1 (game.ratio = 2/3"):]
    mean_row = (f'<td class="l">mean</td><td>{row["mean_sim"]:,.2f}</td><td>[{row["mean_sim_low"]:,.2f}, '
                f'{row["mean_sim_high"]:,.2f}]</td><td>36.73</td><td>{row["n_sim"]:,}</td><td>67</td>')
    median_row = (f'<td class="l">median</td><td>{row["median_sim"]:,.2f}</td><td>[{row["median_sim_low"]:,.2f}, '
                  f'{row["median_sim_high"]:,.2f}]</td><td>33.00</td>')
    assert mean_row in part and median_row in part
    # a game Nagel did not play: said, nothing compared
    assert "no row of Nagel, R. (1995)" in other and "game.ratio = 51/100" in other
    assert "round 1 (game.ratio" not in other


def test_populace_report_writes_it_with_no_flag(db, tmp_path, cli):
    out = tmp_path / "report.html"
    res = cli("report", "two-thirds", "--db", str(db), "--out", str(out))
    assert res.returncode == 0, res.stderr
    html = out.read_text()
    assert CITATION in html and '<td class="l">mean</td>' in html and "<td>36.73</td><td>" in html


def test_results_reads_a_file_of_summaries_and_refuses_absurd_numbers_in_one_line(db, tmp_path, cli):
    res = cli("results", "two-thirds", "--db", str(db), "--reference", str(NAGEL), "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    [row] = out["rows"]
    assert out["source"] == CITATION and row["kind"] == "summary" and row["mean_ref"] == 36.73
    assert row["n_sim"] == len(round_one(db, "two-thirds"))
    table = cli("results", "two-thirds", "--db", str(db), "--reference", str(NAGEL), env={"COLUMNS": "250"})
    assert table.returncode == 0 and "36.73" in table.stdout and "33.00" in table.stdout
    for text, says in (
        ("n,mean,median\nvalue,67,1e300,33\n", "line 3: mean: '1e300' is not finite or is over 1,000,000,000,000"),
        ("n,mean,median\nvalue,6.5,36,33\n", "line 3: n: '6.5' is not a whole number of people"),
        ("n,mean,median,answer\nvalue,6,36,33,1\n", "one kind of row per file"),
    ):
        bad = tmp_path / "absurd.csv"
        bad.write_text("# synthetic: absurd numbers\nmeasure," + text)
        for command in (("results", "two-thirds"), ("report", "two-thirds", "--out", str(tmp_path / "r.html"))):
            res = cli(*command, "--db", str(db), "--reference", str(bad))
            assert res.returncode == 2, (command, res.stdout, res.stderr)
            assert says in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
