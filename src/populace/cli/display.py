"""Rich output shared by demo, run and results: live progress and the per-round table."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from populace.client.progress import RunProgress, summary_text  # noqa: F401 - re-exported below
    from populace.core.contracts import RoundResult

# populace.client.progress's, re-exported for the CLI and imported on first use (it brings the
# contracts, which take longer to import than the rest of the CLI's start: `populace --version`)
_PROGRESS = ("RunProgress", "summary_text")
# `console` (stderr) and `out` (stdout) are made on first use too: rich takes a third of the
# CLI's start to import, and `populace --version` prints without it
_CONSOLES = ("console", "out")


def __getattr__(name: str):
    if name in _PROGRESS:
        from populace.client import progress

        return getattr(progress, name)
    if name in _CONSOLES:
        consoles = _consoles()
        globals().update(consoles)  # made once: later reads find them without this hook
        return consoles[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _consoles() -> dict[str, Console]:
    from rich.console import Console

    # Piped or captured output keeps whole tables (rich would squeeze them into 80 columns).
    return {"console": Console(stderr=True), "out": Console(width=None if sys.stdout.isatty() else 200)}


def table(*args, **kwargs) -> Table:
    """A rich Table (rich imported on first use)."""
    from rich.table import Table

    return Table(*args, **kwargs)


def fmt(x: object, digits: int = 2) -> str:
    """A number as the progress display shows it (populace.client.progress.fmt)."""
    from populace.client.progress import fmt as progress_fmt

    return progress_fmt(x, digits)



def summary_labels(summary_model) -> dict[str, str]:
    """Column labels of a simulation's round summary: each field's title, else its name."""
    return {name: f.title or name.replace("_", " ") for name, f in summary_model.model_fields.items()}


def round_rows(results: list[RoundResult]) -> list[dict]:
    """Round results as rows: round, n, n_valid, the simulation's summary columns and usage."""
    from populace.core.contracts import Usage

    return [{"round": r.round, "n": r.n, "n_valid": r.n_valid, "n_simulation_errors": r.n_simulation_errors,
             **r.summary, "usage": r.usage.model_dump(include=set(Usage.RECORDED))}
            for r in sorted(results, key=lambda r: r.round)]


def acted_cells(rows: list[dict], agents: int | None) -> list[str] | None:
    """Per round, how many of the run's agents acted — shown only when the simulation selects
    who acts (activation): otherwise every agent acts every round."""
    if not agents or all(r["n"] == agents for r in rows):
        return None
    return [f"{r['n']:,}/{agents:,}" for r in rows]


def rounds_table(rows: list[dict], labels: dict[str, str], title: str, agents: int | None = None) -> Table:
    """A run's rounds as they closed: who acted (with activation), valid answers, the model's
    invalid answers and the simulation's own errors apart, the simulation's summary columns and
    the round's LLM work (infrastructure retries apart)."""
    t = table(title=title)
    acted = acted_cells(rows, agents)
    usages = [r.get("usage") or _flat_usage(r) for r in rows]
    priced = any((u or {}).get("dollars") for u in usages)  # a run on priced models: its dollars too
    # the infrastructure's retries (last of the usage columns), the model's invalid answers and the
    # simulation's own errors side by side: three classes, never one
    for col in ("round", *(("acted",) if acted else ()), "valid", *labels.values(), *USAGE_HEADS,
                *(("dollars",) if priced else ()), "invalid answers", "simulation errors"):
        t.add_column(col, justify="right")
    for i, r in enumerate(rows):
        errors = r.get("n_simulation_errors") or 0
        u = usages[i]
        t.add_row(str(r["round"]), *((acted[i],) if acted else ()), f"{r['n_valid']}/{r['n']}",
                  *(fmt(r.get(k)) for k in labels), *usage_cells(u),
                  *((money(u["dollars"]) if u else "—",) if priced else ()),
                  f"{r['n'] - r['n_valid'] - errors:,}", f"{errors:,}")
    return t


def money(dollars: float | None) -> str:
    """Dollars as populace.core.contracts.money writes them; a dash for none."""
    from populace.core.contracts import money as text

    return "—" if dollars is None else text(dollars)


def _flat_usage(row: dict) -> dict | None:
    """Usage from a row that carries its columns flat (a `RunResult.rounds` table's)."""
    from populace.core.contracts import Usage

    if not all(row.get(k) is not None for k in Usage.RECORDED_CORE):
        return None
    return {k: row[k] for k in Usage.RECORDED if row.get(k) is not None}


