"""`populace interview` and the interview tables of `populace results --interviews`.

    populace interview RUN --after-round 2 --question "Do you trust the others?" --likert 4 --by education
    populace interview RUN --after-round 3 --survey survey.yaml --sample 0.1
    populace interview examples/opinion.yaml --local --after-round 2 --question "Why?" --max-chars 200

On the fleet the agent-hosts answer from the round's checkpoint (the orchestrator places the
request; nothing of the run changes). With --local, RUN is a scenario: it is played in this
process on the dummy model (what the fleet gives, exactly) and asked after the round from the
state it kept."""

# No `from __future__ import annotations` (typer evaluates string ones at each start: populace.cli.main)
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from populace.cli import display
from populace.cli.common import NATS_DEFAULT, read_db

if TYPE_CHECKING:
    from rich.table import Table

# pydantic, the client and the core are imported where a command needs them: `populace
# --version` does not load them (tests/unit/test_cli_imports.py)


def fmt(x: object) -> str:
    from populace.client.progress import fmt as client_fmt

    return client_fmt(x)


def _fail(message: str, code: int = 2) -> None:
    display.console.print(f"[red]error:[/red] {message}", soft_wrap=True, markup=True, highlight=False)
    raise typer.Exit(code)


def _split(text: str | None, flag: str) -> list[str] | None:
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    if not all(parts):
        _fail(f"{flag}: an empty item in {text!r} (comma-separated)")
    return parts


def _survey(question: str | None, qid: str, options: str | None, likert: int | None, labels: str | None,
            range_: str | None, integer: bool, max_chars: int | None, survey_file: Path | None, survey_id: str,
            together: bool):
    """The survey the flags describe, each bad one refused naming its flag."""
    from pydantic import ValidationError

    from populace.core.contracts import Question, Survey
    from populace.core.scenario import ScenarioError, format_validation_error, load_yaml_mapping

    if (question is None) == (survey_file is None):
        _fail("--question, --survey: give one question (--question TEXT) or a survey file (--survey FILE)")
    if survey_file is not None:
        try:
            data, _ = load_yaml_mapping(survey_file, "survey")
        except ScenarioError as err:
            _fail(f"--survey: {err}")
        try:
            survey = Survey.model_validate({"id": survey_id, **data})
        except ValidationError as err:
            where = f"--survey {survey_file}: "
            _fail(where + format_validation_error(err).replace("\n", "\n" + where))
        return survey.model_copy(update={"mode": "together"}) if together else survey
    kinds = [flag for flag, given in (("--options", options), ("--likert", likert), ("--labels", labels),
                                      ("--range", range_), ("--max-chars", max_chars)) if given is not None]
    if len({k if k != "--labels" else "--likert" for k in kinds}) > 1:
        _fail(f"{', '.join(kinds)}: one kind of answer per question")
    spec: dict = {"id": qid, "text": question}
    if options is not None:
        spec["options"] = _split(options, "--options")
    if likert is not None or labels is not None:
        spec["kind"] = "likert"
        if likert is not None:
            spec["points"] = likert
        if labels is not None:
            spec["labels"] = _split(labels, "--labels")
    if range_ is not None:
        bounds = _split(range_, "--range")
        try:
            lo, hi = (float(b) for b in bounds)  # type: ignore[union-attr]
        except ValueError:
            _fail(f"--range: {range_!r} is not LOW,HIGH (two numbers)")
        spec.update(kind="number", min=lo, max=hi, integer=integer)
    elif integer:
        _fail("--integer: only with --range")
    if max_chars is not None:
        spec.update(kind="text", max_chars=max_chars)
    flag = {"text": "--question", "options": "--options", "points": "--likert", "labels": "--labels",
            "min": "--range", "max": "--range", "max_chars": "--max-chars", "id": "--id"}
    try:
        q = Question.model_validate(spec)
    except ValidationError as err:
        lines = format_validation_error(err).splitlines()
        _fail("\n".join(_flagged(line, flag) for line in lines))
    return Survey(id=survey_id, questions=[q], mode="together" if together else "each")


def _flagged(line: str, flags: dict[str, str]) -> str:
    """A validation line `field: …` (or `min, max: …`) with the CLI's flag instead of the field."""
    head, sep, rest = line.partition(": ")
    names = [h.strip() for h in head.split(",")]
    if sep and all(n in flags for n in names):
        return f"{', '.join(dict.fromkeys(flags[n] for n in names))}: {rest}"
    return line


