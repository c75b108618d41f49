"""One self-contained HTML report per run, for any simulation: header, per-round table, figures
embedded as PNG (data: URIs; no external CSS, JS, fonts or URLs), group tables, invalid answers
and the reproducibility manifest.

    from populace.analysis import write_report
    with duckdb.connect("populace.duckdb", read_only=True) as con:
        write_report(con, "run-1", "report.html", by=["education"])

What is drawn follows the run's declared measure (``populace.analysis.tables``):

numeric (the ratio game's guess, the public-goods contribution)
  1. per-round histograms with the mean, the simulation's reference columns (the ratio game's
     target) and its equilibrium as vertical lines (all rounds up to 6, else the first 3 and
     last 3);
  2. per-group mean in the last round with 95% Student-t CIs, one panel per persona attribute;
  3. convergence over rounds: mean, median, the simulation's trend columns (target, winning
     number) and the equilibrium (dashed).
categorical (the vote's choice)
  1. each option's share per round (stacked bars);
  2. each option's share per persona group in the last round with 95% Wilson CIs;
  3. each option's share over rounds with its 95% Wilson band.
grouped simulations (a ``group_id`` column) add
  4. the measure per round overall and per group: one line per group when there are few, else
     the spread of the group means (10–90% and 25–75% quantile bands, median).
a fork (its manifest names its parent, and the parent is in the same file) adds
  the fork beside its parent over rounds (mean, or each option's share), with a table.

Figures use matplotlib's object API on the Agg canvas (no pyplot, no global backend switch).
Every number comes from DuckDB aggregates (histograms are binned there), never from all rows.
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
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, PercentFormatter

from populace.analysis.queries import (
    attributes,
    convergence_table,
    fork_table,
    group_spread,
    group_table,
    histogram,
    invalid_answers,
    last_round,
    round_table,
    run_info,
    tables_of,
)
from populace.analysis.stats import wilson_interval
from populace.analysis.tables import plural
from populace.core.contracts import Usage

MAX_PANELS = 6  # histogram panels: all rounds up to this, else the first and last halves
MAX_GROUP_PLOTS = 4
HIST_BINS = 20
MAX_INTEGER_BINS = 60  # an integer measure spanning at most this many values gets one bin per value
MAX_TABLE_ROUNDS = 200  # per-round tables: all rounds up to this, else the first and last halves
MAX_STACKED_BARS = 60  # categorical figure 1: bars up to this many rounds, else an area plot
RAW_EXAMPLES = 5
RAW_MAX_CHARS = 300
JSON_MAX_CHARS = 120
STATS = ("mean", "median", "std", "min", "max")

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
.note{color:#666;font-size:.9em}.warn{color:#8a5a00;font-size:.9em}code{background:#f3f3f3;padding:0 .2em}
"""
REFERENCE_STYLES = (("#d62728", "^-"), ("#ff7f0e", "v-"), ("#8c564b", "P-"))
TREND_STYLES = (("#9467bd", "d:"), ("#17becf", "x:"), ("#bcbd22", "*:"))


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


def _pct(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{100 * x:.{digits}f}%"


def params_text(params: dict, limit: int = 400) -> str:
    """A simulation's own config sections flattened: 'game.endowment=20, prompt.answer=cot'."""
    parts: list[str] = []

    def walk(prefix: str, v: object) -> None:
        if isinstance(v, dict) and (v or not prefix):
            for k, w in v.items():
                walk(f"{prefix}.{k}" if prefix else str(k), w)
        else:
            parts.append(f"{prefix}={json.dumps(v, ensure_ascii=False) if isinstance(v, (list, dict)) else v}")

    walk("", params)
    text = ", ".join(parts)
    return text if len(text) <= limit else text[:limit] + "…"


def describe(info: dict) -> str:
    """One line saying what was played: the simulation's own description, else its parameters."""
    if info.get("description"):
        return info["description"]
    p = params_text(info.get("params") or {})
    return f"{info.get('simulation')}" + (f": {p}" if p else "")


def _caption(info: dict) -> str:
    """What a figure's title says was played: the simulation's own description, else its name
    (its parameters are in the header table; a figure title has no room for them)."""
    return info.get("description") or str(info.get("simulation"))


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


def _cell(name: str, value: object, type_: str) -> str:
    """A summary cell: ids plain, JSON compact and shortened, numbers formatted."""
    if value is None:
        return "—"
    if type_ == "JSON":
        text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
        return _e(text if len(text) <= JSON_MAX_CHARS else text[:JSON_MAX_CHARS] + "…")
    if name.endswith("_id") or type_ in ("VARCHAR", "BOOLEAN"):
        return _e(value)
    return _n(value)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], left: Sequence[int] = (0,)) -> str:
    """Rows of already-escaped cell strings (headers are escaped here)."""
    h = "".join(f'<th class="l">{_e(c)}</th>' if i in left else f"<th>{_e(c)}</th>" for i, c in enumerate(headers))
    body = "".join(
        "<tr>" + "".join(f'<td class="l">{c}</td>' if i in left else f"<td>{c}</td>" for i, c in enumerate(r))
        + "</tr>" for r in rows)
    return f"<table><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"