STATS = ("mean", "median", "std", "min", "max")
MAX_SHOWN_OPTIONS = 8  # a categorical measure's share columns in the terminal (all of them in --json)


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def _plain(x: object):
    """Data (an option the model chose, a persona attribute) as literal text: rich would read
    '[...]' in it as markup."""
    from rich.text import Text

    return Text(str(x))


def most_chosen(row: dict) -> str:
    """'no (48.0%)', 'tie (36.0%)' or '—': the leading option of a round, from its outcomes."""
    if row.get("leader_share") is None:
        return "—"
    return f"{row['leader'] if row['leader'] is not None else 'tie'} ({_pct(row['leader_share'])})"


USAGE_HEADS = ("LLM calls", "tokens", "infra retries")


def usage_cells(u: dict | None) -> list[str]:
    """A round's LLM work as table cells (dashes while the round is open)."""
    if not u:
        return ["—"] * len(USAGE_HEADS)
    return [f"{u['llm_calls']:,}", f"{u['prompt_tokens'] + u['completion_tokens']:,}", f"{u['infra_retries']:,}"]


def _summary_shown(rows: list[dict], labels: dict[str, str], skip: tuple[str, ...]) -> list[str]:
    """The summary columns worth a terminal column: not one the analysis computes itself (the
    ratio game's `mean`), not a JSON dict or list (the vote's counts: the shares show them)."""
    return [k for k in labels if k not in skip
            and not any(isinstance((r.get("summary") or {}).get(k), (dict, list)) for r in rows)]


def stats_table(rows: list[dict], title: str, info: dict | None = None) -> Table:
    """The analysis' per-round table (`populace.analysis.round_table`): valid answers, the
    measure's statistics (numeric) or each option's share and the leading option (categorical),
    then the simulation's summary columns by their titles (`run_info`'s labels). The round's LLM
    work is `llm_table`'s."""
    info = info or {}
    kind = info.get("measure_kind") or ("numeric" if rows and "mean" in rows[0] else None)
    labels = info.get("labels")
    if labels is None:
        labels = {k: k.replace("_", " ") for k in ((rows[0].get("summary") or {}) if rows else {})}
    summary = _summary_shown(rows, labels, STATS if kind == "numeric" else ())
    options = (rows[0].get("options") or [])[:MAX_SHOWN_OPTIONS] if rows and kind == "categorical" else []
    t = table(title=title)
    acted = acted_cells(rows, info.get("agents"))
    heads = ["round", *(("acted",) if acted else ()), "valid"]
    if kind == "numeric":
        heads += list(STATS)
    elif kind == "categorical":
        heads += ["most chosen", *options]
    for col in (*heads, *(labels[k] for k in summary)):
        t.add_column(_plain(col), justify="right")
    for i, r in enumerate(rows):
        cells = [str(r["round"]), *((acted[i],) if acted else ()), f"{r['n_valid']}/{r['n']}"]
        if kind == "numeric":
            cells += [fmt(r["mean"]), fmt(r["median"]), fmt(r["std"]), fmt(r["min"], 1), fmt(r["max"], 1)]
        elif kind == "categorical":
            cells += [_plain(most_chosen(r)), *(_pct(r["shares"].get(o)) for o in options)]
        s = r.get("summary") or {}
        cells += [fmt(s.get(k)) for k in summary]
        t.add_row(*cells)
    if kind == "categorical" and rows and len(rows[0].get("options") or []) > len(options):
        t.caption = f"{len(rows[0]['options']) - len(options)} more option(s) in --json"
    return t


def model_line(model: dict) -> str:
    """'model: local, SmolLM2-135M-Instruct on replicas local-1, local-2' (the run's manifest)."""
    text = f"model: {model.get('backend') or '?'}"
    if model.get("name"):
        text += f", {model['name']}"
    if model.get("replicas"):
        text += f" on replica{'s' if len(model['replicas']) > 1 else ''} {', '.join(model['replicas'])}"
    return text