def interview(
    run: Annotated[str, typer.Argument(help="the run's id, or 'last' (--local: a scenario file)")],
    after_round: Annotated[int, typer.Option("--after-round", help="ask the agents as they were after this round")],
    question: Annotated[str | None, typer.Option(help="the question's text")] = None,
    qid: Annotated[str, typer.Option("--id", help="the question's id (its column value)")] = "q1",
    options: Annotated[str | None, typer.Option(help="answer: one of these options, comma-separated")] = None,
    likert: Annotated[int | None, typer.Option(help="answer: a point of a Likert scale of this many points")] = None,
    labels: Annotated[str | None, typer.Option(help="the Likert scale's labels, one per point, comma-separated")
                      ] = None,
    range_: Annotated[str | None, typer.Option("--range", help="answer: a number in LOW,HIGH")] = None,
    integer: Annotated[bool, typer.Option(help="--range: whole numbers only")] = False,
    max_chars: Annotated[int | None, typer.Option(help="answer: free text of at most this many characters "
                                                       "(the default kind, 500)")] = None,
    survey_file: Annotated[Path | None, typer.Option("--survey", help="a survey YAML: questions: [{id, text, …}], "
                                                                     "mode")] = None,
    survey_id: Annotated[str, typer.Option("--survey-id", help="the survey's id (its column value)")] = "interview",
    together: Annotated[bool, typer.Option(help="ask every question in one call (default: one call each)")] = False,
    sample: Annotated[float | None, typer.Option(help="ask a seeded share of the agents, in (0, 1]")] = None,
    agents: Annotated[str | None, typer.Option(help="ask these agent ids only, comma-separated")] = None,
    by: Annotated[str | None, typer.Option(help="show the answers per group of this profile attribute")] = None,
    db: Annotated[str, typer.Option(help="DuckDB file the recorder writes (the answers are read from it)")
                  ] = "populace.duckdb",
    nats: Annotated[str, typer.Option("--nats", envvar="POPULACE_NATS_URL", help="NATS URL of the run's stack")
                    ] = NATS_DEFAULT,
    local: Annotated[bool, typer.Option(help="RUN is a scenario: play it in this process (dummy model), then ask")
                     ] = False,
    timeout: Annotated[float, typer.Option(min=1, help="seconds to wait for every answer")] = 600.0,
    json_out: Annotated[bool, typer.Option("--json", help="print the answers' summary as JSON")] = False,
) -> None:
    """Ask agents questions after the fact, as they were after a round, without changing the
    run: no round is played, no checkpoint written, each agent answers on a copy of its state,
    its calls seeded apart from the run's. Prints the answers per question (and --by group);
    they are recorded in table `interviews`."""
    from populace.client.interviews import InterviewRefused, check_who

    survey = _survey(question, qid, options, likert, labels, range_, integer, max_chars, survey_file, survey_id,
                     together)
    ids = None
    if agents is not None:
        try:
            ids = [int(a) for a in _split(agents, "--agents") or []]
        except ValueError:
            _fail(f"--agents: {agents!r} is not a list of agent ids")
    try:
        check_who(sample, ids)
    except InterviewRefused as err:
        _fail(str(err))
    if local:
        con, run_id = _local(Path(run), after_round, survey, sample, ids)
        _show(con, [run_id], by, json_out, title=f"after round {after_round} — local run {run_id}",
              after_round=after_round, survey=survey.id)
    else:
        _fleet(run, after_round, survey, sample, ids, db, nats, timeout, by, json_out)


def _local(scenario: Path, after_round: int, survey, sample, ids):
    from populace.analysis.interviews import local_database
    from populace.client import simulate
    from populace.client.interviews import InterviewRefused, interview
    from populace.client.prepare import prepare_file
    from populace.core.scenario import ScenarioError

    try:
        prepared = prepare_file(scenario)
    except ScenarioError as err:
        _fail(str(err))
    if prepared.config.model.backend != "dummy":
        _fail(f"model.backend: --local plays on the dummy model; {prepared.config.model.backend!r} needs the fleet")
    if not 1 <= after_round <= prepared.config.rounds:
        _fail(f"--after-round: round {after_round} is not one of the run's rounds (1..{prepared.config.rounds})")
    if ids is not None and (bad := [a for a in ids if not 0 <= a < prepared.config.agents]):
        _fail(f"--agents: agent {bad[0]} is not in the run (ids are 0..{prepared.config.agents - 1})")
    result = simulate(prepared, local=True)
    try:
        table = interview(result, after_round=after_round, survey=survey, sample=sample, agents=ids)
    except InterviewRefused as err:
        _fail(str(err))
    profiles = [p.profile for p in result.local.cast.personas] if result.local.cast is not None else None
    rows = table.to_pydict()
    con = local_database(result.run_id, prepared.config.model_dump_json(), rows, [(after_round, survey)], profiles)
    display.console.print(f"local run {result.run_id} of {scenario} ({prepared.config.agents:,} agents × "
                          f"{prepared.config.rounds} rounds, dummy model): {table.num_rows:,} answers after round "
                          f"{after_round}", highlight=False, soft_wrap=True)
    return con, result.run_id