def _capped(rows: list[dict], cap: int = MAX_TABLE_ROUNDS) -> tuple[list[dict], str | None]:
    if len(rows) <= cap:
        return rows, None
    head = cap // 2
    note = f"Showing the first {head} and the last {cap - head} of {len(rows):,} rounds."
    return rows[:head] + rows[len(rows) - (cap - head):], note


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


def option_colors(options: Sequence[str]) -> dict[str, object]:
    """One colour per option, the same in every figure of a report ("(other)" grey)."""
    cmap = colormaps["tab10"] if len(options) <= 10 else colormaps["tab20"]
    out, i = {}, 0
    for o in options:
        if o == "(other)":
            out[o] = "#999999"
        else:
            out[o] = cmap(i % cmap.N)
            i += 1
    return out


def histogram_bins(lo: float, hi: float, integer: bool) -> tuple[float, float, int]:
    """(lo, hi, bins) for a histogram of values in [lo, hi]: one bin per value for an integer
    measure with a small span (bars centred on the integers), else HIST_BINS equal bins."""
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    if integer and hi - lo <= MAX_INTEGER_BINS:
        a, b = math.floor(lo) - 0.5, math.ceil(hi) + 0.5
        return a, b, int(b - a)
    return lo, hi, HIST_BINS


def histogram_figure(edges: np.ndarray, counts: dict[int, np.ndarray], table: dict[int, dict],
                     rounds: Sequence[int], title: str, noun: str = "guess",
                     reference: Sequence[tuple[str, str]] = (), equilibrium: float | None = None) -> Figure:
    """Figure 1 (numeric): one histogram panel per round from binned counts; the simulation's
    reference columns (``(column, label)``; solid), the mean (dashed) and the equilibrium (dotted)
    as vertical lines."""
    k = max(len(rounds), 1)
    ncols = min(3, k)
    nrows = math.ceil(k / ncols)
    fig = _figure(4.0 * ncols, 3.0 * nrows + 0.4)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    widths = np.diff(edges)
    for i, ax in enumerate(axes.flat):
        if i >= len(rounds):
            ax.set_visible(False)
            continue
        r = rounds[i]
        c = counts.get(r, np.zeros(len(edges) - 1, dtype=np.int64))
        row = table.get(r, {})
        summary = row.get("summary") or {}
        ax.bar(edges[:-1], c, width=widths, align="edge", color="#7aa6d6", edgecolor="#2f5f8f", linewidth=0.6)
        drawn = False
        for j, (col, label) in enumerate(reference):
            v = summary.get(col)
            if v is not None:
                ax.axvline(v, color=REFERENCE_STYLES[j % len(REFERENCE_STYLES)][0], linewidth=2,
                           label=f"{label} {v:.2f}")
                drawn = True
        if row.get("mean") is not None:
            ax.axvline(row["mean"], color="#222222", linestyle="--", linewidth=1.4, label=f"mean {row['mean']:.2f}")
            drawn = True
        if equilibrium is not None:
            ax.axvline(equilibrium, color="#555555", linestyle=":", linewidth=1.4,
                       label=f"equilibrium {equilibrium:g}")
            drawn = True
        ax.set_xlim(edges[0], edges[-1])
        ax.set_title(f"Round {r} (n={int(c.sum()):,} valid)", fontsize=10)
        ax.set_xlabel(noun)
        ax.set_ylabel("agents")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        if not c.sum():
            ax.text(0.5, 0.5, f"no valid {noun}", transform=ax.transAxes, ha="center", va="center", color="#888")
        if drawn:
            ax.legend(fontsize=8, loc="upper right")
    fig.suptitle(title, fontsize=12)
    return fig


def group_figure(groups: dict[str, list[dict]], equilibrium: float | None, round_label: str,
                 measure_range: tuple[float, float] | None = None, noun: str = "guess",
                 title: str = "Figure 2. Mean guess per group") -> Figure:
    """Figure 2 (numeric): per-group mean with 95% CI error bars, one panel per attribute. The y
    axis stays within the measure's range: a tiny group's huge CI would otherwise flatten every
    other bar (its exact bounds are in the table below the figure)."""
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
        _group_ticks(ax, rows)
        if equilibrium is not None:
            ax.axhline(equilibrium, color="#555", linestyle="--", linewidth=1, label=f"equilibrium {equilibrium:g}")
            ax.legend(fontsize=8)
        if measure_range is not None and np.isfinite(means).any():
            lo, hi = measure_range
            top = float(np.nanmax(means + high))
            bottom = min(lo, 0.0)
            ax.set_ylim(bottom, max(min(top * 1.1, hi + 0.05 * (hi - lo)), bottom + 1e-9) if top > bottom
                        else bottom + 1.0)
        ax.set_xlabel(attr)
        ax.set_ylabel(f"mean {noun} ({round_label})")
        ax.set_title(f"Mean {noun} by {attr} (95% CI across agents)", fontsize=10)
    fig.suptitle(title, fontsize=12)
    return fig