def graph_line(g: dict) -> str:
    """'graph: homophily, 759 edges (mean degree 7.6); edges cut on 2 hosts: 13.4% (the
    generator's own ids: 51.4%); 800 posts stored, an agent heard 6.1 a round'."""
    text = f"graph: {g.get('generator')}, {g.get('edges', 0):,} edges (mean degree {g.get('mean_degree', 0):g})"
    if g.get("cut") is not None:
        hosts = g["hosts"]
        text += f"; edges cut on {hosts} host{'s' if hosts != 1 else ''}: {g['cut']:.1%}"
        if g.get("cut_ids") is not None and g.get("placement") == "partition":
            text += f" (the generator's own ids: {g['cut_ids']:.1%})"
    stored = g.get("stored")
    if stored and stored.get("rows"):
        text += f"; {stored['posts']:,} posts stored, an agent heard {stored['mean_heard'] or 0:.1f} a round"
    return text


LLM_HEADS = ("round", "answers in", "valid", "invalid answers (model)", "simulation errors", "infra retries",
             "LLM calls", "re-asks",
             "replica retries", "prompt tokens", "completion tokens", "latency p50 / p95 / max (ms)")
COST_HEADS = ("cached tokens", "dollars")


def llm_table(rows: list[dict], calls: dict[int, dict], title: str) -> Table | None:
    """Per round, what the answers cost and how they came: answers in, valid, the model's
    invalid ones, the simulation's own errors (error 'agent: …'), the infrastructure retries
    (prompts asked again because no model answered; never an answer), LLM calls, the gateway's
    re-asks and retries on another replica, tokens and latency percentiles (`round_table` rows
    with `usage`, `call_stats`), and where any round has them, cached tokens and dollars. None
    without LLM work."""
    if not any(r.get("usage") for r in rows) and not calls:
        return None
    from populace.analysis.calls import round_cost

    costs = [round_cost(r.get("usage") or {}, calls.get(r["round"]) or {}) for r in rows]
    cost = any(cached or dollars for cached, dollars in costs)
    t = table(title=title)
    for col in (*LLM_HEADS, *(COST_HEADS if cost else ())):
        t.add_column(col, justify="right")
    for r, (cached, dollars) in zip(rows, costs, strict=True):
        u, c = r.get("usage") or {}, calls.get(r["round"]) or {}
        ptok = c.get("prompt_tokens", u.get("prompt_tokens"))
        ctok = c.get("completion_tokens", u.get("completion_tokens"))
        lat = " / ".join(fmt(c.get(k), 0) for k in ("latency_ms_p50", "latency_ms_p95", "latency_ms_max"))
        t.add_row(str(r["round"]), f"{r['n']:,}", f"{r['n_valid']:,}", f"{r['n_invalid_answers']:,}",
                  f"{r['n_simulation_errors']:,}", _count(u.get("infra_retries")),
                  _count(u.get("llm_calls", c.get("calls"))),
                  _count(c.get("reasks")), _count(c.get("replica_retries")), _count(ptok), _count(ctok),
                  lat if c else "—", *((_count(cached), money(dollars)) if cost else ()))
    return t


MODEL_HEADS = ("model", "agents", "LLM calls", "valid", "prompt tokens", "cached tokens", "completion tokens",
               "dollars", "latency mean / p50 (ms)")


def models_table(models: dict[str, dict], title: str) -> Table | None:
    """Per model of a run with `models:`, its agents and what their calls cost
    (`populace.analysis.model_stats`); None for a run without models."""
    if not models:
        return None
    t = table(title=title)
    for i, col in enumerate(MODEL_HEADS):
        t.add_column(col, justify="left" if i == 0 else "right")
    for name, m in models.items():
        t.add_row(_plain(name), _count(m["agents"]), _count(m["calls"]), _count(m["valid"]),
                  _count(m["prompt_tokens"]), _count(m["cached_tokens"]), _count(m["completion_tokens"]),
                  money(m["dollars"]), f"{fmt(m['latency_ms_mean'], 0)} / {fmt(m['latency_ms_p50'], 0)}")
    return t


def _count(x: int | None) -> str:
    return "—" if x is None else f"{x:,}"


PROFILE_HEADS = ("round", "who", "agents", "wall s", "view s", "turn s", "merge s", "model wait s", "decide s",
                 "record s", "views (bytes)", "largest view", "observation", "waited for the loop")


