"""One self-contained HTML report per run: header, per-round table, figures embedded as PNG
(data: URIs; no external CSS, JS, fonts or URLs), group tables, invalid answers and the
reproducibility manifest.

    from populace.analysis import write_report
    with duckdb.connect("populace.duckdb", read_only=True) as con:
        write_report(con, "run-1", "report.html", by=["education"])

Figures (matplotlib, object API on the Agg canvas: no pyplot, no global backend switch):
1. per-round histograms of the valid guesses with the target and the mean as vertical lines
   (all rounds up to 6, else the first 3 and last 3);
2. per-group mean guess in the last round with 95% CI error bars, one panel per attribute;
3. convergence over rounds: mean, median, target, winner and the equilibrium (dashed).
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from collections.abc import Sequence
from pathlib import Path

import duckdb
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from populace.analysis.queries import (
    attributes,
    convergence_table,
    group_table,
    guesses,
    invalid_answers,
    last_round,
    round_table,
    run_info,
)

MAX_PANELS = 6  # histogram panels: all rounds up to this, else the first and last halves
MAX_GROUP_PLOTS = 4
HIST_BINS = 20
RAW_EXAMPLES = 5
RAW_MAX_CHARS = 300

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;max-width:1100px;
margin:2em auto;padding:0 1em;color:#222;line-height:1.4}
h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.25em;margin-top:1.8em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.6em 0;font-size:.92em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}
table.kv td:first-child{font-weight:600;text-align:left;background:#fafafa}table.kv td{text-align:left}
img{max-width:100%;height:auto;display:block;margin:.6em 0}
pre{background:#f6f6f6;padding:.8em;overflow:auto;font-size:.85em}
.note{color:#666;font-size:.9em}code{background:#f3f3f3;padding:0 .2em}
"""


# --- formatting -----------------------------------------------------------------------
def _e(x: object) -> str:
    return html.escape("" if x is None else str(x), quote=True)


def _n(x: object, digits: int = 2) -> str:
    if x is None:
        return "—"
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return f"{int(x):,}"
    try:
        f = float(x)
    except (TypeError, ValueError):
        return _e(x)
    if not math.isfinite(f):
        return "—"
    return f"{f:,.{digits}f}"


def _num_text(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def game_text(info: dict) -> str:
    """'target = 2/3 · mean + 5; guesses in [0, 100]' with the ratio as the user wrote it."""
    t = f"target = {info['ratio']} · mean"
    if info["offset"]:
        t += f" {'+' if info['offset'] > 0 else '−'} {_num_text(abs(info['offset']))}"
    return f"{t}; guesses in [0, {_num_text(info['max_value'])}]"


def _prompt_text(prompt: dict | None) -> str | None:
    if not prompt:
        return None
    parts = []
    for k, v in prompt.items():
        if isinstance(v, bool):
            v = "on" if v else "off"
        parts.append(f"{k}={v}")
    return ", ".join(parts)


def _population_text(pop: dict | None) -> str | None:
    if not pop:
        return None
    parts = []
    for k in ("personas", "config", "source"):
        if pop.get(k):
            parts.append(f"{k}: {pop[k]}")
    if pop.get("digest"):
        parts.append(f"sha256 {str(pop['digest'])[:12]}…")
    return "; ".join(parts) or json.dumps(pop, sort_keys=True)


def _model_text(model: dict) -> str:
    if not model:
        return "—"
    t = str(model.get("backend", "?"))
    if model.get("name"):
        t += f" ({model['name']})"
    extra = [f"{k}={model[k]}" for k in ("temperature", "max_tokens") if k in model]
    return t + (f"; {', '.join(extra)}" if extra else "")


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], left: Sequence[int] = (0,)) -> str:
    """Rows of already-escaped cell strings."""
    h = "".join(f'<th class="l">{c}</th>' if i in left else f"<th>{c}</th>" for i, c in enumerate(headers))
    body = "".join(
        "<tr>" + "".join(f'<td class="l">{c}</td>' if i in left else f"<td>{c}</td>" for i, c in enumerate(r))
        + "</tr>" for r in rows)
    return f"<table><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"