def _group_ticks(ax, rows: list[dict]) -> None:
    labels = [f"{r['group']}\n(n={r['n']:,})" for r in rows]
    many = len(rows) > 4
    ax.set_xticks(np.arange(len(rows)), labels, fontsize=8, rotation=30 if many else 0,
                  ha="right" if many else "center")


def convergence_figure(rows: list[dict], title: str, trend: Sequence[tuple[str, str]] = (
        ("target", "target"), ("winner_value", "winning number")), noun: str = "guess",
        n_reference: int | None = None) -> Figure:
    """Figure 3 (numeric): mean, median and the trend columns (``(column, label)``; the first
    ``n_reference`` are reference columns, solid, the rest dotted) per round; equilibrium dashed."""
    fig = _figure(7.5, 4.2)
    ax = fig.subplots()
    x = [r["round"] for r in rows]

    def col(key: str) -> list[float]:
        return [np.nan if r.get(key) is None else r[key] for r in rows]

    ax.plot(x, col("mean"), "o-", color="#1f77b4", label="mean")
    ax.plot(x, col("median"), "s-", color="#2ca02c", label="median")
    n_ref = 1 if n_reference is None else n_reference
    for j, (c, label) in enumerate(trend):
        color, style = (REFERENCE_STYLES[j % 3] if j < n_ref else TREND_STYLES[(j - n_ref) % 3])
        ax.plot(x, col(c), style, color=color, label=label)
    eq = rows[0]["equilibrium"] if rows else None
    if eq is not None:
        ax.axhline(eq, color="#444", linestyle="--", linewidth=1.2, label=f"equilibrium ({eq:g})")
    ax.set_xlabel("round")
    ax.set_ylabel(noun)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(title, fontsize=11)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def shares_figure(rounds: list[dict], options: list[str], title: str, noun: str) -> Figure:
    """Figure 1 (categorical): each option's share of the valid answers per round, stacked."""
    fig = _figure(8.0, 4.4)
    ax = fig.subplots()
    colors = option_colors(options)
    x = np.array([r["round"] for r in rounds])
    shares = {o: np.array([(r["shares"] or {}).get(o) or 0.0 for r in rounds], dtype=float) for o in options}
    bottom = np.zeros(len(rounds))
    if len(rounds) <= MAX_STACKED_BARS:
        for o in options:
            ax.bar(x, shares[o], bottom=bottom, color=colors[o], edgecolor="white", linewidth=0.5, label=o)
            bottom += shares[o]
    else:
        ax.stackplot(x, *[shares[o] for o in options], colors=[colors[o] for o in options], labels=options)
    ax.set_ylim(0, 1)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel(f"share of valid {plural(noun)}")
    ax.set_title(title, fontsize=11)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5), title=noun)
    return fig


def share_group_figure(groups: dict[str, list[dict]], options: list[str], round_label: str, noun: str,
                       title: str) -> Figure:
    """Figure 2 (categorical): each option's share per group (grouped bars) with 95% Wilson CIs,
    one panel per attribute."""
    k = max(len(groups), 1)
    ncols = 1 if len(options) > 3 else min(2, k)
    nrows = math.ceil(k / ncols)
    fig = _figure(6.0 * ncols + (2.0 if ncols == 1 else 0), 3.8 * nrows + 0.4)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    colors = option_colors(options)
    items = list(groups.items())
    for i, ax in enumerate(axes.flat):
        if i >= len(items):
            ax.set_visible(False)
            continue
        attr, rows = items[i]
        labels = list(dict.fromkeys(r["group"] for r in rows))
        n_of = {r["group"]: r["n"] for r in rows}
        width = 0.8 / max(len(options), 1)
        x = np.arange(len(labels))
        for j, o in enumerate(options):
            cell = {r["group"]: r for r in rows if r["option"] == o}
            share = np.array([cell[g]["share"] if g in cell and cell[g]["share"] is not None else np.nan
                              for g in labels], dtype=float)
            lo = np.array([share[m] - cell[g]["ci_low"] if g in cell and cell[g]["ci_low"] is not None else 0.0
                           for m, g in enumerate(labels)], dtype=float)
            hi = np.array([cell[g]["ci_high"] - share[m] if g in cell and cell[g]["ci_high"] is not None else 0.0
                           for m, g in enumerate(labels)], dtype=float)
            ax.bar(x - 0.4 + width * (j + 0.5), share, width=width, yerr=[lo, hi], capsize=2, color=colors[o],
                   label=o, error_kw={"elinewidth": 0.9, "ecolor": "#222"})
        _group_ticks(ax, [{"group": g, "n": n_of[g]} for g in labels])
        ax.set_ylim(0, 1)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.set_xlabel(attr)
        ax.set_ylabel(f"share ({round_label})")
        ax.set_title(f"Share of each {noun} by {attr} (95% Wilson CI)", fontsize=10)
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5), title=noun)
    fig.suptitle(title, fontsize=12)
    return fig