def _fleet(run: str, after_round: int, survey, sample, ids, db: str, nats: str, timeout: float, by: str | None,
           json_out: bool) -> None:
    import asyncio

    from populace.client.interviews import InterviewFailed, InterviewRefused, ask
    from populace.core import bus

    def placed_again(placed) -> None:
        display.console.print(f"request {placed.request}: {placed.reason}", highlight=False, soft_wrap=True)

    async def go():
        nc = await bus.connect_or_fail(nats, "populace-interview")
        try:
            rid = await _last_run(nc) if run == "last" else run
            return rid, await ask(nc, rid, after_round, survey, sample=sample, agents=ids, timeout_s=timeout,
                                  on_placed=placed_again)
        finally:
            await nc.close()

    try:
        run_id, done = asyncio.run(go())
    except InterviewRefused as err:
        _fail(str(err))
    except (ConnectionError, TimeoutError, InterviewFailed) as err:
        _fail(str(err), code=1)
    path = db if Path(db).exists() else done.recorded.db_path
    display.console.print(f"request {done.placed.request}: {done.recorded.answers:,} answers after round "
                          f"{after_round}, by agent-hosts {', '.join(sorted(done.placed.hosts))}; table interviews "
                          f"in {path}", highlight=False, soft_wrap=True)
    with read_db(path, [run_id], nats) as con:
        _show(con, [run_id], by, json_out, title=f"after round {after_round} — run {run_id}",
              after_round=after_round, survey=survey.id, request=done.placed.request)


async def _last_run(nc) -> str:
    from populace.core import bus, subjects
    from populace.core.contracts import RunState

    states = await bus.registry_entries(nc.jetstream(), subjects.RUNS_BUCKET, RunState, strict=True)
    if not states:
        _fail("RUN: no run on this stack")
    return max(states, key=lambda s: s.updated_at).run_id


def _show(con, run_ids: list[str], by: str | None, json_out: bool, title: str, after_round: int | None = None,
          survey: str | None = None, request: str | None = None) -> None:
    from populace.analysis import AnalysisError
    from populace.analysis.interviews import interview_table

    try:
        rows = interview_table(con, run_ids, by=by, after_round=after_round, survey=survey, request=request)
    except AnalysisError as err:
        _fail(f"--by: {err}")
    if json_out:
        print(json.dumps({"runs": run_ids, "by": by, "rows": rows}, default=str, indent=1))
        return
    for table in interview_tables(rows, title, by, across_runs=len(run_ids) > 1):
        display.out.print(table)


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def _ci(low: float | None, high: float | None, pct: bool) -> str:
    if low is None or high is None:
        return "—"
    return f"[{_pct(low)}, {_pct(high)}]" if pct else f"[{fmt(low)}, {fmt(high)}]"


def interview_tables(rows: list[dict], title: str, by: str | None, across_runs: bool = False) -> "list[Table]":
    """One table per question: each option's share with its Wilson 95% CI, a Likert's or a
    number's mean with its Student-t 95% CI, or a free-text question's count and a few answers;
    per group with `by`; with several runs, the same across runs."""
    from rich.text import Text

    out: list[Table] = []
    keys = list(dict.fromkeys((r["survey"], r["question"], r["after_round"]) for r in rows))
    for key in keys:
        qrows = [r for r in rows if (r["survey"], r["question"], r["after_round"]) == key]
        first = qrows[0]
        heading = f"{first['survey']}/{first['question']} ({first['kind']}): {first['text']} — {title}"
        t = display.table(title=Text(heading), title_justify="left")
        if by:
            t.add_column(Text(by))
        if first["kind"] == "text":
            for col in ("valid answers", "some answers"):
                t.add_column(col)
            for r in qrows:
                t.add_row(*([Text(r["group"])] if by else []), f"{r['n_valid']}/{r['n_asked']}",
                          Text(" | ".join(a[:60] for a in r["examples"])))
            out.append(t)
            continue
        for col in ("answer", "answers", "share / mean", "95% CI (agents)"):
            t.add_column(col, justify="right")
        if across_runs:
            for col in ("runs", "mean of runs", "95% CI (runs)"):
                t.add_column(col, justify="right")
        for i, r in enumerate(qrows):
            share = r["option"] is not None
            newgroup = i == 0 or qrows[i - 1]["group"] != r["group"]
            cells = ([Text(r["group"]) if newgroup else ""] if by else [])
            if share:
                cells += [Text(r["option"]), f"{r['count']}/{r['n']}", _pct(r["share"]),
                          _ci(r["ci_low"], r["ci_high"], True)]
            else:
                cells += [Text("mean"), f"{r['n_valid']}/{r['n_asked']}", fmt(r["mean"]),
                          _ci(r["ci_low"], r["ci_high"], False)]
            if across_runs:
                vals = r.get("run_values") or {}
                cells += [str(len(vals)), _pct(r["seed_mean"]) if share else fmt(r["seed_mean"]),
                          _ci(r["seed_ci_low"], r["seed_ci_high"], share)]
            last = i == len(qrows) - 1 or qrows[i + 1]["group"] != r["group"]
            t.add_row(*cells, end_section=bool(by) and last)
        out.append(t)
    return out


