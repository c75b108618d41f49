"""populace.analysis for simulations other than the ratio game, on databases written by the
recorder's real `Store` from hand-written `SimulationTables` (no dependency on the built-in
public-goods or vote packages):

- a grouped numeric simulation (a public-goods game: groups of 4, measure `contribution`),
  whose class is defined here and loaded by import path, so its report hints are used (summary
  titles, a reference column, equilibrium, range);
- a categorical one (a vote: measure `choice`) whose package is not installed, so it is read
  from its tables alone;
- a categorical one with more distinct answers than a table can show.

Every expected number is computed here from the raw rows with numpy/scipy."""

from __future__ import annotations

import html
import json
import re
from collections import Counter

import duckdb
import numpy as np
import pytest
from pydantic import BaseModel, Field
from scipy import stats as st
from typer.testing import CliRunner

from populace.analysis import (
    OTHER,
    AnalysisError,
    convergence_table,
    export_parquet,
    group_spread,
    group_table,
    histogram,
    render_report,
    round_table,
    run_info,
)
from populace.analysis.queries import MAX_GROUP_LINES, MAX_OPTIONS
from populace.core.contracts import (
    Column,
    ConfigRef,
    OutcomeBatch,
    RoundResult,
    RunConfig,
    RunDone,
    RunStarted,
    SimulationTables,
    SpawnBatch,
)
from populace.sdk import Agent, Env, GroupEnv, Outcome, Params, Partial, Simulation, Summary
from populace.store.store import Event, Store

EDU = ("high school", "Ph.D.")
ENDOWMENT = 20
MULTIPLIER = 1.6
K = 4  # group size
OPTIONS = ("yes", "no", "abstain")
P_VOTE = {"high school": (0.6, 0.3, 0.1), "Ph.D.": (0.2, 0.7, 0.1)}


# --- a grouped public-goods simulation, declared here --------------------------------------
class Contribution(Outcome):
    contribution: int | None = None
    payoff: float | None = None
    measure = "contribution"


class Game(BaseModel):
    endowment: int = ENDOWMENT


class GoodsParams(Params):
    game: Game = Game()


class GoodsSummary(Summary):
    mean_contribution: float | None = Field(None, title="mean contribution")
    mean_payoff: float | None = Field(None, title="mean payoff")
    groups: int = Field(0, title="groups")


class Contributor(Agent):
    async def turn(self, obs, llm):  # pragma: no cover - never played here
        return Contribution(contribution=0)


class GoodsPartial(Partial):
    total: int = 0


class GoodsEnv(Env):
    Partial = GoodsPartial

    def reduce(self, agent_ids, outcomes):  # pragma: no cover
        return GoodsPartial(total=sum(o.contribution or 0 for o in outcomes))

    def merge(self, partials):  # pragma: no cover
        return GoodsPartial(total=sum(p.total for p in partials))

    def decide(self, state, round, total):  # pragma: no cover
        return state, GoodsSummary()


class Group(GroupEnv):
    def settle(self, round, group, agent_ids, outcomes):  # pragma: no cover
        return None


class GoodsSim(Simulation):
    name = "test-goods"
    Params = GoodsParams
    Agent = Contributor
    Env = GoodsEnv
    GroupEnv = Group
    Outcome = Contribution
    Summary = GoodsSummary
    outcome_table = "test_goods_outcomes"
    summary_table = "test_goods_rounds"
    reference_columns = ("mean_contribution",)

    def group_size(self) -> int:
        return K

    @classmethod
    def equilibrium(cls, params: GoodsParams) -> float:
        return 0.0  # free riding: contributing nothing is the dominant strategy when m < k

    @classmethod
    def measure_range(cls, params: GoodsParams) -> tuple[float, float]:
        return 0.0, float(params.game.endowment)


GOODS_SIM = f"{__name__}:GoodsSim"  # loaded by import path, as a user's own package would be
GOODS = SimulationTables(
    simulation="test-goods", outcomes="test_goods_outcomes",
    outcome_columns=[Column(name="contribution", type="BIGINT"), Column(name="payoff", type="DOUBLE")],
    rounds="test_goods_rounds",
    summary_columns=[Column(name="mean_contribution", type="DOUBLE"), Column(name="mean_payoff", type="DOUBLE"),
                     Column(name="groups", type="BIGINT")],
    grouped=True, measure="contribution", measure_kind="numeric")
