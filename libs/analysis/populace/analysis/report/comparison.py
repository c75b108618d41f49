"""Several runs side by side (the seeds or cells of a sweep, a run and its variants): what each
run was (the parameters that differ between them, the rest said once), its LLM work, and its
measure round by round; plus the runs overlaid over rounds.

The tables are pure functions of ``run_info``/``round_table`` rows, so they can be checked
without a database; ``comparison_sections`` reads the file."""

from __future__ import annotations

from collections.abc import Sequence

import duckdb

from populace.analysis.queries import round_table, run_info
from populace.analysis.report import figures
from populace.analysis.report.blocks import Note, Plot, Section, Table
from populace.analysis.report.text import flat_params, model_text, most_chosen, number, percent
from populace.analysis.tables import plural

MAX_OPTION_PANELS = 4  # categorical runs: one panel per option, the most frequent first


def run_facts(info: dict) -> dict[str, str]:
    """What defines a run, by name: platform settings, then the simulation's own parameters."""
    facts = {"simulation": str(info.get("simulation")), "agents": number(info.get("agents")),
             "rounds": str(info.get("rounds")), "seed": str(info.get("seed")),
             "model": model_text(info.get("model") or {}, info.get("manifest"))}
    facts.update({f"prompt.{k}": str(v) for k, v in (info.get("prompt") or {}).items()})
    facts.update(flat_params(info.get("params") or {}))
    return facts


def comparison_params(infos: Sequence[dict]) -> tuple[Table, list[str]]:
    """One row per run: its id, name and status, the facts that differ between the runs, and
    its LLM work; with the facts every run shares as ``"key=value"`` (listed once, not in
    every row)."""
    facts = [run_facts(i) for i in infos]
    keys = list(dict.fromkeys(k for f in facts for k in f))
    differ = [k for k in keys if len({f.get(k, "—") for f in facts}) > 1]
    same = [f"{k}={facts[0][k]}" for k in keys if k not in differ and k in facts[0]]
    headers = ["run", "name", "status", *differ, "LLM calls", "tokens", "invalid answers", "simulation errors"]
    rows = []
    for info, f in zip(infos, facts, strict=True):
        usage = info.get("usage") or {}
        tokens = (usage["prompt_tokens"] + usage["completion_tokens"]) if usage else None
        rows.append([info["run_id"], str(info.get("name") or "—"), str(info.get("status") or "—"),
                     *(f.get(k, "—") for k in differ), number(usage.get("llm_calls")), number(tokens),
                     number(usage.get("invalid_answers")), number(usage.get("simulation_errors"))])
    return Table(headers, rows, left=(0, 1, 2, *range(3, 3 + len(differ)))), same


def comparison_rounds(runs: Sequence[tuple[str, str | None, list[dict]]]) -> Table:
    """Round by round, each run's measure: ``runs`` as (run id, measure kind, round_table rows).
    A numeric run shows its mean and valid count, a categorical one its most chosen option."""
    by_run = {rid: {r["round"]: r for r in rows} for rid, _, rows in runs}
    all_rounds = sorted({n for rows in by_run.values() for n in rows})
    headers = ["round"]
    for rid, kind, _ in runs:
        headers += [f"{rid}: mean", f"{rid}: valid"] if kind == "numeric" else [f"{rid}: most chosen",
                                                                                f"{rid}: valid"]
    out = []
    for n in all_rounds:
        cells = [number(n)]
        for rid, kind, _ in runs:
            r = by_run[rid].get(n)
            if r is None:
                cells += ["—", "—"]
                continue
            centre = number(r.get("mean")) if kind == "numeric" else most_chosen(r)
            cells += [centre, f"{r['n_valid']:,} of {r['n']:,}"]
        out.append(cells)
    return Table(headers, out, left=())


def numeric_series(runs: Sequence[tuple[dict, list[dict]]]) -> tuple[dict, list[str]]:
    """(series, panels) for ``figures.comparison_figure``: the mean, the median and each
    simulation's trend columns (by their titles) per run and round."""
    series: dict[str, list[tuple[int, float | None]]] = {}
    panels = ["mean", "median"]
    for info, rows in runs:
        rid = info["run_id"]
        for stat in ("mean", "median"):
            series[f"{rid}\t{stat}"] = [(r["round"], r.get(stat)) for r in rows]
        for c in info.get("trend_columns") or []:
            title = info["labels"].get(c, c)
            if title not in panels:
                panels.append(title)
            series[f"{rid}\t{title}"] = [(r["round"], (r["summary"] or {}).get(c)) for r in rows]
    return series, panels


def share_series(runs: Sequence[tuple[dict, list[dict]]]) -> tuple[dict, list[str]]:
    """(series, panels): the share of each of the first run's most frequent options per run."""
    options = [o for o in (runs[0][1][0]["options"] if runs and runs[0][1] else []) if o != "(other)"]
    panels = [f"share of {o}" for o in options[:MAX_OPTION_PANELS]]
    series = {f"{info['run_id']}\tshare of {o}": [(r["round"], (r["shares"] or {}).get(o)) for r in rows]
              for info, rows in runs for o in options[:MAX_OPTION_PANELS]}
    return series, panels


def comparison_sections(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str]) -> tuple[list[dict], list[Section]]:
    """The runs' infos and the sections comparing them."""
    infos = [run_info(con, rid) for rid in run_ids]
    rounds = {rid: round_table(con, rid) for rid in run_ids}
    params, same = comparison_params(infos)
    runs = Section("The runs", [params], anchor="runs")
    if same:
        runs.blocks.append(Note("The same in every run: " + ", ".join(same) + "."))
    per_round = Section("Per round", [comparison_rounds([(i["run_id"], i["measure_kind"], rounds[i["run_id"]])
                                                         for i in infos])], anchor="rounds")
    sections = [runs, per_round]
    numeric = [(i, rounds[i["run_id"]]) for i in infos if i["measure_kind"] == "numeric"]
    if numeric:
        series, panels = numeric_series(numeric)
        noun = plural(numeric[0][0]["noun"])
        fig = figures.comparison_figure(series, panels, equilibrium={i["run_id"]: i["equilibrium"]
                                                                     for i, _ in numeric})
        sections.append(Section(f"Convergence over rounds: {noun}", [
            Plot(fig, "Each run's " + ", ".join(panels) + " per round, overlaid"),
            Note("One colour per run, one panel per statistic; the equilibrium dashed where the simulation "
                 "declares one.")], anchor="convergence"))
    categorical = [(i, rounds[i["run_id"]]) for i in infos if i["measure_kind"] == "categorical"]
    if categorical:
        series, panels = share_series(categorical)
        if panels:
            fig = figures.comparison_figure(series, panels, percent_axis=True)
            sections.append(Section("Shares over rounds", [
                Plot(fig, "Each run's share of the most frequent answers per round, overlaid"),
                Note(f"Options as ranked in {categorical[0][0]['run_id']}; shares: {percent(None)} where a run "
                     "has no valid answer in a round.")], anchor="shares"))
    if not numeric and not categorical:
        sections.append(Section("Convergence over rounds", [Note("These runs declare no measure: no figures.")]))
    return infos, sections