def usage_line(u: dict | None) -> str | None:
    """The interviews' LLM work, apart from the rounds' (a line under `populace results`)."""
    if not u:
        return None
    cost = f", {display.money(u['dollars'])}" if u.get("dollars") else ""
    return (f"interviews: {u['answers']:,} answers ({u['valid']:,} valid), {u['llm_calls']:,} LLM calls, "
            f"{u['prompt_tokens'] + u['completion_tokens']:,} tokens ({u['prompt_tokens']:,} prompt, "
            f"{u['completion_tokens']:,} completion){cost} — apart from the rounds' LLM work above")


def reference_table(rows: list[dict], title: str) -> "Table":
    """Simulated beside reference per question and group: the sample sizes, the most different
    answer's shares (or the means), the distance and its 95% bootstrap interval; a file of
    summaries figure by figure (`summary_table`)."""
    from rich.text import Text

    if rows and all(r["kind"] == "summary" for r in rows):
        return summary_table(rows, title)
    t = display.table(title=Text(title), title_justify="left")
    for col in ("question", "group", "simulated", "reference", "shares or means (sim / ref)", "distance", "value",
                "95% bootstrap CI"):
        t.add_column(col, justify="left" if col in ("question", "group", "distance") else "right")
    for r in rows:
        if r["kind"] == "number":
            shown = f"{fmt(r.get('mean_sim'))} / {fmt(r.get('mean_ref'))}"
        else:
            keys = set(r["simulated"]) | set(r["reference"])
            worst = max(keys, key=lambda k: abs(r["simulated"].get(k, 0) - r["reference"].get(k, 0)), default=None)
            shown = "" if worst is None else (f"{worst}: {_pct(r['simulated'].get(worst, 0))} / "
                                              f"{_pct(r['reference'].get(worst, 0))}")
        name = r["question"] if r["target"] == "question" else f"measure {r['question']}"
        t.add_row(Text(f"{name} (after round {r['round']})"), Text(r["group"]), f"{r['n_sim']:,}",
                  f"{r['n_ref']:,.0f}", Text(shown), r["distance_kind"], fmt(r["distance"]),
                  "—" if r["ci_low"] is None else f"[{fmt(r['ci_low'])}, {fmt(r['ci_high'])}]")
    return t


def summary_table(rows: list[dict], title: str) -> "Table":
    """The runs' mean and median, each with its 95% interval, beside the people's published
    figures, per reference row (its round, group and parameters)."""
    from rich.text import Text

    t = display.table(title=Text(title), title_justify="left")
    for col in ("measure or question", "group", "figure", "run", "run's 95% CI", "people", "run n", "people n",
                "people − run", "people's figure"):
        t.add_column(col, justify="left" if col in ("measure or question", "group", "figure", "people's figure")
                     else "right")
    for r in rows:
        params = ", ".join(f"{k} = {v}" for k, v in r["params"].items())
        name = r["question"] if r["target"] == "question" else f"measure {r['question']}"
        what = f"{name} (round {r['round']}{'; ' + params if params else ''})"
        for stat in ("mean", "median"):
            if r.get(f"{stat}_ref") is None:
                continue
            low, high = r.get(f"{stat}_sim_low"), r.get(f"{stat}_sim_high")
            inside = {True: "inside", False: "outside", None: "—"}[r.get(f"{stat}_inside")]
            t.add_row(Text(what), Text(r["group"]), stat, fmt(r.get(f"{stat}_sim")),
                      "—" if low is None or high is None else f"[{fmt(low)}, {fmt(high)}]", fmt(r[f"{stat}_ref"]),
                      f"{r['n_sim']:,}", f"{r['n_ref']:,}", fmt(r.get(f"{stat}_diff")), inside)
    return t