VOTE = SimulationTables(
    simulation="test-vote", outcomes="test_votes", outcome_columns=[Column(name="choice", type="VARCHAR")],
    rounds="test_vote_rounds",
    summary_columns=[Column(name="leader", type="VARCHAR"), Column(name="leader_share", type="DOUBLE"),
                     Column(name="counts", type="JSON")],
    measure="choice", measure_kind="categorical")
# a vote in teams (groups of K): categorical and grouped
TEAM_VOTE = VOTE.model_copy(update={"simulation": "test-team-vote", "outcomes": "test_team_votes",
                                    "rounds": "test_team_vote_rounds", "grouped": True})
# no measure_kind: a VARCHAR measure is categorical
POLL = SimulationTables(
    simulation="test-poll", outcomes="test_poll", outcome_columns=[Column(name="answer", type="VARCHAR")],
    rounds="test_poll_rounds", summary_columns=[], measure="answer")


# --- writing runs through the recorder ------------------------------------------------------
def _personas(agents: int, seed: int) -> bytes:
    rng = np.random.default_rng(100 + seed)
    return "\n".join(json.dumps({"profile": {"education": EDU[a % 2], "age": int(rng.integers(18, 80))},
                                 "persona": {"name": f"Agent {a}"}}) for a in range(agents)).encode()


def _ingest(store: Store, run_id: str, tables: SimulationTables, simulation: str, agents: int, rounds: int,
            seed: int, play, population: bool = True, extra: dict | None = None) -> None:
    """`play(round, rng) -> (columns, valid, summary, group_ids)`; one outcome batch per round
    split over two hosts, as the fleet would send it."""
    cfg = RunConfig.model_validate({"simulation": simulation, "agents": agents, "rounds": rounds, "seed": seed,
                                    **({"population": {"personas": "p.jsonl"}} if population else {}),
                                    **(extra or {})})
    half = agents // 2
    events = [Event(f"{run_id}.started", "started",
                    RunStarted(run_id=run_id, config=cfg, started_at=1.7e9 + seed, hosts=["a", "b"], tables=tables),
                    blob=_personas(agents, seed) if population else None),
              Event(f"{run_id}.spawn.a", "spawn", SpawnBatch(run_id=run_id, host_id="a", ranges=[(0, half)],
                                                             config_ref=ConfigRef.of(cfg))),
              Event(f"{run_id}.spawn.b", "spawn", SpawnBatch(run_id=run_id, host_id="b",
                                                             ranges=[(half, agents - half)], config_ref=ConfigRef.of(cfg)))]
    rng = np.random.default_rng(seed)
    for r in range(1, rounds + 1):
        columns, valid, summary, group_ids = play(r, rng)
        for host, lo, hi in (("a", 0, half), ("b", half, agents)):
            events.append(Event(f"{run_id}.{r}.{host}", "outcomes", OutcomeBatch(
                run_id=run_id, round=r, host_id=host, seq=0, agent_ids=list(range(lo, hi)),
                columns={k: v[lo:hi] for k, v in columns.items()}, valid=valid[lo:hi],
                raws=["<b>bad</b>" if not ok else "ok" for ok in valid[lo:hi]], latency_ms=[5.0] * (hi - lo),
                errors=[None] * (hi - lo), group_ids=group_ids[lo:hi] if group_ids else None)))
        events.append(Event(f"{run_id}.{r}.result", "round.result", RoundResult(
            run_id=run_id, round=r, n=agents, n_valid=sum(valid), summary=summary, observation={},
            closed_at=1.7e9 + r)))
    events.append(Event(f"{run_id}.done", "done", RunDone(run_id=run_id, status="completed", rounds=rounds,
                                                          finished_at=1.7e9 + 99)))
    store.ingest(events)