def share_convergence_figure(rounds: list[dict], options: list[str], title: str, noun: str) -> Figure:
    """Figure 3 (categorical): each option's share per round with its 95% Wilson band."""
    fig = _figure(8.0, 4.4)
    ax = fig.subplots()
    colors = option_colors(options)
    x = np.array([r["round"] for r in rounds])
    for o in options:
        share = np.array([np.nan if (r["shares"] or {}).get(o) is None else r["shares"][o] for r in rounds])
        band = [wilson_interval(r["counts"].get(o, 0), sum(r["counts"].values())) for r in rounds]
        lo = np.array([np.nan if b[0] is None else b[0] for b in band])
        hi = np.array([np.nan if b[1] is None else b[1] for b in band])
        ax.plot(x, share, "o-", color=colors[o], label=o, markersize=3 if len(x) > 30 else 5)
        ax.fill_between(x, lo, hi, color=colors[o], alpha=0.18, linewidth=0)
    ax.set_ylim(0, 1)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel(f"share of valid {plural(noun)}")
    ax.set_title(title, fontsize=11)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5), title=noun)
    ax.grid(alpha=0.3)
    return fig


def group_spread_figure(spread: dict, overall: list[tuple[int, float | None]], title: str, ylabel: str,
                        equilibrium: float | None = None, percent: bool = False) -> Figure:
    """Figure 4 (grouped simulations): the measure per round over all agents (thick), and per
    group: a line each when there are few groups, else the spread of the group values (10–90%
    and 25–75% quantile bands across groups, their median dashed)."""
    fig = _figure(8.0, 4.4)
    ax = fig.subplots()
    if spread["lines"] is not None:
        cmap = colormaps["tab10"]
        for i, (gid, pts) in enumerate(sorted(spread["lines"].items())):
            ax.plot([p[0] for p in pts], [np.nan if p[1] is None else p[1] for p in pts], "-", linewidth=1.1,
                    color=cmap(i % 10), alpha=0.85, label=f"group {gid}")
    else:
        rows = spread["rounds"]
        x = np.array([r["round"] for r in rows])

        def col(k: str) -> np.ndarray:
            return np.array([np.nan if r[k] is None else r[k] for r in rows], dtype=float)

        ax.fill_between(x, col("q10"), col("q90"), color="#7aa6d6", alpha=0.25, linewidth=0,
                        label="groups: 10–90%")
        ax.fill_between(x, col("q25"), col("q75"), color="#7aa6d6", alpha=0.5, linewidth=0,
                        label="groups: 25–75%")
        ax.plot(x, col("median"), "--", color="#2f5f8f", linewidth=1.2, label="groups: median")
    ax.plot([p[0] for p in overall], [np.nan if p[1] is None else p[1] for p in overall], "o-", color="#111",
            linewidth=2.2, markersize=4, label="all agents")
    if equilibrium is not None:
        ax.axhline(equilibrium, color="#444", linestyle=":", linewidth=1.2, label=f"equilibrium ({equilibrium:g})")
    if percent:
        ax.set_ylim(0, 1)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=11)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    ax.grid(alpha=0.3)
    return fig


# --- report sections ------------------------------------------------------------------
def _header(info: dict, rounds: list[dict], inv: dict, n_groups: int | None) -> str:
    total = sum(r["n"] for r in rounds)
    sim = info.get("simulation")
    if not info.get("loaded"):
        sim = f"{sim} (not loadable here)"
    eq = None
    if info.get("measure_kind") == "numeric":
        eq = f"{info['equilibrium']:g}" if info["equilibrium"] is not None else "none (not unique or not declared)"
    measure = None
    if info.get("measure"):
        measure = f"{info['measure']} ({info['measure_kind']}), table {info['outcome_table']}"
    noun = info.get("noun") or "answer"
    rows = [
        ("run", info["run_id"]),
        ("name", info.get("name")),
        ("simulation", sim),
        ("status", info.get("status") + (f" ({info['reason']})" if info.get("reason") else "")
         if info.get("status") else None),
        ("agents", _n(info.get("agents")) if info.get("agents") is not None else None),
        ("rounds", f"{info.get('rounds')} configured, {len(rounds)} recorded"),
        ("game", info["description"]) if info.get("description") else
        ("parameters", params_text(info.get("params") or {}) or None),
        ("measure", measure),
        ("equilibrium", eq),
        ("groups", _n(n_groups) if n_groups is not None else None),
        ("model", _model_text(info.get("model") or {})),
        ("prompt", _prompt_text(info.get("prompt"))),
        ("population", _population_text(info.get("population"))),
        ("seed", info.get("seed")),
        ("started / finished", f"{info.get('started_at') or '—'} / {info.get('finished_at') or '—'}"),
        ("hosts", ", ".join(info.get("hosts") or []) or None),
        (plural(noun), f"{total:,} recorded, {inv['count']:,} invalid (the model's answer could not be read)"),
        ("LLM work", _usage_text(info.get("usage"))),
    ]
    body = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in rows if v is not None)
    return f'<table class="kv">{body}</table>'