def _seconds(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def _bytes(x: int | None) -> str:
    if x is None:
        return "—"
    n = int(x)
    return f"{n / 2**20:.1f} MB" if n >= 2**20 else f"{n / 1024:.0f} KB" if n >= 1024 else f"{n} B"


def profile_table(rows: list[dict], title: str) -> Table:
    """Where each round went (`populace.analysis.round_profile` rows): per share (role `host`: the
    seconds the simulation's code held its loop in views, turns and folds, its model wait, its
    views' bytes), the environment's merge and decide, the recorder's record."""
    t = table(title=title)
    for col in PROFILE_HEADS:
        t.add_column(col, justify="left" if col == "who" else "right")
    for r in rows:
        who = f"{r['host_id']}@{r['epoch']}" if r["role"] == "host" else r["role"]
        t.add_row(str(r["round"]), who, _count(r["agents"]), _seconds(r["wall_s"]), _seconds(r["view_s"]),
                  _seconds(r["turn_s"]), _seconds(r["merge_s"]), _seconds(r["model_wait_s"]),
                  _seconds(r["decide_s"]), _seconds(r["record_s"]), _bytes(r["view_bytes"]),
                  _bytes(r["view_max_bytes"]), _bytes(r["observation_bytes"]), _count(r["held"]))
    return t


def profile_lines(totals: dict) -> list[str]:
    """What a profile says in words (`populace.analysis.profile_totals`): the largest share of the
    time, then each note (a view or observation over its budget), once."""
    from populace.analysis.profile import SECONDS

    names = {"view_s": "views (Env.view)", "turn_s": "turns, acts and scenes", "merge_s": "settle, reduce, merge",
             "model_wait_s": "waiting for the model", "decide_s": "the environment's decide",
             "record_s": "recording"}
    out = []
    if totals["top"] is not None:
        column, seconds = totals["top"]
        spent = ", ".join(f"{names[c]} {totals['seconds'][c]:.2f} s" for c in SECONDS if totals["seconds"][c] > 0)
        out.append(f"most of the time: {names[column]} ({seconds:.2f} s); in all: {spent}")
    out += [f"note: {n}" for n in totals["notes"]]
    return out


def fork_heading(fork: dict) -> str:
    from populace.analysis.report import params_text  # the change flattened as `--set` wrote it

    changes = params_text(fork["changes"]) or "no change"
    return f"fork {fork['fork']} of {fork['parent']} after round {fork['after_round']}, changed: {changes}"


def fork_table(fork: dict, info: dict) -> Table:
    """A fork beside its parent per round (`populace.analysis.fork_table`): the mean (numeric)
    or the most chosen option (categorical) of each, the fork's difference, and the simulation's
    reference columns (the ratio game's target) of each."""
    numeric = fork["measure_kind"] == "numeric"
    refs = [(c, (info.get("labels") or {}).get(c, c)) for c in info.get("reference_columns") or []]
    t = table(title="beside its parent")
    what = "mean" if numeric else "most chosen"
    heads = ["round", f"parent {what}", f"fork {what}", *(("difference",) if numeric else ())]
    for _, label in refs:
        heads += [f"parent {label}", f"fork {label}"]
    for col in heads:
        t.add_column(_plain(col), justify="right")

    def cell(stat: dict | None, shared: bool = False) -> str:
        if shared:
            return "(shared)"
        if stat is None:
            return "—"
        return fmt(stat.get("mean")) if numeric else most_chosen(stat)

    def ref(stat: dict | None, column: str, shared: bool = False) -> str:
        return "(shared)" if shared else fmt(((stat or {}).get("summary") or {}).get(column))

    for r in fork["rounds"]:
        shared = r["shared"]
        cells = [str(r["round"]), cell(r["parent"]), cell(r["fork"], shared)]
        if numeric:
            cells.append("" if shared else fmt(r["difference"]))
        for c, _ in refs:
            cells += [ref(r["parent"], c), ref(r["fork"], c, shared)]
        t.add_row(*(_plain(c) for c in cells))
    return t


def _ci(low: float | None, high: float | None) -> str:
    return "—" if low is None or high is None else f"[{fmt(low)}, {fmt(high)}]"


def group_table(rows: list[dict], by: str, title: str, across_runs: bool) -> Table:
    """Per group (`populace.analysis.group_table`): a numeric measure's mean with a Student-t 95%
    CI across agents, or (rows with an `option`) each option's share with a Wilson 95% CI; and,
    for several runs, the same across runs (seeds)."""
    if rows and "option" in rows[0]:
        return _share_group_table(rows, by, title, across_runs)
    t = table(title=title)
    t.add_column(_plain(by))
    for col in ("valid answers", "mean", "95% CI (agents)", "median", "std"):  # n counts valid answers only
        t.add_column(col, justify="right")
    if across_runs:
        for col in ("runs", "mean of run means", "95% CI (runs)"):
            t.add_column(col, justify="right")
    for r in rows:
        cells = [_plain(r["group"]), str(r["n"]), fmt(r["mean"]), _ci(r["ci_low"], r["ci_high"]),
                 fmt(r["median"]), fmt(r["std"])]
        if across_runs:
            cells += [str(r["n_runs"]), fmt(r["seed_mean"]), _ci(r["seed_ci_low"], r["seed_ci_high"])]
        t.add_row(*cells)
    return t


def _pct_ci(low: float | None, high: float | None) -> str:
    return "—" if low is None or high is None else f"[{_pct(low)}, {_pct(high)}]"


def _share_group_table(rows: list[dict], by: str, title: str, across_runs: bool) -> Table:
    t = table(title=title)
    t.add_column(_plain(by))
    t.add_column("option")
    for col in ("answers", "share", "95% CI (Wilson)"):
        t.add_column(col, justify="right")
    if across_runs:
        for col in ("runs", "mean share of runs", "95% CI (runs)"):
            t.add_column(col, justify="right")
    for i, r in enumerate(rows):
        first = i == 0 or rows[i - 1]["group"] != r["group"]  # the group's name once, on its first option
        last = i == len(rows) - 1 or rows[i + 1]["group"] != r["group"]
        cells = [_plain(r["group"]) if first else "", _plain(r["option"]), f"{r['count']}/{r['n']}", _pct(r["share"]),
                 _pct_ci(r["ci_low"], r["ci_high"])]
        if across_runs:
            cells += [str(r["n_runs"]), _pct(r["seed_mean"]), _pct_ci(r["seed_ci_low"], r["seed_ci_high"])]
        t.add_row(*cells, end_section=last)
    return t


def rerun_table(before: list[dict], after: dict[int, RoundResult], labels: dict[str, str], old_id: str,
                new_id: str) -> Table:
    """The original run's rounds next to the rerun's: valid answers and the first summary
    columns side by side, and whether every summary column is identical."""
    shown = list(labels)[:2]
    t = table(title=f"rerun {new_id} of {old_id}")
    for col in ("round", "valid (run)", "valid (rerun)",
                *(f"{labels[k]} ({w})" for k in shown for w in ("run", "rerun")), "same"):
        t.add_column(col, justify="right")
    for b in before:
        a = after.get(b["round"])
        same = a is not None and a.n_valid == b["n_valid"] and all(a.summary.get(k) == b.get(k) for k in labels)
        t.add_row(str(b["round"]), str(b["n_valid"]), str(a.n_valid) if a else "—",
                  *(fmt(v) for k in shown for v in (b.get(k), a.summary.get(k) if a else None)),
                  "yes" if same else "no")
    return t


def sweep_plan_table(sp) -> Table:
    """The runs a sweep will play (populace.client.sweep.SweepPlan), one row each."""
    t = table(title=f"sweep {sp.spec.name}: {len(sp.cells)} runs")
    for col in ("#", "cell", "seed", "agents", "rounds", "backend"):
        t.add_column(col)
    for cell, prep in zip(sp.cells, sp.prepared):
        c = prep.config
        t.add_row(str(cell.index), cell.label, str(cell.seed), str(c.agents), str(c.rounds), c.model.backend)
    return t


def sweep_summary_table(rows: list[dict], title: str) -> Table:
    """Per cell: the last round's key column across seeds (populace.client.sweep.summary)."""
    from populace.client.sweep import key_column, summary

    t = table(title=title)
    key = (key_column(rows) or "value").replace("_", " ")
    for col in ("cell", "runs", "round", f"{key} of last round", "95% CI across seeds", "valid"):
        t.add_column(col, justify="left" if col == "cell" else "right")
    for s in summary(rows):
        ci = "—" if s["ci_low"] is None else f"[{fmt(s['ci_low'])}, {fmt(s['ci_high'])}]"
        t.add_row(s["cell"], str(s["runs"]), str(s["last_round"]), fmt(s["mean"]), ci,
                  f"{100 * s['valid']:.0f}%")
    return t