def _goods_play(agents: int):
    groups = [a // K for a in range(agents)]  # the last group may be smaller, never dropped

    def play(r, rng):
        contrib: list[int | None] = []
        for a in range(agents):
            base = (14 if EDU[a % 2] == "high school" else 4) + 1.5 * (groups[a] % 5) - 2 * (r - 1)
            c = int(np.clip(round(base + rng.normal(0, 3)), 0, ENDOWMENT))
            contrib.append(None if (a * 3 + r) % 11 == 0 else c)
        pots: dict[int, int] = Counter()
        sizes: dict[int, int] = Counter(groups)
        for a, c in enumerate(contrib):
            pots[groups[a]] += c or 0
        payoff = [ENDOWMENT - (c or 0) + MULTIPLIER * pots[groups[a]] / sizes[groups[a]] for a, c in enumerate(contrib)]
        good = [c for c in contrib if c is not None]
        summary = {"mean_contribution": sum(good) / len(good), "mean_payoff": float(np.mean(payoff)),
                   "groups": len(sizes)}
        return {"contribution": contrib, "payoff": payoff}, [c is not None for c in contrib], summary, groups
    return play


def _vote_play(agents: int):
    def play(r, rng):
        choice = [None if a % 13 == 0 else str(rng.choice(OPTIONS, p=P_VOTE[EDU[a % 2]])) for a in range(agents)]
        counts = Counter(c for c in choice if c is not None)
        top = max(counts.values())
        leaders = [o for o in OPTIONS if counts[o] == top]
        summary = {"leader": leaders[0] if len(leaders) == 1 else None, "leader_share": top / sum(counts.values()),
                   "counts": {o: counts[o] for o in OPTIONS}}
        return {"choice": choice}, [c is not None for c in choice], summary, None
    return play


def _team_vote_play(agents: int):
    vote = _vote_play(agents)

    def play(r, rng):
        columns, valid, summary, _ = vote(r, rng)
        return columns, valid, summary, [a // K for a in range(agents)]
    return play


def _poll_play(agents: int):
    def play(r, rng):
        # 15 distinct answers: opt00 12 times, opt01 … opt14 twice each (ties: by text)
        answers = ["opt00"] * 12 + [f"opt{i:02d}" for i in range(1, 15) for _ in range(2)]
        assert len(answers) == agents
        return {"answer": answers}, [True] * agents, {}, None
    return play


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("sims") / "populace.duckdb"
    store = Store(path)
    game = {"game": {"endowment": ENDOWMENT}}
    _ingest(store, "goods-1", GOODS, GOODS_SIM, 40, 3, 1, _goods_play(40), extra=game)
    _ingest(store, "goods-2", GOODS, GOODS_SIM, 40, 3, 2, _goods_play(40), extra=game)
    _ingest(store, "goods-small", GOODS, GOODS_SIM, 10, 3, 3, _goods_play(10), population=False, extra=game)
    _ingest(store, "vote-1", VOTE, "test-vote", 60, 3, 4, _vote_play(60))
    _ingest(store, "vote-2", VOTE, "test-vote", 60, 3, 5, _vote_play(60))
    _ingest(store, "poll", POLL, "test-poll", 40, 1, 6, _poll_play(40), population=False)
    _ingest(store, "team-vote", TEAM_VOTE, "test-team-vote", 24, 2, 7, _team_vote_play(24))
    store.close()
    return path


@pytest.fixture
def con(db):
    with duckdb.connect(str(db), read_only=True) as c:
        yield c


def _rows(con, table: str, run_id: str, round_: int, column: str):
    """(agent_id, group_id or None, value, education) of the valid answers of one round."""
    group = "o.group_id" if table == GOODS.outcomes else "NULL"
    return con.execute(
        f"SELECT o.agent_id, {group}, o.{column}, p.profile->>'$.education' FROM {table} o "
        "LEFT JOIN agent_profiles p USING (run_id, agent_id) WHERE o.run_id = ? AND o.round = ? AND o.valid "
        "ORDER BY o.agent_id", [run_id, round_]).fetchall()


def _figures(page: str) -> list[dict]:
    """The report's figures: each plot's Plotly JSON (its data-figure attribute, unescaped)."""
    return [json.loads(html.unescape(m)) for m in re.findall(r'<div class="plot"[^>]* data-figure="([^"]*)"', page)]


def _own_markup(page: str) -> str:
    """The page without the inlined plotly.js bundle (whose source names URLs it never loads)."""
    start = page.index('<script id="plotly-js">')
    return page[:start] + page[page.index("</script>", start):]


# --- the grouped numeric simulation --------------------------------------------------------
def test_the_hand_written_tables_are_what_the_class_declares():
    assert GoodsSim.tables() == GOODS


def test_goods_run_info_uses_the_loaded_class(con):
    info = run_info(con, "goods-1")
    assert info["loaded"] and info["note"] is None and not info["legacy"]
    assert (info["simulation"], info["measure"], info["measure_kind"], info["grouped"]) == (
        GOODS_SIM, "contribution", "numeric", True)
    assert info["noun"] == "contribution"  # the outcome class holds two columns: the measure names it
    assert info["labels"] == {"mean_contribution": "mean contribution", "mean_payoff": "mean payoff",
                              "groups": "groups"}
    assert info["equilibrium"] == 0.0 and info["measure_range"] == [0.0, 20.0]
    assert info["reference_columns"] == ["mean_contribution"] and info["description"] is None
    assert info["params"] == {"game": {"endowment": ENDOWMENT}}


def test_goods_round_table_matches_numpy(con):
    table = round_table(con, "goods-1")
    assert [r["round"] for r in table] == [1, 2, 3]
    for row in table:
        v = np.array([x[2] for x in _rows(con, GOODS.outcomes, "goods-1", row["round"], "contribution")], float)
        invalid = sum(1 for a in range(40) if (a * 3 + row["round"]) % 11 == 0)
        assert (row["n"], row["n_valid"], row["n_invalid"]) == (40, v.size, invalid)
        assert row["mean"] == pytest.approx(v.mean()) and row["median"] == pytest.approx(np.median(v))
        assert row["std"] == pytest.approx(v.std(ddof=1))
        assert (row["min"], row["max"]) == (v.min(), v.max())
        assert row["summary"]["mean_contribution"] == pytest.approx(v.mean())
        assert row["summary"]["groups"] == 10
    assert table[0]["mean"] > table[-1]["mean"]  # contributions decay over rounds, as built


def test_goods_group_spread_is_quantiles_of_the_group_means(con):
    spread = group_spread(con, "goods-1")
    assert spread["n_groups"] == 10 > MAX_GROUP_LINES and spread["lines"] is None
    assert spread["value"] == "mean contribution"
    for row in spread["rounds"]:
        by_group: dict[int, list[float]] = {}
        for _, g, v, _ in _rows(con, GOODS.outcomes, "goods-1", row["round"], "contribution"):
            by_group.setdefault(g, []).append(v)
        means = np.array([np.mean(v) for v in by_group.values()])
        assert row["n_groups"] == means.size == 10
        for key, p in (("q10", 0.1), ("q25", 0.25), ("median", 0.5), ("q75", 0.75), ("q90", 0.9)):
            assert row[key] == pytest.approx(np.quantile(means, p)), key  # linear interpolation, as quantile_cont
        assert (row["min"], row["max"]) == (pytest.approx(means.min()), pytest.approx(means.max()))
        assert row["mean"] == pytest.approx(means.mean())
    assert max(r["max"] - r["min"] for r in spread["rounds"]) > 3  # groups really differ, as built


def test_few_groups_get_one_line_each_including_the_smaller_last_group(con):
    spread = group_spread(con, "goods-small")
    assert spread["n_groups"] == 3 and sorted(spread["lines"]) == [0, 1, 2]
    for gid, points in spread["lines"].items():
        for r, value in points:
            v = [x[2] for x in _rows(con, GOODS.outcomes, "goods-small", r, "contribution") if x[1] == gid]
            assert value == pytest.approx(np.mean(v))
    assert len(spread["lines"][2]) == 3  # agents 8 and 9: the smaller last group is kept


def test_goods_group_table_two_runs_student_t(con):
    rows = group_table(con, ["goods-1", "goods-2"], "education")
    assert [r["group"] for r in rows] == ["high school", "Ph.D."]
    for row in rows:
        per_run = {rid: np.array([x[2] for x in _rows(con, GOODS.outcomes, rid, 3, "contribution")
                                  if x[3] == row["group"]], float) for rid in ("goods-1", "goods-2")}
        pooled = np.concatenate(list(per_run.values()))
        half = st.t.ppf(0.975, pooled.size - 1) * pooled.std(ddof=1) / np.sqrt(pooled.size)
        assert row["n"] == pooled.size and row["mean"] == pytest.approx(pooled.mean())
        assert (row["ci_low"], row["ci_high"]) == (pytest.approx(pooled.mean() - half),
                                                   pytest.approx(pooled.mean() + half))
        means = np.array([per_run[r].mean() for r in per_run])
        shalf = st.t.ppf(0.975, 1) * means.std(ddof=1) / np.sqrt(2)
        assert row["seed_mean"] == pytest.approx(means.mean()) and row["n_runs"] == 2
        assert (row["seed_ci_low"], row["seed_ci_high"]) == (pytest.approx(means.mean() - shalf),
                                                             pytest.approx(means.mean() + shalf))
    assert rows[0]["mean"] > rows[1]["mean"]  # Ph.D.s contribute less, as built


def test_histogram_is_binned_in_the_database_like_numpy(con):
    edges, counts = histogram(con, "goods-1", [1, 3], -0.5, 20.5, 21)
    for r in (1, 3):
        v = np.array([x[2] for x in _rows(con, GOODS.outcomes, "goods-1", r, "contribution")], float)
        expected, np_edges = np.histogram(v, bins=21, range=(-0.5, 20.5))
        assert counts[r].tolist() == expected.tolist()
        assert edges == pytest.approx(np_edges)
    # values outside the range land in the end bins; the last bin is closed
    _, clipped = histogram(con, "goods-1", [1], 5, 10, 5)
    v = np.array([x[2] for x in _rows(con, GOODS.outcomes, "goods-1", 1, "contribution")], float)
    assert clipped[1][0] == (v < 6).sum() and clipped[1][-1] == (v >= 9).sum()
    with pytest.raises(AnalysisError, match="lo < hi"):
        histogram(con, "goods-1", [1], 5, 5, 3)


def test_goods_report_draws_rounds_groups_and_personas(con):
    page = render_report(con, "goods-1")
    # the four of a numeric measure, and its distribution per group (whole contributions 0..20)
    assert len(_figures(page)) == 5
    assert "Distribution of contribution per group" in page
    assert not re.search(r"https?://", _own_markup(page)) and "<script src" not in page and "<link" not in page
    for title in ("Figure 1. Contributions per round", "Figure 2. Mean contribution per group",
                  "Figure 3. Convergence over rounds",
                  "Figure 4. Mean contribution per round, overall and per group", "By education", "By age"):
        assert title in page, title
    assert 'aria-label="Histogram of contributions per round with the mean contribution"' in page
    assert "quantile bands of the group values" in page and "10 groups in the run" in page
    assert "<th>mean contribution</th>" in page and "<th>mean payoff</th>" in page  # Summary titles
    assert "<td>equilibrium</td><td>0</td>" in page and "game.endowment=20" in page
    # the persona groups' Student-t CIs, as computed
    for row in group_table(con, "goods-1", "education"):
        assert f"[{row['ci_low']:,.2f}, {row['ci_high']:,.2f}]" in page
    assert "&lt;b&gt;bad&lt;/b&gt;" in page  # raw answers escaped
    small = render_report(con, "goods-small")
    assert len(_figures(small)) == 3  # no population: no group bars; one line per group
    assert "one line per group" in small and "no population profiles" in small


# --- the categorical simulation (its package is not installed here) --------------------------
def test_vote_run_info_falls_back_to_the_tables(con):
    info = run_info(con, "vote-1")
    assert not info["loaded"] and "test-vote" in info["note"] and "not loadable" in info["note"]
    assert (info["measure"], info["measure_kind"], info["noun"], info["equilibrium"]) == (
        "choice", "categorical", "choice", None)
    assert info["labels"] == {"leader": "leader", "leader_share": "leader share", "counts": "counts"}


def test_vote_round_table_counts_and_shares(con):
    for row in round_table(con, "vote-1"):
        got = Counter(x[2] for x in _rows(con, VOTE.outcomes, "vote-1", row["round"], "choice"))
        n = sum(got.values())
        assert row["n"] == 60 and row["n_valid"] == n == 60 - len(range(0, 60, 13))
        assert sorted(row["options"]) == sorted(OPTIONS)  # every option answered in the run
        assert row["counts"] == {o: got[o] for o in row["options"]}
        assert row["shares"] == {o: pytest.approx(got[o] / n) for o in row["options"]}
        top = max(got.values())
        assert row["leader"] == (got.most_common(1)[0][0] if list(got.values()).count(top) == 1 else None)
        assert row["leader_share"] == pytest.approx(top / n)
        assert row["summary"]["counts"] == {o: got[o] for o in OPTIONS}  # the JSON column, parsed
        assert "mean" not in row
    # options come most frequent first, over the whole run
    total = Counter(x[0] for x in con.execute("SELECT choice FROM test_votes WHERE run_id = 'vote-1' AND valid")
                    .fetchall())
    assert round_table(con, "vote-1")[0]["options"] == [o for o, _ in sorted(total.items(), key=lambda t: (-t[1], t[0]))]



def test_declared_options_are_listed_in_the_schemas_order_not_by_frequency(tmp_path):
    """A run whose tables declare its options (issue 25): every table lists them in that order,
    an option nobody chose included, whatever answer is most frequent."""
    declared = ["abstain", "maybe later", "no", "yes"]  # "no" is the most chosen, "maybe later" never
    path = tmp_path / "declared.duckdb"
    store = Store(path)
    _ingest(store, "declared", VOTE.model_copy(update={"measure_options": declared}), "test-vote", 60, 2, 4,
            _vote_play(60))
    store.close()
    with duckdb.connect(str(path), read_only=True) as c:
        rows = round_table(c, "declared")
        assert [r["options"] for r in rows] == [declared, declared]
        assert rows[0]["counts"]["maybe later"] == 0
        assert [r["option"] for r in group_table(c, "declared", "education")] == declared * len(EDU)


def test_vote_group_table_wilson_interval_per_option(con):
    rows = group_table(con, "vote-1", "education")
    valid = _rows(con, VOTE.outcomes, "vote-1", 3, "choice")
    # every option for every group (zeros included), groups in order, options in the round table's order
    assert [r["group"] for r in rows] == [g for g in EDU for _ in OPTIONS]
    order = round_table(con, "vote-1")[0]["options"]
    assert [r["option"] for r in rows] == order * len(EDU) and set(order) == set(OPTIONS)
    for r in rows:
        answers = [x[2] for x in valid if x[3] == r["group"]]
        k = answers.count(r["option"])
        ci = st.binomtest(k, len(answers)).proportion_ci(confidence_level=0.95, method="wilson")
        assert (r["n"], r["count"]) == (len(answers), k)
        assert r["share"] == pytest.approx(k / len(answers))
        assert (r["ci_low"], r["ci_high"]) == (pytest.approx(ci.low), pytest.approx(ci.high))
        assert r["run_shares"] is None and r["seed_mean"] is None
    share = {(r["group"], r["option"]): r["share"] for r in rows}
    assert share[("high school", "yes")] > share[("Ph.D.", "yes")]  # as built


def test_vote_group_table_across_runs(con):
    rows = group_table(con, ["vote-1", "vote-2"], "education", round=2)
    for r in rows:
        per_run = {}
        for rid in ("vote-1", "vote-2"):
            answers = [x[2] for x in _rows(con, VOTE.outcomes, rid, 2, "choice") if x[3] == r["group"]]
            per_run[rid] = answers.count(r["option"]) / len(answers)
        shares = np.array(list(per_run.values()))
        half = st.t.ppf(0.975, 1) * shares.std(ddof=1) / np.sqrt(2)
        assert r["run_shares"] == {rid: pytest.approx(v) for rid, v in per_run.items()}
        assert r["seed_mean"] == pytest.approx(shares.mean())
        # Student-t across the 2 runs, cut to the possible shares [0, 1]
        assert (r["seed_ci_low"], r["seed_ci_high"]) == (pytest.approx(max(0.0, shares.mean() - half)),
                                                         pytest.approx(min(1.0, shares.mean() + half)))
        assert 0.0 <= r["seed_ci_low"] <= r["seed_mean"] <= r["seed_ci_high"] <= 1.0


def test_vote_report_has_share_figures_and_wilson_cis(con):
    page = render_report(con, "vote-1")
    assert len(_figures(page)) == 3
    assert not re.search(r"https?://", _own_markup(page)) and "<script src" not in page
    for title in ("Figure 1. Choices per round", "Figure 2. Share of each choice per group",
                  "Figure 3. Convergence over rounds", "By education", "Wilson"):
        assert title in page, title
    own = _own_markup(page)  # plotly.js's source names every trace type, histograms too
    assert "Figure 4" not in own and "histogram" not in own.lower()
    assert "not loadable here" in page  # the reader is told why there is no theory drawn
    for r in group_table(con, "vote-1", "education"):
        assert f"{100 * r['share']:.1f}% [{100 * r['ci_low']:.1f}%, {100 * r['ci_high']:.1f}%]" in page
    assert "<th>most chosen</th>" in page and "<th>leader share</th>" in page  # ours, and the summary's
    first = round_table(con, "vote-1")[0]
    assert f"<td>{first['leader']} ({100 * first['leader_share']:.1f}%)</td>" in page


def test_many_answers_are_capped_with_other(con):
    [row] = round_table(con, "poll")
    assert len(row["options"]) == MAX_OPTIONS and row["options"][-1] == OTHER
    assert row["options"][:3] == ["opt00", "opt01", "opt02"]
    assert sum(row["counts"].values()) == 40
    assert row["options"][MAX_OPTIONS - 2] == f"opt{MAX_OPTIONS - 2:02d}"  # the last one kept
    assert row["counts"]["opt00"] == 12 and row["counts"][OTHER] == 2 * (15 - (MAX_OPTIONS - 1))
    assert len(_figures(render_report(con, "poll"))) == 2  # no population: shares per round and over rounds


def test_grouped_categorical_spread_is_each_groups_share_of_the_leading_answer(con):
    [first, *_] = round_table(con, "team-vote")
    top = first["options"][0]
    spread = group_spread(con, "team-vote")
    assert spread["option"] == top and spread["value"] == f"share of {top}" and spread["n_groups"] == 6
    for gid, points in spread["lines"].items():
        for r, value in points:
            answers = [c for a, _, c, _ in _rows(con, TEAM_VOTE.outcomes, "team-vote", r, "choice") if a // K == gid]
            assert value == pytest.approx(answers.count(top) / len(answers))
    other = group_spread(con, "team-vote", option=first["options"][1])
    assert other["option"] == first["options"][1] and other["rounds"] != spread["rounds"]
    page = render_report(con, "team-vote")
    assert f"Figure 4. Share of {top} per round, overall and per group" in page
    assert len(_figures(page)) == 4 and "one line per group" in page


# --- across simulations -------------------------------------------------------------------
def test_convergence_follows_the_measure(con):
    goods = convergence_table(con, "goods-1")
    assert [r["round"] for r in goods] == [1, 2, 3]
    assert all(r["distance"] == pytest.approx(r["mean"]) for r in goods)  # equilibrium 0
    assert all(r["mean_contribution"] == pytest.approx(r["mean"]) for r in goods)  # the reference column
    votes = convergence_table(con, "vote-1")
    assert set(votes[0]) == {"run_id", "round", "n_valid", "leader", "leader_share", "shares"}


def test_errors_name_the_runs_and_what_is_wrong(con):
    with pytest.raises(AnalysisError, match=r"runs 'goods-1' and 'vote-1' cannot be compared.*'contribution'"
                                            r".*'choice'"):
        group_table(con, ["goods-1", "vote-1"], "education")
    with pytest.raises(AnalysisError, match=r"run 'vote-1': simulation 'test-vote' has no groups"):
        group_spread(con, "vote-1")
    with pytest.raises(AnalysisError, match=r"'choice' is categorical"):
        histogram(con, "vote-1", [1], 0, 1, 2)
    with pytest.raises(AnalysisError, match=r"round 7 is not in run 'vote-1' \(rounds 1..3\)"):
        group_table(con, ["vote-1", "vote-2"], "education", round=7)


def test_export_writes_each_simulations_own_tables(con, tmp_path):
    paths = export_parquet(con, ["goods-1", "vote-1", "vote-2"], tmp_path / "pq")
    names = {p.name for p in paths}
    assert names == {"runs.parquet", "agents.parquet", "agent_profiles.parquet", "llm_calls.parquet",
                     "test_goods_outcomes.parquet", "test_goods_rounds.parquet", "test_votes.parquet",
                     "test_vote_rounds.parquet"}
    count = {p.stem: duckdb.execute(f"SELECT count(*) FROM read_parquet('{p}')").fetchone()[0] for p in paths}
    assert count["test_goods_outcomes"] == 120 and count["test_votes"] == 2 * 180 and count["runs"] == 3
    cols = [r[0] for r in duckdb.execute(f"DESCRIBE SELECT * FROM read_parquet('{tmp_path / 'pq' / 'test_goods_outcomes.parquet'}')").fetchall()]
    assert cols[:4] == ["run_id", "round", "agent_id", "group_id"] and "payoff" in cols
    tables = duckdb.execute(f"SELECT tables_json FROM read_parquet('{tmp_path / 'pq' / 'runs.parquet'}') "
                            "WHERE run_id = 'vote-1'").fetchone()[0]
    assert json.loads(tables)["measure"] == "choice"  # the export says which file holds what


# --- the CLI ------------------------------------------------------------------------------
def _cli(*args: str):
    from populace.cli.main import app

    return CliRunner().invoke(app, list(args), env={"COLUMNS": "250"})


def _table_rows(output: str) -> list[list[str]]:
    """A rich table's body rows, cell by cell."""
    return [[c.strip() for c in line.strip("│").split("│")] for line in output.splitlines() if line.startswith("│")]


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def test_cli_results_for_a_categorical_run(db, con):
    res = _cli("results", "vote-1", "--db", str(db))
    assert res.exit_code == 0, res.output
    # per round: valid answers, the leading option and each option's share, counted here from the votes
    rounds = [r for r in _table_rows(res.output) if len(r) == 3 + len(OPTIONS) + 2]  # … and the summary's leader
    assert [r[0] for r in rounds] == ["1", "2", "3"], res.output
    for r in rounds:
        votes = Counter(v for _, _, v, _ in _rows(con, VOTE.outcomes, "vote-1", int(r[0]), "choice"))
        n = sum(votes.values())
        (leader, top), *_ = sorted(votes.items(), key=lambda kv: -kv[1])
        shares = {o: votes[o] / n for o in OPTIONS}
        assert r[1] == f"{n}/60" and r[2] == f"{leader} ({_pct(top / n)})", r
        shown = dict(zip(res.output.split("most chosen", 1)[1].split("┃")[1:1 + len(OPTIONS)], r[3:3 + len(OPTIONS)], strict=True))
        assert {o.strip(): v for o, v in shown.items()} == {o: _pct(shares[o]) for o in OPTIONS}, r
        assert r[-2:] == [leader, f"{top / n:.2f}"]  # the environment's summary: the same leader
    res = _cli("results", "vote-1", "vote-2", "--by", "education", "--db", str(db))
    assert res.exit_code == 0, res.output
    # per group and option: answers pooled over both runs and their share, with a Wilson CI and a CI
    # across the two runs inside [0%, 100%]
    rows = [r for r in _table_rows(res.output) if len(r) == 8]
    assert len(rows) == len(EDU) * len(OPTIONS), res.output
    group = ""
    for r in rows:
        group = r[0] or group  # a group's name is on its first option's row
        votes = Counter(v for run in ("vote-1", "vote-2") for _, _, v, edu in _rows(con, VOTE.outcomes, run, 3, "choice")
                        if edu == group)
        n = sum(votes.values())
        assert r[2:4] == [f"{votes[r[1]]}/{n}", _pct(votes[r[1]] / n)], r
        assert r[5] == "2"
        for ci in (r[4], r[7]):
            lo, hi = (float(x.rstrip("%")) for x in ci.strip("[]").split(", "))
            assert 0 <= lo <= hi <= 100, r


def test_cli_results_json_and_errors(db):
    res = _cli("results", "goods-1", "--json", "--db", str(db))
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    [run] = data["runs"]
    assert run["measure"] == "contribution" and run["labels"]["mean_payoff"] == "mean payoff"
    assert [r["round"] for r in run["rounds"]] == [1, 2, 3] and run["rounds"][0]["mean"] > 0
    res = _cli("results", "goods-1", "--by", "education", "--json", "--db", str(db))
    groups = json.loads(res.stdout)["groups"]
    assert [g["group"] for g in groups] == list(EDU) and groups[0]["ci_low"] < groups[0]["mean"]
    res = _cli("results", "goods-1", "vote-1", "--by", "education", "--db", str(db))
    assert res.exit_code == 2 and "cannot be compared" in res.output
    res = _cli("results", "goods-1", "--round", "2", "--db", str(db))
    assert res.exit_code == 2 and "--round" in res.output