def _usage_text(u: dict | None) -> str | None:
    """The run's LLM work, infrastructure failures apart from the model's: a prompt no model
    answered was asked again, and is never recorded as an answer."""
    if u is None:
        return None
    return (f"{u['llm_calls']:,} calls, {u['prompt_tokens']:,} prompt + {u['completion_tokens']:,} completion "
            f"tokens; {u['infra_retries']:,} infrastructure retries (prompts asked again because no model "
            "answered; never recorded as answers)")


def _summary_columns(info: dict, skip: Sequence[str] = ()) -> list[tuple[str, str]]:
    """(column, title) of the simulation's summary columns, minus those the analysis computes
    itself from the outcomes (the ratio game's `mean`)."""
    return [(c, t) for c, t in info["labels"].items() if c not in skip]


def _most_chosen(row: dict) -> str:
    """'no (48.0%)', 'tie (36.0%)' or '—': a round's leading option, escaped."""
    if row.get("leader_share") is None:
        return "—"
    return f"{_e(row['leader'] if row['leader'] is not None else 'tie')} ({_pct(row['leader_share'])})"


def _round_rows(rounds: list[dict], info: dict, types: dict[str, str]) -> str:
    kind = info.get("measure_kind")
    cols = _summary_columns(info, skip=STATS if kind == "numeric" else ())
    headers = ["round", "n", "valid", "invalid"]
    options: list[str] = []
    if kind == "numeric":
        headers += list(STATS)
    elif kind == "categorical":
        options = rounds[0]["options"] if rounds else []
        headers += ["most chosen", *options]
    headers += [t for _, t in cols]
    usage = any(r.get("usage") for r in rounds)
    if usage:
        headers += ["LLM calls", "prompt tokens", "completion tokens", "infra retries"]
    rows = []
    for r in rounds:
        cells = [_n(r["round"]), _n(r["n"]), _n(r["n_valid"]), _n(r["n_invalid"])]
        if kind == "numeric":
            cells += [_n(r[k]) for k in STATS]
        elif kind == "categorical":
            cells += [_most_chosen(r), *(_pct(r["shares"].get(o)) for o in options)]
        s = r["summary"] or {}
        cells += [_cell(c, s.get(c), types.get(c, "")) for c, _ in cols]
        if usage:
            u = r.get("usage") or {}
            cells += [_n(u.get(k)) for k in Usage.RECORDED]
        rows.append(cells)
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


def _share_group_rows(rows: list[dict], options: list[str]) -> str:
    """One row per group, one column per option: 'share [low, high]' (95% Wilson)."""
    groups: dict[str, dict] = {}
    for r in rows:
        g = groups.setdefault(r["group"], {"n": r["n"], "cells": {}})
        g["cells"][r["option"]] = r
    out = []
    for name, g in groups.items():
        cells = [_e(name), _n(g["n"])]
        for o in options:
            r = g["cells"].get(o)
            if r is None or r["share"] is None:
                cells.append("—")
            else:
                cells.append(f"{_pct(r['share'])} [{_pct(r['ci_low'])}, {_pct(r['ci_high'])}]")
        out.append(cells)
    return _table(["group", "n", *options], out)


