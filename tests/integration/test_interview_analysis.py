"""Interviews in the analysis and the report, on runs recorded by the recorder's Store: each
question's distribution overall and per group (Wilson shares, Student-t means), across
replicate runs, panels over rounds, free text searched; reference data beside a run with a
distance and its bootstrap interval, and bad reference files refused naming what is wrong."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from pathlib import Path

import duckdb
import pytest
from example_copies import example_copy
from recorded_locally import play, record

from populace.analysis.interviews import interview_table, interview_usage, panel_table, search_answers
from populace.analysis.reference import ReferenceError, compare, distance, load_reference
from populace.analysis.report.page import render_report
from populace.client.prepare import prepare_file

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
WIDE = {"COLUMNS": "250"}  # rich tables: one line per row
PANEL = [
    {"id": "panel", "after": "every", "questions": [
        {"id": "trust", "text": "How much do you trust the other voters?", "labels": ["none", "some", "a lot"]},
        {"id": "turnout", "text": "Will you vote in the next election?", "options": ["yes", "no", "maybe"]}]},
    {"id": "exit", "after": [3], "mode": "together", "questions": [
        {"id": "sure", "text": "How sure are you of your vote, from 0 to 100?", "min": 0, "max": 100},
        {"id": "why", "text": "Why did you vote as you did?", "max_chars": 120}]},
]


def table_rows(stdout: str) -> list[list[str]]:
    """A rich table's body rows, cell by cell."""
    return [[c.strip() for c in line.strip("│").split("│")] for line in stdout.splitlines() if line.startswith("│")]


def answers_by_group(db: Path, run_id: str, after_round: int) -> dict[tuple[str, str], Counter]:
    """(question, education) → the valid answers after that round, counted from table interviews."""
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT i.question, p.profile->>'education', i.answer FROM interviews i JOIN agent_profiles p "
                           "USING (run_id, agent_id) WHERE i.run_id = ? AND i.after_round = ? AND i.valid",
                           [run_id, after_round]).fetchall()
    out: dict[tuple[str, str], Counter] = {}
    for question, group, answer in rows:
        out.setdefault((question, group), Counter())[answer] += 1
    return out


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """Two replicate runs of the vote example with a panel (seeds 1 and 2), recorded."""
    path = tmp_path_factory.mktemp("analysis") / "populace.duckdb"
    for seed in (1, 2):
        prepared = prepare_file(example_copy(path.parent, "vote.yaml", agents=100, seed=seed, interviews=PANEL,
                                             model={"latency_s": 0.0, "seed": seed}))
        record(path, prepared, play(prepared), f"vote-{seed}")
    return path


def test_each_question_overall_per_group_and_across_runs(db):
    with duckdb.connect(str(db), read_only=True) as con:
        rows = interview_table(con, "vote-1")
        by = interview_table(con, "vote-1", by="education")
        both = interview_table(con, ["vote-1", "vote-2"], by="education")
        usage = interview_usage(con, "vote-1")
    turnout = [r for r in rows if r["question"] == "turnout"]
    assert [r["option"] for r in turnout] == ["yes", "no", "maybe"] and {r["after_round"] for r in turnout} == {3}
    assert sum(r["count"] for r in turnout) == 100 and math.isclose(sum(r["share"] for r in turnout), 1.0)
    assert all(r["ci_low"] <= r["share"] <= r["ci_high"] for r in turnout)
    trust = [r for r in rows if r["question"] == "trust"]
    mean = next(r for r in trust if r["option"] is None)
    assert 1 <= mean["ci_low"] <= mean["mean"] <= mean["ci_high"] <= 3
    assert [r["option"] for r in trust if r["option"]] == ["1", "2", "3"]  # a Likert's points are its options
    groups = [r["group"] for r in by if r["question"] == "sure"]
    assert groups == ["elementary school", "high school", "bachelor's", "master's", "Ph.D."]
    assert all(r["n"] == 20 for r in by if r["question"] == "sure")
    text = [r for r in rows if r["question"] == "why"]
    assert text[0]["n_valid"] == 100 and text[0]["examples"]
    across = next(r for r in both if r["question"] == "turnout" and r["group"] == "Ph.D." and r["option"] == "yes")
    assert set(across["run_values"]) == {"vote-1", "vote-2"} and across["seed_ci_low"] is not None
    assert usage["answers"] == 100 * 2 * 3 + 100 * 2 and usage["valid"] == usage["answers"]


def test_panels_over_rounds_and_free_text(db):
    with duckdb.connect(str(db), read_only=True) as con:
        panels = panel_table(con, "vote-1", by="education")
        found = search_answers(con, "vote-1", ["dummy"])
    trust = [r for r in panels if r["question"] == "trust"]
    assert sorted({r["after_round"] for r in trust}) == [1, 2, 3] and all(r["option"] is None for r in trust)
    assert {r["group"] for r in trust} == {"elementary school", "high school", "bachelor's", "master's", "Ph.D."}
    assert {r["question"] for r in panels} == {"trust", "turnout"}  # `exit` was asked once: no panel
    assert found and all("(dummy)" in (r["answer"] or r["raw"]) for r in found)


