"""The sections of one run's report, read from the DuckDB file: header, per-round table, the
figures of the run's measure (numeric or categorical), groups of a grouped simulation, a fork
beside its parent, the answers (invalid ones and the reasoning of valid ones) and the manifest.

What is drawn follows the run's declared measure (``populace.analysis.tables``):

numeric (the ratio game's guess, the public-goods contribution)
  1. per-round histograms with the mean, the simulation's reference columns (the ratio game's
     target) and its equilibrium as vertical lines (all rounds up to 6, else the first 3 and
     last 3);
  2. per-group mean in the last round with 95% Student-t CIs, one panel per persona attribute
     (small groups as their points);
  3. convergence over rounds: mean, median, the simulation's trend columns (target, winning
     number) and the equilibrium.
categorical (the vote's choice)
  1. each option's share per round (stacked bars);
  2. each option's share per persona group in the last round with 95% Wilson CIs;
  3. each option's share over rounds with its 95% Wilson band.
grouped simulations (a ``group_id`` column) add
  4. the measure per round overall and per group: one line per group when there are few, else
     the spread of the group means (10–90% and 25–75% quantile bands, median).
a fork (its manifest names its parent, and the parent is in the same file) adds
  the fork beside its parent over rounds (mean, or each option's share), with a table.

Every number comes from DuckDB aggregates (histograms are binned there), never from all rows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import duckdb

from populace.analysis.calls import call_stats, model_stats
from populace.analysis.queries import (
    convergence_table,
    group_points,
    group_table,
    histogram,
    last_round,
)
from populace.analysis.queries.population import population_rounds
from populace.analysis.report import figures
from populace.analysis.report.answer_rows import AnswerRows, answer_rows, invalid_rows
from populace.analysis.report.blocks import (
    Details,
    Heading,
    InvalidAnswers,
    KeyValues,
    Note,
    Plot,
    Reasoning,
    Section,
    Table,
)
from populace.analysis.report.cost import COST_HEADERS, cost_cells, has_cost, models_table, round_cost
from populace.analysis.report.interviews import interview_sections
from populace.analysis.report.prototypes import prototype_section
from populace.analysis.report.shapes import shape_sections
from populace.analysis.report.text import (
    capped_rounds,
    interval,
    model_text,
    most_chosen,
    number,
    params_text,
    percent,
    population_text,
    prompt_text,
    shown_rounds,
    summary_cell,
    usage_text,
)
from populace.analysis.stats import wilson_interval
from populace.analysis.tables import plural

STATS = ("mean", "median", "std", "min", "max")
MAX_PANELS = 6  # histogram panels: all rounds up to this, else the first and last halves


def _title(nouns: str) -> str:
    return nouns[:1].upper() + nouns[1:]


# --- header and tables ------------------------------------------------------------------------
def header(info: dict, rounds: list[dict], invalid_total: int, n_groups: int | None) -> KeyValues:
    """The run at a glance: what was played, by whom, with which model, and what came of it."""
    total = sum(r["n"] for r in rounds)
    sim = info.get("simulation") if info.get("loaded") else f"{info.get('simulation')} (not loadable here)"
    eq = None
    if info.get("measure_kind") == "numeric":
        eq = f"{info['equilibrium']:g}" if info["equilibrium"] is not None else "none (not unique or not declared)"
    measure = None
    if info.get("measure"):
        measure = f"{info['measure']} ({info['measure_kind']}), table {info['outcome_table']}"
        if info.get("measure_range"):
            lo, hi = info["measure_range"]
            measure += f", range [{lo:g}, {hi:g}]"
    replicas = ((info.get("manifest") or {}).get("model") or {}).get("replicas") or []
    noun = info.get("noun") or "answer"
    invalid_answers = sum(r.get("n_invalid_answers", 0) for r in rounds)
    simulation_errors = sum(r.get("n_simulation_errors", 0) for r in rounds)
    rows = [
        ("run", info["run_id"]),
        ("name", info.get("name")),
        ("simulation", sim),
        ("status", info["status"] + (f" ({info['reason']})" if info.get("reason") else "")
         if info.get("status") else None),
        ("agents", number(info["agents"]) if info.get("agents") is not None else None),
        ("rounds", f"{info.get('rounds')} configured, {len(rounds)} recorded"),
        ("game", info["description"]) if info.get("description") else
        ("parameters", params_text(info.get("params") or {}) or None),
        ("measure", measure),
        ("equilibrium", eq),
        ("groups", number(n_groups) if n_groups is not None else None),
        ("model", model_text(info.get("model") or {}, info.get("manifest"))),
        ("replicas", ", ".join(f"{r.get('replica_id')} ({r.get('model')})" for r in replicas
                               if isinstance(r, dict)) or None),
        ("prompt", prompt_text(info.get("prompt"))),
        ("population", population_text(info.get("population"))),
        ("seed", info.get("seed")),
        ("started / finished", f"{info.get('started_at') or '—'} / {info.get('finished_at') or '—'}"),
        ("hosts", ", ".join(info.get("hosts") or []) or None),
        (plural(noun), f"{total:,} recorded: {invalid_answers:,} invalid answers (the model's answer could not be "
                       f"read), {simulation_errors:,} simulation errors (the simulation's own code failed on the row, "
                       "error 'agent: …'; the model was not at fault)"),
        ("LLM work", usage_text(info.get("usage"))),
    ]
    return KeyValues([(k, str(v)) for k, v in rows if v is not None])


def _summary_columns(info: dict, skip: Sequence[str] = ()) -> list[tuple[str, str]]:
    """(column, title) of the simulation's summary columns, minus those the analysis computes
    itself from the outcomes (the ratio game's `mean`)."""
    return [(c, t) for c, t in info["labels"].items() if c not in skip]


def round_table(rounds: list[dict], info: dict, types: dict[str, str]) -> Table:
    kind = info.get("measure_kind")
    cols = _summary_columns(info, skip=STATS if kind == "numeric" else ())
    agents = info.get("agents")
    # with activation (the environment selects who acts) n is those who acted, not the population
    n_head = f"acted (of {agents:,})" if agents and any(r["n"] != agents for r in rounds) else "n"
    headers = ["round", n_head, "valid", "invalid answers", "simulation errors"]
    options: list[str] = []
    if kind == "numeric":
        headers += list(STATS)
    elif kind == "categorical":
        options = rounds[0]["options"] if rounds else []
        headers += ["most chosen", *options]
    headers += [t for _, t in cols]
    rows = []
    for r in rounds:
        cells = [number(r["round"]), number(r["n"]), number(r["n_valid"]), number(r["n_invalid_answers"]),
                 number(r["n_simulation_errors"])]
        if kind == "numeric":
            cells += [number(r[k]) for k in STATS]
        elif kind == "categorical":
            cells += [most_chosen(r), *(percent(r["shares"].get(o)) for o in options)]
        s = r["summary"] or {}
        cells += [summary_cell(c, s.get(c), types.get(c, "")) for c, _ in cols]
        rows.append(cells)
    return Table(headers, rows, left=())


LLM_HEADERS = ["round", "invalid answers (model)", "infra retries", "LLM calls", "re-asks", "replica retries",
               "prompt tokens", "completion tokens", "latency p50 (ms)", "p95", "max"]


def llm_table(rounds: list[dict], calls: dict[int, dict]) -> Table | None:
    """Per round what the answers cost and how they came: the model's invalid answers apart from
    the infrastructure's retries (never answers), calls, the gateway's re-asks and retries on
    another replica, tokens and latency (`round_table`'s usage, `call_stats`), and where any
    round has them, cached tokens and dollars. None without any."""
    if not any(r.get("usage") for r in rounds) and not calls:
        return None
    costs = [round_cost(r.get("usage") or {}, calls.get(r["round"]) or {}) for r in rounds]
    priced = has_cost(costs)
    rows = []
    for r, cost in zip(rounds, costs, strict=True):
        u, c = r.get("usage") or {}, calls.get(r["round"]) or {}
        rows.append([number(r["round"]), number(r["n_invalid_answers"]), number(u.get("infra_retries")),
                     number(u.get("llm_calls", c.get("calls"))), number(c.get("reasks")),
                     number(c.get("replica_retries")),
                     number(c.get("prompt_tokens", u.get("prompt_tokens"))),
                     number(c.get("completion_tokens", u.get("completion_tokens"))),
                     *(number(c.get(k)) for k in ("latency_ms_p50", "latency_ms_p95", "latency_ms_max")),
                     *(cost_cells(*cost) if priced else ())])
    return Table([*LLM_HEADERS, *(COST_HEADERS if priced else ())], rows, left=())


def per_round_section(info: dict, rounds: list[dict], types: dict[str, str],
                      calls: dict[int, dict] | None = None, models: dict[str, dict] | None = None) -> Section:
    section = Section("Per round", anchor="rounds")
    if not rounds:
        section.blocks.append(Note("No round was recorded for this run."))
        return section
    shown, note = capped_rounds(rounds)
    section.blocks.append(round_table(shown, info, types))
    source = f"the recorded {plural(info['noun'])} (table {info['outcome_table']}"
    section.blocks.append(Note(f"n, valid and the statistics: from {source}; std: sample); the other columns: the "
                               f"environment's round result (table {info['summary_table']})."
                               + (f" {note}" if note else "")))
    llm = llm_table(shown, calls or {})
    if llm is not None:
        section.blocks.append(llm)
        section.blocks.append(Note("LLM work per round. Invalid answers (model): answers recorded that the "
                                   "simulation could not read (its own errors are counted apart, in the table "
                                   "above). Infra retries: prompts asked again because no model answered "
                                   "(never recorded as answers). Re-asks: the gateway's corrective asks after an "
                                   "invalid answer; replica retries: calls again on another replica after one "
                                   "failed; latency per decision, re-asks included (table llm_calls)."
                                   + (" Cached tokens: prompt tokens the provider served from its prompt cache; "
                                      "dollars: at the prices in the run's `models:`." if COST_HEADERS[-1]
                                      in llm.headers else "")))
    section.blocks.extend(models_table(models or {}))
    return section


def _group_rows(rows: list[dict]) -> Table:
    headers = ["group", "n", "mean", "95% CI", "median", "std"]
    multi = any(r["run_means"] is not None for r in rows)
    if multi:
        headers += ["runs", "mean across runs", "95% CI across runs"]
    out = []
    for r in rows:
        cells = [str(r["group"]), number(r["n"]), number(r["mean"]), interval(r["ci_low"], r["ci_high"]),
                 number(r["median"]), number(r["std"])]
        if multi:
            cells += [number(r["n_runs"]), number(r["seed_mean"]), interval(r["seed_ci_low"], r["seed_ci_high"])]
        out.append(cells)
    return Table(headers, out)


def _share_group_rows(rows: list[dict], options: list[str]) -> Table:
    """One row per group, one column per option: 'share [low, high]' (95% Wilson)."""
    groups: dict[str, dict] = {}
    for r in rows:
        g = groups.setdefault(r["group"], {"n": r["n"], "cells": {}})
        g["cells"][r["option"]] = r
    out = []
    for name, g in groups.items():
        cells = [str(name), number(g["n"])]
        for o in options:
            r = g["cells"].get(o)
            cells.append("—" if r is None or r["share"] is None
                         else f"{percent(r['share'])} {interval(r['ci_low'], r['ci_high'], percent)}")
        out.append(cells)
    return Table(["group", "n", *options], out)


# --- numeric measure ----------------------------------------------------------------------------
def numeric_sections(con: duckdb.DuckDBPyConnection, run_id: str, info: dict, rounds: list[dict],
                     attrs: list[str]) -> list[Section]:
    noun, nouns = info["noun"], plural(info["noun"])
    by_round = {r["round"]: r for r in rounds}
    labels = info["labels"]
    eq = info["equilibrium"]
    bounds = tuple(info["measure_range"]) if info.get("measure_range") else None

    first = Section(f"Figure 1. {_title(nouns)} per round", anchor="figure-1")
    show = shown_rounds([r["round"] for r in rounds], MAX_PANELS)
    shown_stats = [by_round[r] for r in show if by_round[r]["min"] is not None]
    if shown_stats:
        lo = min(r["min"] for r in shown_stats)
        hi = max(r["max"] for r in shown_stats)
        if bounds is not None:
            lo, hi = min(lo, bounds[0]), max(hi, bounds[1])
        a, b, bins = figures.histogram_bins(lo, hi, integer=info.get("measure_type") == "BIGINT")
        edges, counts = histogram(con, run_id, show, a, b, bins)
        ref = [(c, labels.get(c, c)) for c in info["reference_columns"]]
        first.blocks.append(Plot(figures.histogram_figure(edges, counts, by_round, show, noun, ref, eq),
                                 f"Histogram of {nouns} per round"
                                 + (f" with the {', '.join(t for _, t in ref)}" if ref else "")))
        if len(show) < len(rounds):
            first.blocks.append(Note(f"Showing rounds {', '.join(map(str, show))} of {len(rounds)}."))
    else:
        first.blocks.append(Note(f"No valid {nouns} to plot."))

    second = Section(f"Figure 2. Mean {noun} per group", anchor="figure-2")
    if attrs:
        lr = last_round(con, run_id)
        round_label = f"round {lr}" if lr is not None else "last round"
        groups = {a: group_table(con, [run_id], a) for a in attrs}
        drawn = {a: g for a, g in groups.items() if g}
        if drawn:
            points = {a: group_points(con, run_id, a, lr) for a, g in drawn.items()
                      if max(r["n"] for r in g) <= figures.SMALL_GROUP}
            second.blocks.append(Plot(figures.group_mean_figure(drawn, points, bounds, eq, noun, round_label),
                                      f"Mean {noun} per group with 95% confidence intervals"))
            if points:
                second.blocks.append(Note(f"Groups of at most {figures.SMALL_GROUP} agents are shown as their "
                                          "points (one per agent) beside the mean and its CI; larger groups as "
                                          "bars."))
        for a, g in groups.items():
            second.blocks.append(Heading(f"By {a} ({round_label})"))
            second.blocks.append(_group_rows(g) if g else Note(f"No valid {nouns}."))
        clip = (f" A CI reaching past the {noun}'s range [{bounds[0]:g}, {bounds[1]:g}] is drawn cut at the range, "
                "with a red triangle whose hover (and this table) gives the true interval.") if bounds else ""
        second.blocks.append(Note("95% CI: Student-t interval of the mean across the agents of the group." + clip))
    else:
        second.blocks.append(Note("This run has no population profiles to group by."))

    third = Section("Figure 3. Convergence over rounds", anchor="figure-3")
    conv = convergence_table(con, [run_id])
    if conv:
        trend = [(c, labels.get(c, c)) for c in info["trend_columns"]]
        third.blocks.append(Plot(figures.convergence_figure(conv, trend, noun,
                                                            n_reference=len(info["reference_columns"])),
                                 "Mean, median" + "".join(f", {t}" for _, t in trend) + " per round"))
        dist = [c for c in conv if c["distance"] is not None]
        if dist:
            third.blocks.append(Note(f"Distance of the mean to the equilibrium: round {dist[0]['round']} "
                                     f"{number(dist[0]['distance'])} → round {dist[-1]['round']} "
                                     f"{number(dist[-1]['distance'])}."))
    else:
        third.blocks.append(Note("No rounds to plot."))
    return [first, second, third]


# --- categorical measure --------------------------------------------------------------------------
def categorical_sections(con: duckdb.DuckDBPyConnection, run_id: str, info: dict, rounds: list[dict],
                         attrs: list[str]) -> list[Section]:
    noun, nouns = info["noun"], plural(info["noun"])
    options = rounds[0]["options"] if rounds else []
    first = Section(f"Figure 1. {_title(nouns)} per round", anchor="figure-1")
    if options:
        first.blocks.append(Plot(figures.shares_figure(rounds, options, noun), f"Share of each {noun} per round"))
    else:
        first.blocks.append(Note(f"No valid {nouns} to plot."))

    second = Section(f"Figure 2. Share of each {noun} per group", anchor="figure-2")
    if attrs:
        lr = last_round(con, run_id)
        round_label = f"round {lr}" if lr is not None else "last round"
        groups = {a: group_table(con, [run_id], a) for a in attrs}
        opts = next((list(dict.fromkeys(r["option"] for r in g)) for g in groups.values() if g), [])
        if any(groups.values()):
            second.blocks.append(Plot(figures.share_group_figure({a: g for a, g in groups.items() if g}, opts, noun,
                                                                 round_label),
                                      f"Share of each {noun} per group with 95% Wilson confidence intervals"))
        for a, g in groups.items():
            second.blocks.append(Heading(f"By {a} ({round_label})"))
            second.blocks.append(_share_group_rows(g, opts) if g else Note(f"No valid {nouns}."))
        second.blocks.append(Note("Each cell: the share of the group's valid answers and its 95% Wilson score "
                                  "interval (it stays within 0–100% and keeps its coverage for small groups and "
                                  "shares near 0 or 100%, where the normal approximation fails)."))
    else:
        second.blocks.append(Note("This run has no population profiles to group by."))

    third = Section("Figure 3. Convergence over rounds", anchor="figure-3")
    if options:
        bands = {o: [wilson_interval(r["counts"].get(o, 0), sum(r["counts"].values())) for r in rounds]
                 for o in options}
        third.blocks.append(Plot(figures.share_convergence_figure(rounds, options, noun, bands),
                                 f"Share of each {noun} per round with 95% Wilson bands"))
    else:
        third.blocks.append(Note("No rounds to plot."))
    return [first, second, third]


# --- grouped simulations and forks ------------------------------------------------------------------
def grouped_section(info: dict, rounds: list[dict], spread: dict) -> Section:
    noun = info["noun"]
    categorical = info["measure_kind"] == "categorical"
    what = spread["value"]
    title = (f"Figure 4. Share of {spread.get('option')} per round, overall and per group" if categorical
             else f"Figure 4. Mean {noun} per round, overall and per group")
    section = Section(title, anchor="figure-4")
    if not spread["rounds"]:
        section.blocks.append(Note("No group has a valid answer."))
        return section
    if categorical:
        overall = [(r["round"], (r["shares"] or {}).get(spread["option"])) for r in rounds]
    else:
        overall = [(r["round"], r["mean"]) for r in rounds]
    fig = figures.group_spread_figure(spread, overall, what, None if categorical else info["equilibrium"],
                                      percent_axis=categorical)
    how = "one line per group" if spread["lines"] is not None else "quantile bands of the group values"
    section.blocks.append(Plot(fig, f"{what} per round over all agents and per group ({how})"))
    fmt = percent if categorical else number
    shown, note = capped_rounds(spread["rounds"])
    by_round = dict(overall)
    section.blocks.append(Table(
        ["round", "groups", "all agents", "group min", "25%", "median", "75%", "group max"],
        [[number(r["round"]), number(r["n_groups"]), fmt(by_round.get(r["round"])), fmt(r["min"]), fmt(r["q25"]),
          fmt(r["median"]), fmt(r["q75"]), fmt(r["max"])] for r in shown], left=()))
    section.blocks.append(Note(f"Per group: the {what} over the group's valid answers in the round; "
                               f"{spread['n_groups']:,} groups in the run. All agents: over every valid answer of "
                               "the round." + (f" {note}" if note else "")))
    return section


def fork_section(fork: dict, info: dict) -> Section:
    noun = info.get("noun") or "answer"
    numeric = fork["measure_kind"] == "numeric"
    changes = json.dumps(fork["changes"], sort_keys=True, default=str)
    refs = [(c, info["labels"].get(c, c)) for c in info.get("reference_columns") or []]
    section = Section("Fork beside its parent", anchor="fork")
    section.blocks.append(Note(f"This run forks {fork['parent']} after round {fork['after_round']}, with the change "
                               f"{changes}. Rounds up to {fork['after_round']} are the parent's.", tone="text"))
    if fork["measure_kind"] is not None:
        section.blocks.append(Plot(figures.fork_figure(fork, noun, refs), "The fork and its parent per round"))
    what = f"mean {noun}" if numeric else "most chosen"

    def cell(stat: dict | None) -> str:
        if stat is None:
            return "—"
        return number(stat.get("mean")) if numeric else most_chosen(stat)

    def ref(stat: dict | None, column: str) -> str:
        return number(((stat or {}).get("summary") or {}).get(column))

    rows = []
    for r in fork["rounds"]:
        cells = [number(r["round"]), cell(r["parent"]), "(shared)" if r["shared"] else cell(r["fork"]),
                 *((("" if r["shared"] else number(r["difference"])),) if numeric else ())]
        for c, _ in refs:
            cells += [ref(r["parent"], c), "(shared)" if r["shared"] else ref(r["fork"], c)]
        rows.append(cells)
    heads = ["round", f"parent: {what}", f"fork: {what}", *(("difference",) if numeric else ())]
    for _, label in refs:
        heads += [f"parent: {label}", f"fork: {label}"]
    section.blocks.append(Table(heads, rows))
    return section


# --- the answers ------------------------------------------------------------------------------------
def invalid_section(invalid: AnswerRows, rounds: Sequence[dict] = ()) -> Section:
    section = Section("Invalid answers", anchor="invalid")
    errors = sum(r.get("n_simulation_errors", 0) for r in rounds)
    section.blocks.append(Note(f"{invalid.total - errors:,} invalid answer(s) in this run"
                               + (f", and {errors:,} simulation error(s) (rows with an error 'agent: …': the "
                                  "simulation's own code failed, the model was not at fault)" if errors else "")
                               + ". Each row keeps the model's raw text as it was recorded; none was turned into a "
                               "number.", tone="text"))
    if invalid.rows:
        section.blocks.append(InvalidAnswers(invalid))
    if invalid.note:
        section.blocks.append(Note(invalid.note))
    return section


def reasoning_section(answers: AnswerRows, info: dict) -> Section | None:
    """Each agent's valid answers with its chain of thought (a run with a CoT prompt), else the
    raw answers; None for a run without valid answers."""
    if not answers.rows:
        return None
    with_reasoning = any(r["has_reasoning"] for r in answers.rows)
    title = "Reasoning per agent" if with_reasoning else "Raw answers per agent"
    section = Section(title, anchor="reasoning")
    what = ("the reasoning the model wrote before its answer" if with_reasoning
            else "the model's raw text (this run's answers carry no reasoning)")
    section.blocks.append(Note(f"Every valid {info.get('noun') or 'answer'} with {what}, by agent and round. Type "
                               "an agent id (digits only) or any words to filter.", tone="text"))
    section.blocks.append(Reasoning(answers, with_reasoning))
    if answers.note:
        section.blocks.append(Note(answers.note))
    return section


def reproducibility_section(info: dict) -> Section:
    section = Section("Reproducibility", anchor="manifest")
    if info["manifest"] is not None:
        section.blocks.append(Details("Run manifest (config hash, seeds, prompts, model, package versions)",
                                      json.dumps(info["manifest"], indent=2, sort_keys=True, default=str)))
    else:
        section.blocks.append(Note("No manifest was recorded for this run."))
    section.blocks.append(Details("Run configuration", json.dumps(info["config"], indent=2, sort_keys=True,
                                                                  default=str)))
    return section


def population_section(changed: list[dict]) -> Section:
    """A population that changed: per round, how many lived in it and who came and went after it."""
    rows = [[number(r["round"]), number(r["living"]), number(r["born"]), number(r["arrived"]), number(r["died"]),
             number(r["left"])] for r in changed]
    return Section("Population", [
        Table(["round", "living agents", "born after", "arrived after", "died after", "left after"], rows, left=()),
        Note("Living: the agents alive in the round (those who could act); born, arrived, died and left: the "
             "changes after it, which the next round plays with (table population: one row per agent and event, "
             "with its reason). A departed agent never acts, is recorded or interviewed again; ids are never reused.")],
        anchor="population")


def run_sections(con: duckdb.DuckDBPyConnection, run_id: str, info: dict, rounds: list[dict],
                 types: dict[str, str], attrs: list[str], spread: dict | None, fork: dict | None
                 ) -> tuple[KeyValues, list[Section]]:
    """The header and every section of one run's report, in order."""
    invalid = invalid_rows(con, run_id)
    sections = [per_round_section(info, rounds, types, call_stats(con, run_id), model_stats(con, run_id))]
    if info["measure_kind"] == "numeric":
        sections += numeric_sections(con, run_id, info, rounds, attrs)
    elif info["measure_kind"] == "categorical":
        sections += categorical_sections(con, run_id, info, rounds, attrs)
    else:
        sections.append(Section("Figures", [Note("The simulation declares no measure: no figures.")]))
    sections += shape_sections(con, run_id, info, rounds, types, attrs)  # activity, graphs, grids
    changed = population_rounds(con, run_id, int(info.get("agents") or 0), len(rounds))
    if changed:
        sections.append(population_section(changed))
    proto = prototype_section(con, run_id)
    if proto is not None:
        sections.append(proto)
    if spread is not None:
        sections.append(grouped_section(info, rounds, spread))
    if fork is not None:
        sections.append(fork_section(fork, info))
    sections += interview_sections(con, [run_id], attrs)
    sections.append(invalid_section(invalid, rounds))
    reasoning = reasoning_section(answer_rows(con, run_id), info)
    if reasoning is not None:
        sections.append(reasoning)
    sections.append(reproducibility_section(info))
    return header(info, rounds, invalid.total, spread["n_groups"] if spread else None), sections


__all__ = ["run_sections"]