# --- figures --------------------------------------------------------------------------
def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def png_data_uri(fig: Figure) -> str:
    """The figure as a ``data:image/png;base64,...`` URI (deterministic: no timestamp)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _img(uri: str, alt: str) -> str:
    return f'<img src="{uri}" alt="{_e(alt)}">'


def shown_rounds(rounds: Sequence[int], max_panels: int = MAX_PANELS) -> list[int]:
    """All rounds if few, else the first ⌈max/2⌉ and the last ⌊max/2⌋."""
    rounds = list(rounds)
    if len(rounds) <= max_panels:
        return rounds
    head = (max_panels + 1) // 2
    return rounds[:head] + rounds[len(rounds) - (max_panels - head):]


def histogram_figure(per_round: dict[int, np.ndarray], table: dict[int, dict], max_value: float,
                     rounds: Sequence[int], title: str) -> Figure:
    """Figure 1: one histogram panel per round, target (red) and mean (dashed) as lines."""
    k = max(len(rounds), 1)
    ncols = min(3, k)
    nrows = math.ceil(k / ncols)
    fig = _figure(4.0 * ncols, 3.0 * nrows + 0.4)
    all_vals = [v for r in rounds for v in (per_round.get(r, np.empty(0)),) if v.size]
    lo = min([0.0] + [float(v.min()) for v in all_vals])
    hi = max([float(max_value)] + [float(v.max()) for v in all_vals])
    edges = np.linspace(lo, hi, HIST_BINS + 1)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i >= len(rounds):
            ax.set_visible(False)
            continue
        r = rounds[i]
        vals = per_round.get(r, np.empty(0))
        row = table.get(r, {})
        ax.hist(vals, bins=edges, color="#7aa6d6", edgecolor="#2f5f8f", linewidth=0.6)
        if row.get("target") is not None:
            ax.axvline(row["target"], color="#d62728", linewidth=2, label=f"target {row['target']:.2f}")
        if row.get("mean") is not None:
            ax.axvline(row["mean"], color="#222222", linestyle="--", linewidth=1.4, label=f"mean {row['mean']:.2f}")
        ax.set_xlim(lo, hi)
        ax.set_title(f"Round {r} (n={vals.size:,} valid)", fontsize=10)
        ax.set_xlabel("guess")
        ax.set_ylabel("agents")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        if not vals.size:
            ax.text(0.5, 0.5, "no valid guesses", transform=ax.transAxes, ha="center", va="center", color="#888")
        if row.get("target") is not None or row.get("mean") is not None:
            ax.legend(fontsize=8, loc="upper right")
    fig.suptitle(title, fontsize=12)
    return fig


def group_figure(groups: dict[str, list[dict]], equilibrium: float | None, round_label: str,
                 max_value: float | None = None) -> Figure:
    """Figure 2: per-group mean guess with 95% CI error bars, one panel per attribute. The y axis
    stays within the game's range [0, max_value]: a tiny group's huge CI would otherwise flatten
    every other bar (its exact bounds are in the table below the figure)."""
    k = max(len(groups), 1)
    ncols = min(2, k)
    nrows = math.ceil(k / ncols)
    fig = _figure(5.5 * ncols, 3.8 * nrows + 0.4)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    items = list(groups.items())
    for i, ax in enumerate(axes.flat):
        if i >= len(items):
            ax.set_visible(False)
            continue
        attr, rows = items[i]
        x = np.arange(len(rows))
        means = np.array([r["mean"] if r["mean"] is not None else np.nan for r in rows], dtype=float)
        low = np.array([r["mean"] - r["ci_low"] if r["ci_low"] is not None else 0.0 for r in rows], dtype=float)
        high = np.array([r["ci_high"] - r["mean"] if r["ci_high"] is not None else 0.0 for r in rows], dtype=float)
        ax.bar(x, means, yerr=[low, high], capsize=4, color="#8fbf8f", edgecolor="#3d6b3d",
               error_kw={"elinewidth": 1.2, "ecolor": "#222"})
        ax.set_xticks(x, [f"{r['group']}\n(n={r['n']:,})" for r in rows], fontsize=8,
                      rotation=30 if len(rows) > 4 else 0, ha="right" if len(rows) > 4 else "center")
        if equilibrium is not None:
            ax.axhline(equilibrium, color="#555", linestyle="--", linewidth=1, label=f"equilibrium {equilibrium:g}")
            ax.legend(fontsize=8)
        if max_value is not None and np.isfinite(means).any():
            top = float(np.nanmax(means + high))
            ax.set_ylim(0, min(top * 1.1, max_value * 1.05) or 1.0)
        ax.set_xlabel(attr)
        ax.set_ylabel(f"mean guess ({round_label})")
        ax.set_title(f"Mean guess by {attr} (95% CI across agents)", fontsize=10)
    fig.suptitle("Figure 2. Mean guess per group", fontsize=12)
    return fig


def convergence_figure(rows: list[dict], title: str) -> Figure:
    """Figure 3: mean, median, target and winner per round; equilibrium dashed."""
    fig = _figure(7.5, 4.2)
    ax = fig.subplots()
    x = [r["round"] for r in rows]

    def col(key: str) -> list[float]:
        return [np.nan if r[key] is None else r[key] for r in rows]

    ax.plot(x, col("mean"), "o-", color="#1f77b4", label="mean")
    ax.plot(x, col("median"), "s-", color="#2ca02c", label="median")
    ax.plot(x, col("target"), "^-", color="#d62728", label="target")
    ax.plot(x, col("winner_value"), "d:", color="#9467bd", label="winning number")
    eq = rows[0]["equilibrium"] if rows else None
    if eq is not None:
        ax.axhline(eq, color="#444", linestyle="--", linewidth=1.2, label=f"equilibrium ({eq:g})")
    ax.set_xlabel("round")
    ax.set_ylabel("guess")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(title, fontsize=11)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


# --- report ---------------------------------------------------------------------------
def _header(info: dict, rounds: list[dict], inv: dict) -> str:
    total = sum(r["n"] for r in rounds)
    rows = [
        ("run", info["run_id"]),
        ("name", info.get("name")),
        ("status", info.get("status") + (f" ({info['reason']})" if info.get("reason") else "")
         if info.get("status") else None),
        ("agents", _n(info.get("agents")) if info.get("agents") is not None else None),
        ("rounds", f"{info.get('rounds')} configured, {len(rounds)} recorded"),
        ("game", game_text(info)),
        ("equilibrium", "none unique" if info["equilibrium"] is None else f"{info['equilibrium']:g}"),
        ("model", _model_text(info.get("model") or {})),
        ("prompt", _prompt_text(info.get("prompt"))),
        ("population", _population_text(info.get("population"))),
        ("seed", info.get("seed")),
        ("started / finished", f"{info.get('started_at') or '—'} / {info.get('finished_at') or '—'}"),
        ("hosts", ", ".join(info.get("hosts") or []) or None),
        ("guesses", f"{total:,} recorded, {inv['count']:,} invalid"),
    ]
    body = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in rows if v is not None)
    return f'<table class="kv">{body}</table>'


def _round_rows(rounds: list[dict]) -> str:
    headers = ["round", "n", "valid", "invalid", "mean", "median", "std", "min", "max", "target",
               "winner", "winning number"]
    rows = [[_n(r["round"]), _n(r["n"]), _n(r["n_valid"]), _n(r["n_invalid"]), _n(r["mean"]),
             _n(r["median"]), _n(r["std"]), _n(r["min"]), _n(r["max"]), _n(r["target"]),
             _e(r["winner_agent_id"]) if r["winner_agent_id"] is not None else "—",
             _n(r["winner_value"])] for r in rounds]
    return _table(headers, rows, left=())


def _group_rows(rows: list[dict]) -> str:
    headers = ["group", "n", "mean", "95% CI", "median", "std"]
    multi = any(r["run_means"] is not None for r in rows)
    if multi:
        headers += ["runs", "mean across runs", "95% CI across runs"]
    out = []
    for r in rows:
        ci = f"[{_n(r['ci_low'])}, {_n(r['ci_high'])}]" if r["ci_low"] is not None else "—"
        cells = [_e(r["group"]), _n(r["n"]), _n(r["mean"]), ci, _n(r["median"]), _n(r["std"])]
        if multi:
            sci = (f"[{_n(r['seed_ci_low'])}, {_n(r['seed_ci_high'])}]"
                   if r["seed_ci_low"] is not None else "—")
            cells += [_n(r["n_runs"]), _n(r["seed_mean"]), sci]
        out.append(cells)
    return _table(headers, out)


def render_report(con: duckdb.DuckDBPyConnection, run_id: str,
                  by: str | Sequence[str] | None = None) -> str:
    """The run's report as one self-contained HTML page (str).

    ``by``: the attributes to group by (a name or a list); default: every profile attribute of
    the run, at most 4. Raises AnalysisError for an unknown run or attribute."""
    info = run_info(con, run_id)
    rounds = round_table(con, run_id)
    by_round = {r["round"]: r for r in rounds}
    inv = invalid_answers(con, run_id, limit=RAW_EXAMPLES)
    if by is None:
        attrs = attributes(con, run_id)[:MAX_GROUP_PLOTS]
    else:
        attrs = [by] if isinstance(by, str) else list(by)

    title = f"Populace run {run_id}"
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
             f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
             f"<title>{_e(title)}</title><style>{CSS}</style></head><body>",
             f"<h1>{_e(title)}</h1>",
             f'<p class="note">{_e(info.get("name") or "")} — {_e(game_text(info))}</p>',
             _header(info, rounds, inv),
             "<h2>Per round</h2>"]
    if rounds:
        parts.append(_round_rows(rounds))
        parts.append('<p class="note">n, valid, mean … max: from the recorded guesses (std: sample); '
                     "target and winner: the environment's round result.</p>")
    else:
        parts.append('<p class="note">No round was recorded for this run.</p>')

    # figure 1
    all_rounds = [r["round"] for r in rounds]
    show = shown_rounds(all_rounds)
    per_round = {}
    for r in show:
        per_round[r] = guesses(con, run_id, r).get(r, np.empty(0))
    parts.append("<h2>Figure 1. Guesses per round</h2>")
    if show:
        fig_title = f"Figure 1. Distribution of guesses per round ({game_text(info)})"
        parts.append(_img(png_data_uri(histogram_figure(per_round, by_round, info["max_value"], show, fig_title)),
                          "Histogram of guesses per round with the target"))
        if len(show) < len(all_rounds):
            parts.append(f'<p class="note">Showing rounds {", ".join(map(str, show))} of {len(all_rounds)}.</p>')
    else:
        parts.append('<p class="note">No guesses to plot.</p>')

    # figure 2 and group tables
    parts.append("<h2>Figure 2. Mean guess per group</h2>")
    if attrs:
        lr = last_round(con, run_id)
        round_label = f"round {lr}" if lr is not None else "last round"
        groups = {a: group_table(con, [run_id], a) for a in attrs}
        if any(groups.values()):
            parts.append(_img(png_data_uri(group_figure({a: g for a, g in groups.items() if g},
                                                        info["equilibrium"], round_label,
                                                        info.get("max_value"))),
                              "Mean guess per group with 95% confidence intervals"))
        for a, g in groups.items():
            parts.append(f"<h3>By {_e(a)} ({_e(round_label)})</h3>")
            parts.append(_group_rows(g) if g else '<p class="note">No valid guesses.</p>')
        parts.append('<p class="note">95% CI: Student-t interval of the mean across the agents of the group.</p>')
    else:
        parts.append('<p class="note">This run has no population profiles to group by.</p>')

    # figure 3
    parts.append("<h2>Figure 3. Convergence over rounds</h2>")
    conv = convergence_table(con, [run_id])
    if conv:
        parts.append(_img(png_data_uri(convergence_figure(conv, f"Figure 3. Convergence ({game_text(info)})")),
                          "Mean, median, target and winning number per round"))
        dist = [c for c in conv if c["distance"] is not None]
        if dist:
            parts.append(f'<p class="note">Distance of the mean to the equilibrium: round {dist[0]["round"]} '
                         f'{_n(dist[0]["distance"])} → round {dist[-1]["round"]} {_n(dist[-1]["distance"])}.</p>')
    else:
        parts.append('<p class="note">No rounds to plot.</p>')

    # invalid answers
    parts.append("<h2>Invalid answers</h2>")
    parts.append(f"<p>{inv['count']:,} invalid answer(s) in this run.</p>")
    if inv["examples"]:
        rows = []
        for ex in inv["examples"]:
            raw = "" if ex["raw"] is None else str(ex["raw"])
            if len(raw) > RAW_MAX_CHARS:
                raw = raw[:RAW_MAX_CHARS] + "…"
            rows.append([_n(ex["round"]), _e(ex["agent_id"]), f"<code>{_e(raw)}</code>"])
        parts.append(_table(["round", "agent", "raw answer"], rows, left=(2,)))

    # manifest
    parts.append("<h2>Reproducibility</h2>")
    if info["manifest"] is not None:
        parts.append("<details><summary>Run manifest (config hash, seeds, prompts, model, package versions)"
                     "</summary><pre>" + _e(json.dumps(info["manifest"], indent=2, sort_keys=True, default=str))
                     + "</pre></details>")
    else:
        parts.append('<p class="note">No manifest was recorded for this run.</p>')
    parts.append("<details><summary>Run configuration</summary><pre>"
                 + _e(json.dumps(info["config"], indent=2, sort_keys=True, default=str)) + "</pre></details>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_report(con: duckdb.DuckDBPyConnection, run_id: str, out_path: str | Path,
                 by: str | Sequence[str] | None = None) -> Path:
    """Render the report and write it to ``out_path`` (UTF-8); returns the path."""
    text = render_report(con, run_id, by=by)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return out