def test_the_report_shows_interviews_and_a_reference(db):
    ref = load_reference(FIXTURES / "reference-turnout-synthetic.csv")
    with duckdb.connect(str(db), read_only=True) as con:
        html = render_report(con, "vote-1", by=["education"], reference=ref)
        two = render_report(con, ["vote-1", "vote-2"])
    for title in ("Interview 1. panel/trust", "Interview 2. panel/turnout", "Interview 3. exit/sure",
                  "Panels over rounds", "Interview answers in the agents&#39; words", "Against reference data",
                  "SYNTHETIC (made up for Populace&#39;s tests"):
        assert title in html, title
    assert "Interview 2. panel/turnout" in two and "across the runs (each one replicate)" in two
    # the numbers: each group's answers to turnout after round 3, counted here, and the reference's
    # total variation from them
    counts = answers_by_group(db, "vote-1", 3)
    turnout = html[html.index('<section id="interview-2">'):html.index('<section id="interview-3">')]
    reference = html[html.index("<h3>turnout, after round 3</h3>"):]
    wanted = {g: {a: int(c) for q, gg, a, c in (line.split(",") for line in (
        FIXTURES / "reference-turnout-synthetic.csv").read_text().splitlines()[3:]) if q == "turnout" and gg == g}
        for g in ("elementary school", "Ph.D.")}
    for group in ("elementary school", "high school", "bachelor's", "master's", "Ph.D."):
        got = counts["turnout", group]
        n, cell = sum(got.values()), group.replace("'", "&#39;")
        for answer in ("yes", "no", "maybe"):
            assert (f'<td class="l">{cell}</td><td class="l">{answer}</td><td>{got[answer]}/{n}</td>'
                    f"<td>{100 * got[answer] / n:.1f}%</td>") in turnout, (group, answer)
        if group in wanted:
            ref = wanted[group]
            tv = 0.5 * sum(abs(got[a] / n - ref[a] / sum(ref.values())) for a in ("yes", "no", "maybe"))
            assert (f'<td class="l">{cell}</td><td>{n}</td><td>{sum(ref.values())}</td><td></td>'
                    f'<td class="l">total variation</td><td>{tv:.3f}</td>') in reference, group


def test_a_reference_beside_a_run(db):
    ref = load_reference(FIXTURES / "reference-turnout-synthetic.csv")
    assert ref.synthetic and ref.groups == ["education"]
    with duckdb.connect(str(db), read_only=True) as con:
        rows = compare(con, "vote-1", ref, n_boot=200)
        votes = compare(con, "vote-1", load_reference(FIXTURES / "reference-vote-synthetic.csv"), n_boot=200)
    phd = next(r for r in rows if r["question"] == "turnout" and r["group"] == "Ph.D.")
    assert phd["n_sim"] == 20 and phd["n_ref"] == 100 and phd["distance_kind"] == "total variation"
    assert math.isclose(phd["distance"], 0.5 * sum(abs(phd["simulated"].get(k, 0) - phd["reference"][k])
                                                   for k in ("yes", "no", "maybe")))
    assert phd["ci_low"] <= phd["distance"] <= phd["ci_high"]
    trust = next(r for r in rows if r["question"] == "trust" and r["group"] == "Ph.D.")
    assert trust["distance_kind"] == "Wasserstein-1" and trust["mean_ref"] == 2.3
    assert {r["group"] for r in rows if r["question"] == "trust"} == {"elementary school", "Ph.D."}
    (vote,) = votes
    assert vote["target"] == "measure" and vote["group"] == "all" and vote["n_ref"] == 6 and vote["n_sim"] == 100


def test_distances():
    assert distance("options", {"a": 1, "b": 1}, {"a": 2, "b": 2}) == 0
    assert distance("options", {"a": 5}, {"b": 3}) == 1
    assert distance("number", {"1": 1, "3": 1}, {"2": 2}) == 1.0  # every unit of mass moves by 1
    assert distance("number", {"0": 1}, {"10": 4}) == 10.0


@pytest.mark.parametrize(("text", "says"), [
    ("question,answer\nq,1\n", "citation: the file names no source of its data"),
    ("# citation: x\nquestion,answer,weight\nq,1,2\n", "column 'weight' is not one of"),
    ("# citation: x\nquestion,answer,count\nq,1,-2\n", "line 3: count: '-2' is negative"),
    ("# citation: x\nquestion,count\nq,2\n", "column `answer` is missing"),
    ("# citation: x\n# groups: age\nquestion,answer\nq,1\n", "groups: 'age' is listed but is not a column"),
    ("# citation: x\nquestion,measure,answer\nq,m,1\n", "give one of the columns `question`"),
    ("# citation: x\nquestion,answer,round\nq,1,two\n", "round: 'two' is not a round number"),
])
def test_bad_reference_files_are_refused_naming_what_is_wrong(tmp_path, text, says):
    path = tmp_path / "ref.csv"
    path.write_text(text)
    with pytest.raises(ReferenceError, match=says.replace("(", r"\(")):
        load_reference(path)