def _numeric_sections(con, run_id: str, info: dict, rounds: list[dict], attrs: list[str]) -> list[str]:
    noun, nouns = info["noun"], plural(info["noun"])
    cap = nouns[:1].upper() + nouns[1:]
    by_round = {r["round"]: r for r in rounds}
    labels = info["labels"]
    eq = info["equilibrium"]
    rng = tuple(info["measure_range"]) if info.get("measure_range") else None
    parts = [f"<h2>Figure 1. {_e(cap)} per round</h2>"]
    show = shown_rounds([r["round"] for r in rounds])
    shown_stats = [by_round[r] for r in show if by_round[r]["min"] is not None]
    if shown_stats:
        lo = min(r["min"] for r in shown_stats)
        hi = max(r["max"] for r in shown_stats)
        if rng is not None:
            lo, hi = min(lo, rng[0]), max(hi, rng[1])
        a, b, bins = histogram_bins(lo, hi, integer=info.get("measure_type") == "BIGINT")
        edges, counts = histogram(con, run_id, show, a, b, bins)
        fig_title = f"Figure 1. Distribution of {nouns} per round ({_caption(info)})"
        ref = [(c, labels.get(c, c)) for c in info["reference_columns"]]
        parts.append(_img(png_data_uri(histogram_figure(edges, counts, by_round, show, fig_title, noun, ref, eq)),
                          f"Histogram of {nouns} per round"
                          + (f" with the {', '.join(t for _, t in ref)}" if ref else "")))
        if len(show) < len(rounds):
            parts.append(f'<p class="note">Showing rounds {", ".join(map(str, show))} of {len(rounds)}.</p>')
    else:
        parts.append(f'<p class="note">No valid {_e(nouns)} to plot.</p>')

    parts.append(f"<h2>Figure 2. Mean {_e(noun)} per group</h2>")
    if attrs:
        lr = last_round(con, run_id)
        round_label = f"round {lr}" if lr is not None else "last round"
        groups = {a: group_table(con, [run_id], a) for a in attrs}
        if any(groups.values()):
            parts.append(_img(png_data_uri(group_figure({a: g for a, g in groups.items() if g}, eq, round_label,
                                                        rng, noun, f"Figure 2. Mean {noun} per group")),
                              f"Mean {noun} per group with 95% confidence intervals"))
        for a, g in groups.items():
            parts.append(f"<h3>By {_e(a)} ({_e(round_label)})</h3>")
            parts.append(_group_rows(g) if g else f'<p class="note">No valid {_e(nouns)}.</p>')
        parts.append('<p class="note">95% CI: Student-t interval of the mean across the agents of the group.</p>')
    else:
        parts.append('<p class="note">This run has no population profiles to group by.</p>')

    parts.append("<h2>Figure 3. Convergence over rounds</h2>")
    conv = convergence_table(con, [run_id])
    if conv:
        trend = [(c, labels.get(c, c)) for c in info["trend_columns"]]
        fig = convergence_figure(conv, f"Figure 3. Convergence ({_caption(info)})", trend, noun,
                                 n_reference=len(info["reference_columns"]))
        parts.append(_img(png_data_uri(fig), "Mean, median" + "".join(f", {t}" for _, t in trend) + " per round"))
        dist = [c for c in conv if c["distance"] is not None]
        if dist:
            parts.append(f'<p class="note">Distance of the mean to the equilibrium: round {dist[0]["round"]} '
                         f'{_n(dist[0]["distance"])} → round {dist[-1]["round"]} {_n(dist[-1]["distance"])}.</p>')
    else:
        parts.append('<p class="note">No rounds to plot.</p>')
    return parts


def _categorical_sections(con, run_id: str, info: dict, rounds: list[dict], attrs: list[str]) -> list[str]:
    noun, nouns = info["noun"], plural(info["noun"])
    cap = nouns[:1].upper() + nouns[1:]
    options = rounds[0]["options"] if rounds else []
    parts = [f"<h2>Figure 1. {_e(cap)} per round</h2>"]
    if options:
        parts.append(_img(png_data_uri(shares_figure(rounds, options, f"Figure 1. Share of each {noun} per round "
                                                                      f"({_caption(info)})", noun)),
                          f"Share of each {noun} per round"))
    else:
        parts.append(f'<p class="note">No valid {_e(nouns)} to plot.</p>')

    parts.append(f"<h2>Figure 2. Share of each {_e(noun)} per group</h2>")
    if attrs:
        lr = last_round(con, run_id)
        round_label = f"round {lr}" if lr is not None else "last round"
        groups = {a: group_table(con, [run_id], a) for a in attrs}
        opts = next((list(dict.fromkeys(r["option"] for r in g)) for g in groups.values() if g), [])
        if any(groups.values()):
            parts.append(_img(png_data_uri(share_group_figure({a: g for a, g in groups.items() if g}, opts,
                                                              round_label, noun,
                                                              f"Figure 2. Share of each {noun} per group")),
                              f"Share of each {noun} per group with 95% Wilson confidence intervals"))
        for a, g in groups.items():
            parts.append(f"<h3>By {_e(a)} ({_e(round_label)})</h3>")
            parts.append(_share_group_rows(g, opts) if g else f'<p class="note">No valid {_e(nouns)}.</p>')
        parts.append('<p class="note">Each cell: the share of the group\'s valid answers and its 95% Wilson score '
                     "interval (it stays within 0–100% and keeps its coverage for small groups and shares near "
                     "0 or 100%, where the normal approximation fails).</p>")
    else:
        parts.append('<p class="note">This run has no population profiles to group by.</p>')

    parts.append("<h2>Figure 3. Convergence over rounds</h2>")
    if options:
        parts.append(_img(png_data_uri(share_convergence_figure(rounds, options, f"Figure 3. Share of each {noun} "
                                                                                 "over rounds (95% Wilson band)",
                                                                noun)),
                          f"Share of each {noun} per round with 95% Wilson bands"))
    else:
        parts.append('<p class="note">No rounds to plot.</p>')
    return parts


