"""Reading recorded runs: `populace results` (and its --profile, --prototypes, --reference and
--interviews views), `report` and `export`. A DuckDB file a recorder is still writing is read
through a copy from the recorder (populace.cli.common.read_db)."""

# No `from __future__ import annotations` (typer evaluates string ones at each start: populace.cli.main)
import json
from pathlib import Path
from typing import Annotated

import typer

from populace.cli import checks, display, interviews, prototypes
from populace.cli.common import NATS_DEFAULT, NATS_ENV, NATS_LIVE_HELP, fail, named_runs, read_db

app = typer.Typer(rich_markup_mode=None)  # its commands join the root's (populace.cli.main)


@app.command()
def results(
    run_ids: Annotated[list[str], typer.Argument(help="run id(s), or 'last'; several runs (e.g. seeds) "
                                                      "give CIs across runs too")],
    by: Annotated[str | None, typer.Option(help="group by this profile/persona attribute, e.g. education")] = None,
    round_: Annotated[int | None, typer.Option("--round", help="round for --by (default: each run's last)")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON (for scripts) instead of tables")] = False,
    db: Annotated[str, typer.Option(help="DuckDB file")] = "populace.duckdb",
    nats: Annotated[str, typer.Option("--nats", envvar=NATS_ENV, help=NATS_LIVE_HELP)] = NATS_DEFAULT,
    interviews_: Annotated[bool, typer.Option("--interviews", help="the runs' interviews instead: each question's "
                                                                  "answers (--by: per group; --round: after that "
                                                                  "round; several runs: across them too)")] = False,
    reference: Annotated[Path | None, typer.Option(help="human reference data (CSV or Parquet, with its citation): "
                                                        "the runs beside it per group, with a distance and its "
                                                        "95% bootstrap interval")] = None,
    profile: Annotated[bool, typer.Option("--profile", help="where each round went instead (table round_profile): "
                                                            "per host the seconds in views, turns, settle/reduce/"
                                                            "merge and model wait, the views' bytes; the "
                                                            "environment's merge and decide; the recorder's "
                                                            "record")] = False,
    prototypes_: Annotated[bool, typer.Option("--prototypes", help="a prototype run's approximation instead: per "
                                                                  "round and prototype who called the model, who "
                                                                  "copied, the audits, and the divergence with its "
                                                                  "95% interval")] = False,
) -> None:
    """Per-round statistics of each run's measure (mean … max, or each option's share), its
    simulation's round summary and its LLM work: answers in, valid, the model's invalid answers
    and infrastructure retries apart, calls, re-asks, tokens, latency, the model and replicas (a
    fork: beside its parent's); or (--by) the mean, or each option's share, per group with 95% CIs."""
    from populace.analysis import (
        call_stats,
        fork_table,
        group_table,
        model_of,
        model_stats,
        prototype_summary,
        round_table,
        run_info,
        total_calls,
    )

    if profile:
        other = [flag for flag, given in (("--by", by), ("--round", round_), ("--interviews", interviews_),
                                          ("--reference", reference)) if given]
        if other:
            fail(f"--profile: not with {other[0]} (the profile shows every round of each run)")
        return _profile_results(run_ids, json_out, db, nats)
    if prototypes_:
        other = [flag for flag, given in (("--by", by), ("--round", round_), ("--interviews", interviews_),
                                          ("--reference", reference)) if given]
        if other:
            fail(f"--prototypes: not with {other[0]} (it shows every round and prototype of each run)")
        return _prototype_results(run_ids, json_out, db, nats)
    if reference is not None:
        return _reference_results(run_ids, reference, json_out, db, nats)
    if interviews_:
        return _interview_results(run_ids, by, round_, json_out, db, nats)
    if round_ is not None and by is None:
        fail("--round: only with --by (the per-round table shows every round)")
    # what a script needs to read the rows: the run's simulation, measure and summary titles
    head = ("run_id", "name", "simulation", "status", "reason", "measure", "measure_kind", "grouped", "equilibrium",
            "outcome_table", "summary_table", "labels", "usage", "graph", "interviews")
    with read_db(db, run_ids, nats) as con:
        ids = named_runs(con, run_ids)
        if by is None:
            from populace.analysis.interviews import interview_usage

            runs = [({**run_info(con, rid), "interviews": interview_usage(con, rid), "models": model_stats(con, rid),
                      "prototypes": prototype_summary(con, rid)},
                     round_table(con, rid), fork_table(con, rid), call_stats(con, rid)) for rid in ids]
        else:
            checks.attribute(con, ids, by)
            rows = group_table(con, ids, by, round=round_)
            info = run_info(con, ids[0])
    if by is None:
        if json_out:  # per round `calls` (the gateway's llm_calls rows); per run the model(s) and the totals
            print(json.dumps({"runs": [{**{k: info.get(k) for k in head}, "model": model_of(info, calls),
                                        "prototypes": info["prototypes"],
                                        "models": info["models"], "calls": total_calls(calls),
                                        "rounds": [{**r, "calls": calls.get(r["round"])} for r in rows],
                                        "fork": fork}
                                       for info, rows, fork, calls in runs]}, default=str, indent=1))
            return
        for info, rows, fork, calls in runs:
            if info.get("note"):
                display.console.print(f"note: {info['note']}", markup=False, highlight=False)
            what = f"{info['simulation']}, {info['measure']}" if info.get("measure") else info["simulation"]
            display.out.print(display.stats_table(rows, f"run {info['run_id']} ({info['status']}; {what})", info))
            if info.get("reason"):  # why a run failed, paused or was cancelled (or what its recovery did)
                display.out.print(f"{info['status']}: {info['reason']}", markup=False, highlight=False)
            if info.get("graph"):
                display.out.print(display.graph_line(info["graph"]), markup=False, highlight=False)
            llm = display.llm_table(rows, calls, f"LLM work — {display.model_line(model_of(info, calls))}")
            if llm is not None:
                display.out.print(llm)
            if (by_model := display.models_table(info["models"], "LLM work by model")) is not None:
                display.out.print(by_model)
            if line := interviews.usage_line(info.get("interviews")):
                display.out.print(line, markup=False, highlight=False)
            if line := prototypes.summary_line(info.get("prototypes")):
                display.out.print(line, markup=False, highlight=False, soft_wrap=True)
            if fork is not None:  # a fork is read against its parent: the intervention's effect
                display.out.print(display.fork_heading(fork), markup=False, highlight=False)
                display.out.print(display.fork_table(fork, info))
        return
    if json_out:
        print(json.dumps({**{k: info.get(k) for k in head}, "run_id": None, "runs": ids, "by": by,
                          "round": round_, "groups": rows}, default=str, indent=1))
        return
    noun = info["noun"]
    what = f"share of each {noun}" if info["measure_kind"] == "categorical" else f"mean {noun}"
    title = f"{what} by {by}" + (f", round {round_}" if round_ else ", last round") + f" — {', '.join(ids)}"
    display.out.print(display.group_table(rows, by, title, across_runs=len(ids) > 1))


def _prototype_results(run_ids: list[str], json_out: bool, db: str, nats: str) -> None:
    """`results --prototypes`: each prototype run's rounds, prototype by prototype."""
    from populace.analysis import has_prototypes, prototype_summary, prototype_table

    with read_db(db, run_ids, nats) as con:
        ids = named_runs(con, run_ids)
        missing = [rid for rid in ids if not has_prototypes(con, rid)]
        if missing:
            fail(f"--prototypes: run(s) {', '.join(missing)} have no prototypes (a scenario's `prototypes:` section)")
        runs = [(rid, prototype_table(con, rid), prototype_summary(con, rid)) for rid in ids]
    if json_out:
        print(json.dumps({"runs": [{"run_id": rid, "rows": rows, "summary": summary} for rid, rows, summary in runs]},
                         default=str, indent=1))
        return
    for rid, rows, summary in runs:
        display.out.print(prototypes.prototype_table(rows, f"run {rid}: prototypes"))
        display.out.print(prototypes.summary_line(summary), markup=False, highlight=False, soft_wrap=True)


def _profile_results(run_ids: list[str], json_out: bool, db: str, nats: str) -> None:
    """`results --profile`: each run's `round_profile` rows, and in words where the time went."""
    from populace.analysis import profile_totals, round_profile

    with read_db(db, run_ids, nats) as con:
        ids = named_runs(con, run_ids)
        runs = [(rid, round_profile(con, rid)) for rid in ids]
    if json_out:
        print(json.dumps({"runs": [{"run_id": rid, "rows": rows, **profile_totals(rows)} for rid, rows in runs]},
                         default=str, indent=1))
        return
    for rid, rows in runs:
        if not rows:
            display.out.print(f"run {rid}: no round profile recorded (no round closed, or it was recorded by a "
                              "release before round profiles)", markup=False, highlight=False)
            continue
        display.out.print(display.profile_table(rows, f"run {rid}: where each round went"))
        for line in display.profile_lines(profile_totals(rows)):
            display.out.print(line, markup=False, highlight=False, soft_wrap=True)


def _load_reference(path: Path):
    from populace.analysis.reference import ReferenceError, load_reference

    try:
        return load_reference(path)
    except ReferenceError as err:
        fail(str(err))


def _reference_results(run_ids: list[str], path: Path, json_out: bool, db: str, nats: str) -> None:
    """`results --reference FILE`: the runs beside human data, per question and group."""
    from populace.analysis.reference import ReferenceError, compare

    ref = _load_reference(path)
    with read_db(db, run_ids, nats) as con:
        ids = named_runs(con, run_ids)
        try:
            rows = compare(con, ids, ref)
        except ReferenceError as err:
            fail(f"--reference {path}: {err}")
    if json_out:
        print(json.dumps({"runs": ids, "reference": str(path), "source": ref.label, "rows": rows}, default=str,
                         indent=1))
        return
    display.out.print(f"reference: {ref.label}", markup=False, highlight=False, soft_wrap=True)
    display.out.print(interviews.reference_table(rows, f"{', '.join(ids)} beside {path.name}"))


def _interview_results(run_ids: list[str], by: str | None, round_: int | None, json_out: bool, db: str,
                       nats: str) -> None:
    """`results --interviews`: each question's answers (Wilson shares, Student-t means), per group."""
    from populace.analysis.interviews import has_interviews, interview_table, interview_usage

    with read_db(db, run_ids, nats) as con:
        ids = named_runs(con, run_ids)
        if not has_interviews(con, ids):
            fail(f"--interviews: run(s) {', '.join(ids)} have no interview answers (plan them in the scenario's "
                 "`interviews:`, or ask with `populace interview`)")
        checks.attribute(con, ids, by)
        rows = interview_table(con, ids, by=by, after_round=round_)  # an AnalysisError left exits 2 (_db)
        usage = {rid: interview_usage(con, rid) for rid in ids}
    if json_out:
        print(json.dumps({"runs": ids, "by": by, "round": round_, "interviews": rows, "usage": usage}, default=str,
                         indent=1))
        return
    if not rows:
        fail(f"--round: no question was asked after round {round_}")
    title = ", ".join(ids)
    for table in interviews.interview_tables(rows, title, by, across_runs=len(ids) > 1):
        display.out.print(table)
    for rid in ids:
        if line := interviews.usage_line(usage[rid]):
            display.out.print(f"{rid}: {line}", markup=False, highlight=False)


@app.command()
def report(
    run_ids: Annotated[list[str], typer.Argument(help="run id(s), 'last', or a sweep's id (all its runs); two or "
                                                      "more runs are compared side by side")],
    out: Annotated[Path, typer.Option(help="HTML file to write (self-contained, interactive plots, no network)")
                   ] = Path("report.html"),
    by: Annotated[list[str] | None, typer.Option(help="attribute(s) to group by (default: the profile's)")] = None,
    db: Annotated[str, typer.Option(help="DuckDB file")] = "populace.duckdb",
    nats: Annotated[str, typer.Option("--nats", envvar=NATS_ENV, help=NATS_LIVE_HELP)] = NATS_DEFAULT,
    reference: Annotated[Path | None, typer.Option(help="human reference data (CSV or Parquet, with its citation) "
                                                        "to put the runs beside")] = None,
) -> None:
    """Write one self-contained HTML report with interactive plots. One run: per round the
    measure's distribution (with the simulation's reference lines and equilibrium, or each
    option's share), per persona group the mean or shares with 95% CIs, convergence over rounds,
    per group of a grouped simulation, the tables, every invalid answer and each agent's
    reasoning, and the run's manifest. Several runs (or a sweep): their parameters, per-round
    summaries and convergence side by side."""
    from populace.analysis import write_report
    from populace.analysis.reference import ReferenceError
    from populace.analysis.report import runs_named

    checks.output_file(out, "--out")
    ref = _load_reference(reference) if reference is not None else None
    with read_db(db, run_ids, nats) as con:
        ids = runs_named(con, named_runs(con, run_ids))
        if by and len(ids) > 1:
            fail(f"--by: for one run's report (these are {len(ids)} runs: {', '.join(ids)})")
        for attribute in by or []:
            checks.attribute(con, ids, attribute)
        try:
            with checks.writing(out, "--out"):
                path = write_report(con, ids, out, by=by or None, reference=ref)
        except ReferenceError as err:
            fail(f"--reference {reference}: {err}")
    what = f"{len(ids)} runs" if len(ids) > 1 else ids[0]
    display.out.print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB; {what})")


@app.command()
def export(
    run_ids: Annotated[list[str], typer.Argument(help="run id(s), or 'last'")],
    out: Annotated[Path, typer.Option(help="directory for the Parquet files")] = Path("export"),
    db: Annotated[str, typer.Option(help="DuckDB file")] = "populace.duckdb",
    nats: Annotated[str, typer.Option("--nats", envvar=NATS_ENV, help=NATS_LIVE_HELP)] = NATS_DEFAULT,
) -> None:
    """Export the given runs as Parquet (for pandas / polars): the platform's tables (runs,
    agents, agent_profiles, llm_calls) and each run's own outcome and round tables."""
    from populace.analysis import export_parquet

    checks.output_folder(out, "--out")
    with read_db(db, run_ids, nats) as con, checks.writing(out, "--out"):
        paths = export_parquet(con, named_runs(con, run_ids), out)
    for p in paths:
        display.out.print(str(p))