def test_a_reference_that_does_not_fit_the_run_is_refused_by_the_cli(db, tmp_path, cli):
    """In process (the `cli` fixture): `results` only reads the file."""
    path = tmp_path / "ref.csv"
    path.write_text("# synthetic: test\nquestion,answer\nnever-asked,yes\n")
    res = cli("results", "vote-1", "--db", str(db), "--reference", str(path))
    assert res.returncode == 2 and "question: 'never-asked' was not asked in run(s) vote-1" in res.stderr
    res = cli("results", "vote-1", "--db", str(db), "--reference", str(FIXTURES / "reference-turnout-synthetic.csv"),
              env=WIDE)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("reference: SYNTHETIC (made up for Populace's tests")
    # per question and group: the answers on both sides and the distance, computed here from the
    # recorded answers and the reference file (its bootstrap interval around it)
    ref: dict[tuple[str, str], Counter] = {}
    for line in (FIXTURES / "reference-turnout-synthetic.csv").read_text().splitlines()[3:]:
        question, group, answer, count = line.split(",")
        ref.setdefault((question, group), Counter())[answer] = int(count)
    sim = answers_by_group(db, "vote-1", 3)
    rows = table_rows(res.stdout)
    assert {(r[0], r[1]) for r in rows} == {(f"{q} (after round 3)", g) for q, g in ref}, res.stdout
    for question, group, n_sim, n_ref, _, kind, value, ci in rows:
        q = question.split(" ")[0]
        got, want = sim[q, group], ref[q, group]
        shares = [{k: c[k] / sum(c.values()) for k in set(got) | set(want)} for c in (got, want)]
        if q == "turnout":  # total variation: half the sum of the share differences
            expected, label = 0.5 * sum(abs(shares[0][k] - shares[1][k]) for k in shares[0]), "total variation"
        else:  # Wasserstein-1 on the scale's points, one unit apart: the area between the CDFs
            cdf = [[sum(s.get(str(v), 0) for v in range(1, x + 1)) for x in (1, 2)] for s in shares]
            expected, label = sum(abs(a - b) for a, b in zip(*cdf, strict=True)), "Wasserstein-1"
        assert (n_sim, n_ref, kind) == (str(sum(got.values())), str(sum(want.values())), label)
        assert value == f"{expected:.2f}", (question, group, value, expected)
        lo, hi = (float(x) for x in ci.strip("[]").split(", "))
        assert lo <= round(expected, 2) <= hi


def test_the_cli_prints_each_questions_answers_per_group(db, cli):
    """`results --interviews --by`: the shares and means it prints are those of the recorded answers
    (counted here; Student-t CIs of the means computed here)."""
    from scipy import stats

    res = cli("results", "vote-1", "--interviews", "--by", "education", "--db", str(db), env=WIDE)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    turnout = table_rows(out[out.index("panel/turnout (options)"):out.index("exit/sure (number)")])
    counts = answers_by_group(db, "vote-1", 3)
    group = ""
    for row in turnout:
        group = row[0] or group  # a group's name is on its first answer's row
        got = counts["turnout", group]
        n = sum(got.values())
        assert row[2:4] == [f"{got[row[1]]}/{n}", f"{100 * got[row[1]] / n:.1f}%"], row
    assert len(turnout) == 5 * 3
    with duckdb.connect(str(db), read_only=True) as con:
        sure = con.execute("SELECT p.profile->>'education', i.value FROM interviews i JOIN agent_profiles p "
                           "USING (run_id, agent_id) WHERE i.run_id = 'vote-1' AND i.question = 'sure' AND i.valid"
                           ).fetchall()
    rows = table_rows(out[out.index("exit/sure (number)"):out.index("exit/why (text)")])
    assert len(rows) == 5
    for group, point, answers, mean, ci in rows:
        values = [v for g, v in sure if g == group]
        half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
        m = statistics.mean(values)
        assert (point, answers, mean, ci) == ("mean", f"{len(values)}/{len(values)}", f"{m:.2f}",
                                              f"[{m - half:.2f}, {m + half:.2f}]"), group


def test_a_parquet_reference_carries_its_citation_in_its_metadata(db, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"question": ["turnout"] * 3, "answer": ["yes", "no", "maybe"], "count": [5, 3, 2]})
    path = tmp_path / "ref.parquet"
    pq.write_table(table.replace_schema_metadata({"synthetic": "a test's", "groups": ""}), path)
    ref = load_reference(path)
    with duckdb.connect(str(db), read_only=True) as con:
        (row,) = compare(con, "vote-1", ref, n_boot=100)
    assert row["group"] == "all" and row["n_ref"] == 10 and row["source"] == "SYNTHETIC (a test's)"
    pq.write_table(table, path)
    with pytest.raises(ReferenceError, match="citation: the file names no source"):
        load_reference(path)