def _grouped_section(con, run_id: str, info: dict, rounds: list[dict], spread: dict) -> list[str]:
    noun = info["noun"]
    categorical = info["measure_kind"] == "categorical"
    what = spread["value"]
    title = (f"Figure 4. Share of {spread.get('option')} per round, overall and per group" if categorical
             else f"Figure 4. Mean {noun} per round, overall and per group")
    parts = [f"<h2>{_e(title)}</h2>"]
    if not spread["rounds"]:
        parts.append('<p class="note">No group has a valid answer.</p>')
        return parts
    if categorical:
        overall = [(r["round"], (r["shares"] or {}).get(spread["option"])) for r in rounds]
    else:
        overall = [(r["round"], r["mean"]) for r in rounds]
    fig = group_spread_figure(spread, overall, title, what,
                              None if categorical else info["equilibrium"], percent=categorical)
    how = "one line per group" if spread["lines"] is not None else "quantile bands of the group values"
    parts.append(_img(png_data_uri(fig), f"{what} per round over all agents and per group ({how})"))
    fmt = _pct if categorical else _n
    shown, note = _capped(spread["rounds"])
    by_round = dict(overall)
    parts.append(_table(["round", "groups", "all agents", "group min", "25%", "median", "75%", "group max"],
                        [[_n(r["round"]), _n(r["n_groups"]), fmt(by_round.get(r["round"])), fmt(r["min"]),
                          fmt(r["q25"]), fmt(r["median"]), fmt(r["q75"]), fmt(r["max"])] for r in shown], left=()))
    parts.append(f'<p class="note">Per group: the {_e(what)} over the group\'s valid answers in the round; '
                 f"{spread['n_groups']:,} groups in the run. All agents: over every valid answer of the round."
                 + (f" {note}" if note else "") + "</p>")
    return parts


def render_report(con: duckdb.DuckDBPyConnection, run_id: str,
                  by: str | Sequence[str] | None = None) -> str:
    """The run's report as one self-contained HTML page (str).

    ``by``: the attributes to group by (a name or a list); default: every profile attribute of
    the run, at most 4. Raises AnalysisError for an unknown run or attribute."""
    info = run_info(con, run_id)
    rounds = round_table(con, run_id)
    types = tables_of(con, run_id).summary_types
    inv = invalid_answers(con, run_id, limit=RAW_EXAMPLES)
    if by is None:
        attrs = attributes(con, run_id)[:MAX_GROUP_PLOTS]
    else:
        attrs = [by] if isinstance(by, str) else list(by)
    spread = group_spread(con, run_id) if info["grouped"] and info["measure"] else None

    title = f"Populace run {run_id}"
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
             f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
             f"<title>{_e(title)}</title><style>{CSS}</style></head><body>",
             f"<h1>{_e(title)}</h1>",
             f'<p class="note">{_e(info.get("name") or "")} — {_e(describe(info))}</p>',
             _header(info, rounds, inv, spread["n_groups"] if spread else None)]
    if info.get("note"):
        parts.append(f'<p class="warn">{_e(info["note"])}</p>')
    parts.append("<h2>Per round</h2>")
    if rounds:
        shown, note = _capped(rounds)
        parts.append(_round_rows(shown, info, types))
        src = f"the recorded {plural(info['noun'])} (table {info['outcome_table']}"
        parts.append(f'<p class="note">n, valid and the statistics: from {_e(src)}; std: sample); the other '
                     f"columns: the environment's round result (table {_e(info['summary_table'])})."
                     + (f" {note}" if note else "") + "</p>")
    else:
        parts.append('<p class="note">No round was recorded for this run.</p>')

    if info["measure_kind"] == "numeric":
        parts += _numeric_sections(con, run_id, info, rounds, attrs)
    elif info["measure_kind"] == "categorical":
        parts += _categorical_sections(con, run_id, info, rounds, attrs)
    else:
        parts.append('<p class="note">The simulation declares no measure: no figures.</p>')
    if spread is not None:
        parts += _grouped_section(con, run_id, info, rounds, spread)
    fork = fork_table(con, run_id)
    if fork is not None:
        parts += _fork_section(fork, info)

    parts.append("<h2>Invalid answers</h2>")
    parts.append(f"<p>{inv['count']:,} invalid answer(s) in this run.</p>")
    if inv["examples"]:
        rows = []
        for ex in inv["examples"]:
            raw = "" if ex["raw"] is None else str(ex["raw"])
            if len(raw) > RAW_MAX_CHARS:
                raw = raw[:RAW_MAX_CHARS] + "…"
            rows.append([_n(ex["round"]), _e(ex["agent_id"]), f"<code>{_e(raw)}</code>", _e(ex.get("error") or "")])
        parts.append(_table(["round", "agent", "raw answer", "error"], rows, left=(2, 3)))

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


def fork_figure(fork: dict, title: str, noun: str, reference: Sequence[tuple[str, str]] = ()) -> Figure:
    """A fork beside its parent over rounds (parent solid, fork dashed): the mean and the first
    reference column (numeric), or each option's share (categorical, one colour per option);
    the fork's first round marked."""
    fig = _figure(7.5, 4.2)
    ax = fig.subplots()
    rows = fork["rounds"]
    x = [r["round"] for r in rows]
    k = fork["after_round"]
    # the fork's line branches off the parent's at round k, the state it starts from
    mine = [r if r["round"] >= k else {**r, "fork": None} for r in rows]

    def series(who: str, value) -> list[float]:
        """`value(stat)` per round for the parent or the fork (NaN where there is none)."""
        out = [value(r[who]) if r[who] else None for r in mine]
        return [np.nan if v is None else v for v in out]

    if fork["measure_kind"] == "numeric":
        for who, style, color in (("parent", "o-", "#1f77b4"), ("fork", "s--", "#d62728")):
            ax.plot(x, series(who, lambda st: st.get("mean")), style, color=color, label=f"mean, {who}")
        for c, label in reference[:1]:  # the simulation's first reference line (the ratio game's target)
            for who, style in (("parent", "-"), ("fork", "--")):
                ax.plot(x, series(who, lambda st, c=c: (st.get("summary") or {}).get(c)), style, color="#ff7f0e",
                        linewidth=1.0, label=f"{label}, {who}")
        ax.set_ylabel(noun)
    else:
        options = list(dict.fromkeys(o for r in rows for who in ("parent", "fork")
                                     for o in ((r[who] or {}).get("shares") or {})))
        colors = option_colors(options)
        for o in options:
            for who, style in (("parent", "-"), ("fork", "--")):
                ax.plot(x, series(who, lambda st, o=o: (st.get("shares") or {}).get(o)), style, color=colors[o],
                        label=f"{o} ({who})")
        ax.set_ylim(0, 1)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.set_ylabel(f"share of valid {plural(noun)}")
    ax.axvline(k + 0.5, color="#444", linestyle=":", linewidth=1.2, label=f"fork after round {k}")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_title(title, fontsize=11)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    ax.grid(alpha=0.3)
    return fig


def _fork_section(fork: dict, info: dict) -> list[str]:
    noun = info.get("noun") or "answer"
    numeric = fork["measure_kind"] == "numeric"
    changes = json.dumps(fork["changes"], sort_keys=True, default=str)
    refs = [(c, info["labels"].get(c, c)) for c in info.get("reference_columns") or []]
    parts = ["<h2>Fork beside its parent</h2>",
             f'<p>This run forks <code>{_e(fork["parent"])}</code> after round {fork["after_round"]}, '
             f"with the change <code>{_e(changes)}</code>. Rounds up to {fork['after_round']} are the parent's.</p>"]
    if fork["measure_kind"] is not None:
        title = f"Fork {fork['fork']} and parent {fork['parent']}"
        parts.append(_img(png_data_uri(fork_figure(fork, title, noun, refs)), "The fork and its parent per round"))
    what = f"mean {noun}" if numeric else "most chosen"

    def cell(stat: dict | None) -> str:
        if stat is None:
            return "—"
        return _n(stat.get("mean")) if numeric else _most_chosen(stat)

    def ref(stat: dict | None, column: str) -> str:
        return _n(((stat or {}).get("summary") or {}).get(column))

    rows = []
    for r in fork["rounds"]:
        cells = [_n(r["round"]), cell(r["parent"]), "(shared)" if r["shared"] else cell(r["fork"]),
                 *((("" if r["shared"] else _n(r["difference"])),) if numeric else ())]
        for c, _ in refs:
            cells += [ref(r["parent"], c), "(shared)" if r["shared"] else ref(r["fork"], c)]
        rows.append(cells)
    heads = ["round", f"parent: {what}", f"fork: {what}", *(("difference",) if numeric else ())]
    for _, label in refs:
        heads += [f"parent: {label}", f"fork: {label}"]
    parts.append(_table(heads, rows))
    return parts


def write_report(con: duckdb.DuckDBPyConnection, run_id: str, out_path: str | Path,
                 by: str | Sequence[str] | None = None) -> Path:
    """Render the report and write it to ``out_path`` (UTF-8); returns the path."""
    text = render_report(con, run_id, by=by)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return out


__all__ = ["describe", "params_text", "render_report", "shown_rounds", "write_report"]
