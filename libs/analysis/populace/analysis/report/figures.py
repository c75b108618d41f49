"""The report's figures as Plotly figures, from the tables' rows (never from all answers). Pure:
data in, ``go.Figure`` out; the page turns them into JSON drawn by the inlined plotly.js.

Conventions, so every figure reads the same and none misleads:
- legends sit above the plot area, never over bars or points;
- reference lines (the simulation's target, the mean, the equilibrium) are drawn above the
  data, dashed or dotted, each named once in the legend, and the axis is padded so a line at
  the range's edge (an equilibrium at 0) stays visible;
- confidence intervals are cut to the measure's range, and a cut end carries a red triangle
  whose hover gives the true interval;
- groups of at most SMALL_GROUP agents are drawn as their points with the mean ± CI, larger
  ones as bars with the CI.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from populace.analysis.bins import HIST_BINS, MAX_INTEGER_BINS, histogram_bins  # noqa: F401 (re-exported)
from populace.analysis.report.intervals import DrawnInterval, clip_interval, padded_range
from populace.analysis.report.text import number, percent
from populace.analysis.tables import plural

SMALL_GROUP = 30  # a group of at most this many agents is drawn as its points (a strip)
MAX_STACKED_BARS = 60  # shares per round: bars up to this many rounds, else an area plot
FONT = 'system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif'  # the reader's own: no web font
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
OTHER_COLOR = "#999999"
BAR_COLOR, BAR_EDGE = "#7aa6d6", "#2f5f8f"
REFERENCE_COLORS = ("#d62728", "#ff7f0e", "#8c564b")
TREND_COLORS = ("#9467bd", "#17becf", "#bcbd22")
EQUILIBRIUM = {"color": "#333333", "dash": "dash", "width": 2}
CLIPPED_COLOR = "#c0392b"
PANEL_HEIGHT = 320
# plotly_white's look without its per-trace-type defaults (colour scales of heatmaps, contours …),
# which would be repeated in every figure's JSON for traces the report never draws
TEMPLATE = go.layout.Template(layout=pio.templates["plotly_white"].layout)


# --- shared pieces ----------------------------------------------------------------------
def _layout(fig: go.Figure, height: int, *, legend: bool = True) -> go.Figure:
    """White background, the reader's font, and the legend in a row above the plot area (its
    own margin, so it covers nothing)."""
    fig.update_layout(
        template=TEMPLATE, height=height, font={"family": FONT, "size": 12},
        margin={"l": 60, "r": 20, "t": 90 if legend else 40, "b": 60}, showlegend=legend,
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.08, "xanchor": "left", "x": 0},
        hoverlabel={"font": {"family": FONT}})
    return fig


def _integer_rounds(fig: go.Figure, rounds: Sequence[int], **where) -> None:
    """A round axis shows whole rounds only."""
    fig.update_xaxes(title_text="round", tickformat="d", dtick=1 if len(rounds) <= 20 else None, **where)


def option_colors(options: Sequence[str]) -> dict[str, str]:
    """One colour per option, the same in every figure of a report ("(other)" grey)."""
    out, i = {}, 0
    for o in options:
        if o == "(other)":
            out[o] = OTHER_COLOR
        else:
            out[o] = PALETTE[i % len(PALETTE)]
            i += 1
    return out


def _nan(values: Sequence[float | None]) -> list[float]:
    return [math.nan if v is None else float(v) for v in values]


def _line(fig: go.Figure, axis: str, value: float, name: str, line: dict, *, legend: bool, label: str | None = None,
          **where) -> None:
    """A reference line across a panel (``axis`` "x": vertical at x=value, "y": horizontal),
    above the data, named in the legend once per ``name``."""
    add = fig.add_vline if axis == "x" else fig.add_hline
    add(value, line=line, layer="above", showlegend=legend, name=name, legendgroup=name,
        label={"text": label, "font": {"size": 10, "color": line.get("color")},
               "textposition": "end"} if label else None, **where)


# --- numeric: distribution per round ---------------------------------------------------------
def histogram_figure(edges: np.ndarray, counts: dict[int, np.ndarray], table: dict[int, dict],
                     rounds: Sequence[int], noun: str = "guess", reference: Sequence[tuple[str, str]] = (),
                     equilibrium: float | None = None) -> go.Figure:
    """One histogram panel per round from binned counts, with the simulation's reference columns
    (``(column, label)``, solid), the round's mean (dashed) and the equilibrium (dotted) as
    vertical lines labelled with their value."""
    k = max(len(rounds), 1)
    ncols = min(3, k)
    nrows = math.ceil(k / ncols)
    titles = [f"Round {r} (n={int(counts.get(r, np.zeros(1)).sum()):,} valid)" for r in rounds]
    fig = make_subplots(rows=nrows, cols=ncols, subplot_titles=titles, horizontal_spacing=0.07,
                        vertical_spacing=0.32 / nrows if nrows > 1 else 0.1)
    centres = (edges[:-1] + edges[1:]) / 2
    bounds = np.column_stack([edges[:-1], edges[1:]])
    x_range = padded_range([edges[0], edges[-1], equilibrium])
    for i, r in enumerate(rounds):
        where = {"row": i // ncols + 1, "col": i % ncols + 1}
        c = counts.get(r, np.zeros(len(edges) - 1, dtype=np.int64))
        fig.add_trace(go.Bar(
            x=centres, y=c, width=np.diff(edges), marker={"color": BAR_COLOR, "line": {"color": BAR_EDGE, "width": 1}},
            customdata=bounds, name=f"round {r}", showlegend=False,
            hovertemplate=f"{noun} %{{customdata[0]:.4g}} to %{{customdata[1]:.4g}}<br>%{{y:,}} agents"
                          f"<extra>round {r}</extra>"), **where)
        top = max(int(c.max()) if c.size else 0, 1) * 1.08
        summary = table.get(r, {}).get("summary") or {}
        lines = [(label, summary.get(col), {"color": REFERENCE_COLORS[j % 3], "width": 2})
                 for j, (col, label) in enumerate(reference)]
        lines.append(("mean", table.get(r, {}).get("mean"), {"color": "#222222", "dash": "dash", "width": 1.5}))
        if equilibrium is not None:
            lines.append((f"equilibrium {equilibrium:g}", equilibrium, {**EQUILIBRIUM, "dash": "dot"}))
        for name, value, line in lines:
            if value is None:
                continue
            # a line as a trace, not a shape: drawn above the bars and answering hover with its value
            fig.add_trace(go.Scatter(x=[value, value], y=[0, top], mode="lines", line=line, name=name,
                                     legendgroup=name, showlegend=i == 0,
                                     hovertemplate=f"{name}: {value:.4g}<extra>round {r}</extra>"), **where)
        fig.update_xaxes(range=x_range, title_text=noun, **where)
        fig.update_yaxes(title_text="agents" if where["col"] == 1 else None, range=[0, top],
                         dtick=1 if top <= 10 else None, **where)
        if not c.sum():
            fig.add_annotation(text=f"no valid {noun}", showarrow=False, xref="x domain", yref="y domain", x=0.5,
                               y=0.5, font={"color": "#888"}, **where)
    return _layout(fig, PANEL_HEIGHT * nrows + 60)


# --- numeric: mean per group -----------------------------------------------------------------
def group_mean_figure(groups: dict[str, list[dict]], points: dict[str, dict[str, list[float]]],
                      bounds: tuple[float, float] | None, equilibrium: float | None, noun: str,
                      round_label: str) -> go.Figure:
    """The mean per group with its 95% CI, one panel per attribute: the agents' values as points
    beside the mean when ``points`` has the attribute (small groups), else bars. CIs are cut to
    ``bounds`` (the measure's range) with a marker at each cut end."""
    k = max(len(groups), 1)
    ncols = min(2, k)
    nrows = math.ceil(k / ncols)
    fig = make_subplots(rows=nrows, cols=ncols, subplot_titles=[f"by {a}" for a in groups],
                        horizontal_spacing=0.1, vertical_spacing=0.35 / nrows if nrows > 1 else 0.1)
    shown: set[str] = set()

    def once(name: str) -> bool:
        first = name not in shown
        shown.add(name)
        return first

    for i, (attr, rows) in enumerate(groups.items()):
        where = {"row": i // ncols + 1, "col": i % ncols + 1}
        labels = [f"{r['group']} (n={r['n']:,})" for r in rows]
        means = [r["mean"] for r in rows]
        drawn = [clip_interval(r["ci_low"], r["ci_high"], bounds) for r in rows]
        hover = [_group_hover(attr, r, d, noun) for r, d in zip(rows, drawn, strict=True)]
        error = _error_bars(means, drawn)
        strip = points.get(attr)
        if strip:
            for j, r in enumerate(rows):
                values = strip.get(r["group"], [])
                fig.add_trace(go.Box(
                    x=[labels[j]] * len(values), y=values, boxpoints="all", jitter=0.5, pointpos=0,
                    fillcolor="rgba(0,0,0,0)", line={"color": "rgba(0,0,0,0)"}, hoveron="points",
                    marker={"color": BAR_COLOR, "size": 7, "opacity": 0.75, "line": {"color": BAR_EDGE, "width": 1}},
                    name="one agent", legendgroup="one agent", showlegend=once("one agent"),
                    hovertemplate=f"{r['group']}: {noun} %{{y:.4g}}<extra>one agent</extra>"), **where)
            fig.add_trace(go.Scatter(
                x=labels, y=_nan(means), mode="markers", error_y=error, hovertext=hover, hoverinfo="text",
                marker={"symbol": "diamond", "size": 12, "color": "#222222"}, name="mean ± 95% CI",
                legendgroup="mean", showlegend=once("mean")), **where)
        else:
            fig.add_trace(go.Bar(
                x=labels, y=_nan(means), error_y=error, hovertext=hover, hoverinfo="text",
                marker={"color": "#8fbf8f", "line": {"color": "#3d6b3d", "width": 1}}, name="mean ± 95% CI",
                legendgroup="mean", showlegend=once("mean")), **where)
        _clip_markers(fig, labels, drawn, hover, once, where)
        if equilibrium is not None:
            _line(fig, "y", equilibrium, f"equilibrium {equilibrium:g}", EQUILIBRIUM,
                  legend=once(f"equilibrium {equilibrium:g}"), **where)
        values = [v for d in drawn if d for v in (d.low, d.high)] + [m for m in means if m is not None]
        values += [v for vs in (strip or {}).values() for v in vs]
        fig.update_yaxes(range=padded_range([*values, equilibrium], bounds),
                         title_text=f"{noun} ({round_label})" if where["col"] == 1 else None, **where)
        fig.update_xaxes(title_text=attr, **where)
    return _layout(fig, (PANEL_HEIGHT + 60) * nrows + 60)


def _group_hover(attr: str, row: dict, drawn: DrawnInterval | None, noun: str) -> str:
    ci = drawn.hover() if drawn else "95% CI: undefined (fewer than 2 agents)"
    return (f"{attr}: {row['group']}<br>n = {row['n']:,}<br>mean {noun} {number(row['mean'])}"
            f"<br>{ci}")


def _error_bars(centres: Sequence[float | None], drawn: Sequence[DrawnInterval | None]) -> dict:
    """Plotly error bars from the drawn (cut) intervals around each centre."""
    up = [d.high - c if d and c is not None else math.nan for c, d in zip(centres, drawn, strict=True)]
    down = [c - d.low if d and c is not None else math.nan for c, d in zip(centres, drawn, strict=True)]
    return {"type": "data", "symmetric": False, "array": up, "arrayminus": down, "color": "#222222",
            "thickness": 1.5, "width": 6}


def _clip_markers(fig: go.Figure, x: Sequence[str], drawn: Sequence[DrawnInterval | None], hover: Sequence[str],
                  once, where: dict) -> None:
    """A red triangle at each cut end of a CI, pointing where the interval goes on; its hover
    gives the true interval."""
    xs, ys, symbols, texts = [], [], [], []
    for label, d, h in zip(x, drawn, hover, strict=True):
        if d is None:
            continue
        for cut, y, symbol in ((d.clipped_low, d.low, "triangle-down"), (d.clipped_high, d.high, "triangle-up")):
            if cut:
                xs.append(label)
                ys.append(y)
                symbols.append(symbol)
                texts.append(h)
    if xs:
        fig.add_trace(go.Scatter(
            x=xs, y=ys, mode="markers", marker={"symbol": symbols, "size": 12, "color": CLIPPED_COLOR},
            hovertext=texts, hoverinfo="text", name="CI clipped to the range (hover: true interval)",
            legendgroup="clipped", showlegend=once("clipped")), **where)


# --- numeric: over rounds ----------------------------------------------------------------------
def convergence_figure(rows: list[dict], trend: Sequence[tuple[str, str]] = (
        ("target", "target"), ("winner_value", "winning number")), noun: str = "guess",
        n_reference: int | None = None) -> go.Figure:
    """Mean, median and the trend columns (``(column, label)``; the first ``n_reference`` are
    reference columns, solid, the rest dotted) per round; the equilibrium dashed."""
    fig = go.Figure()
    x = [r["round"] for r in rows]
    fig.add_trace(go.Scatter(x=x, y=_nan([r.get("mean") for r in rows]), mode="lines+markers", name="mean",
                             line={"color": "#1f77b4", "width": 2.5}))
    fig.add_trace(go.Scatter(x=x, y=_nan([r.get("median") for r in rows]), mode="lines+markers", name="median",
                             line={"color": "#2ca02c"}, marker={"symbol": "square"}))
    n_ref = 1 if n_reference is None else n_reference
    for j, (c, label) in enumerate(trend):
        ref = j < n_ref
        color = REFERENCE_COLORS[j % 3] if ref else TREND_COLORS[(j - n_ref) % 3]
        fig.add_trace(go.Scatter(x=x, y=_nan([r.get(c) for r in rows]), mode="lines+markers", name=label,
                                 line={"color": color, "dash": "solid" if ref else "dot"},
                                 marker={"symbol": "triangle-up" if ref else "x"}))
    eq = rows[0].get("equilibrium") if rows else None
    if eq is not None:
        _line(fig, "y", eq, f"equilibrium {eq:g}", EQUILIBRIUM, legend=True)
    values = [r.get(k) for r in rows for k in ("mean", "median", *(c for c, _ in trend))]
    fig.update_yaxes(title_text=noun, range=padded_range([*values, eq]))
    _integer_rounds(fig, x)
    fig.update_layout(hovermode="x unified")
    return _layout(fig, 420)


# --- categorical -----------------------------------------------------------------------------
def shares_figure(rounds: list[dict], options: list[str], noun: str) -> go.Figure:
    """Each option's share of the valid answers per round, stacked (an area past
    MAX_STACKED_BARS rounds)."""
    fig = go.Figure()
    colors = option_colors(options)
    x = [r["round"] for r in rounds]
    bars = len(rounds) <= MAX_STACKED_BARS
    for o in options:
        share = [(r["shares"] or {}).get(o) or 0.0 for r in rounds]
        count = [(r.get("counts") or {}).get(o, 0) for r in rounds]
        hover = f"{o}: %{{y:.1%}} (%{{customdata:,}} answers)<extra>round %{{x}}</extra>"
        if bars:
            fig.add_trace(go.Bar(x=x, y=share, name=o, marker={"color": colors[o]}, customdata=count,
                                 hovertemplate=hover))
        else:
            fig.add_trace(go.Scatter(x=x, y=share, name=o, stackgroup="shares", line={"color": colors[o]},
                                     customdata=count, hovertemplate=hover))
    fig.update_layout(barmode="stack", legend_title_text=noun)
    fig.update_yaxes(title_text=f"share of valid {plural(noun)}", range=[0, 1], tickformat=".0%")
    _integer_rounds(fig, x)
    return _layout(fig, 420)


def share_group_figure(groups: dict[str, list[dict]], options: list[str], noun: str, round_label: str) -> go.Figure:
    """Each option's share per group (grouped bars) with its 95% Wilson CI, one panel per
    attribute."""
    k = max(len(groups), 1)
    fig = make_subplots(rows=k, cols=1, subplot_titles=[f"by {a}" for a in groups],
                        vertical_spacing=0.3 / k if k > 1 else 0.1)
    colors = option_colors(options)
    for i, (attr, rows) in enumerate(groups.items()):
        where = {"row": i + 1, "col": 1}
        labels = list(dict.fromkeys(r["group"] for r in rows))
        n_of = {r["group"]: r["n"] for r in rows}
        x = [f"{g} (n={n_of[g]:,})" for g in labels]
        for o in options:
            cell = {r["group"]: r for r in rows if r["option"] == o}
            share = [cell[g]["share"] if g in cell else None for g in labels]
            drawn = [clip_interval(cell[g]["ci_low"], cell[g]["ci_high"], (0.0, 1.0)) if g in cell else None
                     for g in labels]
            hover = [f"{attr}: {g}<br>{o}: {percent(s)} of {n_of[g]:,}<br>"
                     + (d.hover(percent) if d else "95% CI: undefined") for g, s, d in zip(labels, share, drawn,
                                                                                             strict=True)]
            fig.add_trace(go.Bar(x=x, y=_nan(share), error_y=_error_bars(share, drawn), name=o, legendgroup=o,
                                 showlegend=i == 0, marker={"color": colors[o]}, hovertext=hover,
                                 hoverinfo="text"), **where)
        fig.update_yaxes(range=[0, 1.02], tickformat=".0%", title_text=f"share ({round_label})", **where)
        fig.update_xaxes(title_text=attr, **where)
    fig.update_layout(barmode="group", legend_title_text=noun)
    return _layout(fig, (PANEL_HEIGHT + 60) * k + 60)


def share_convergence_figure(rounds: list[dict], options: list[str], noun: str,
                             bands: dict[str, list[tuple[float | None, float | None]]]) -> go.Figure:
    """Each option's share per round with its 95% Wilson band (``bands[option]``: per round)."""
    fig = go.Figure()
    colors = option_colors(options)
    x = [r["round"] for r in rounds]
    for o in options:
        low = [b[0] for b in bands[o]]
        high = [b[1] for b in bands[o]]
        fig.add_trace(go.Scatter(x=x, y=_nan(high), mode="lines", line={"width": 0}, legendgroup=o, showlegend=False,
                                 hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=x, y=_nan(low), mode="lines", line={"width": 0}, fill="tonexty",
                                 fillcolor=_transparent(colors[o]), legendgroup=o, showlegend=False,
                                 hoverinfo="skip"))
        text = [f"{o}: {percent((r['shares'] or {}).get(o))}, 95% CI [{percent(lo)}, {percent(hi)}]"
                for r, lo, hi in zip(rounds, low, high, strict=True)]
        fig.add_trace(go.Scatter(x=x, y=_nan([(r["shares"] or {}).get(o) for r in rounds]), mode="lines+markers",
                                 name=o, legendgroup=o, line={"color": colors[o]}, hovertext=text, hoverinfo="text"))
    fig.update_yaxes(title_text=f"share of valid {plural(noun)}", range=[0, 1.02], tickformat=".0%")
    _integer_rounds(fig, x)
    fig.update_layout(legend_title_text=noun)
    return _layout(fig, 420)


def _transparent(hex_color: str, alpha: float = 0.18) -> str:
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


# --- grouped simulations, forks, comparisons ----------------------------------------------------
def group_spread_figure(spread: dict, overall: list[tuple[int, float | None]], what: str,
                        equilibrium: float | None = None, percent_axis: bool = False) -> go.Figure:
    """The measure per round over all agents (thick), and per group: a line each when there are
    few groups, else the spread of the group values (10–90% and 25–75% quantile bands across
    groups, their median dashed)."""
    fig = go.Figure()
    fmt = ".1%" if percent_axis else ".4g"
    if spread["lines"] is not None:
        for i, (gid, pts) in enumerate(sorted(spread["lines"].items())):
            fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=_nan([p[1] for p in pts]), mode="lines",
                                     name=f"group {gid}", line={"color": PALETTE[i % len(PALETTE)], "width": 1.2},
                                     opacity=0.85,
                                     hovertemplate=f"group {gid}: %{{y:{fmt}}}<extra>round %{{x}}</extra>"))
    else:
        rows = spread["rounds"]
        x = [r["round"] for r in rows]
        for lo, hi, alpha, name in (("q10", "q90", 0.25, "groups: 10–90%"), ("q25", "q75", 0.5, "groups: 25–75%")):
            fig.add_trace(go.Scatter(x=x, y=_nan([r[hi] for r in rows]), mode="lines", line={"width": 0},
                                     legendgroup=name, showlegend=False, hoverinfo="skip"))
            fig.add_trace(go.Scatter(x=x, y=_nan([r[lo] for r in rows]), mode="lines", line={"width": 0},
                                     fill="tonexty", fillcolor=f"rgba(122,166,214,{alpha})", name=name,
                                     legendgroup=name, hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=x, y=_nan([r["median"] for r in rows]), mode="lines", name="groups: median",
                                 line={"color": BAR_EDGE, "dash": "dash"},
                                 hovertemplate=f"median of the groups: %{{y:{fmt}}}<extra>round %{{x}}</extra>"))
    fig.add_trace(go.Scatter(x=[p[0] for p in overall], y=_nan([p[1] for p in overall]), mode="lines+markers",
                             name="all agents", line={"color": "#111111", "width": 3},
                             hovertemplate=f"all agents: %{{y:{fmt}}}<extra>round %{{x}}</extra>"))
    if equilibrium is not None:
        _line(fig, "y", equilibrium, f"equilibrium {equilibrium:g}", EQUILIBRIUM, legend=True)
    if percent_axis:
        fig.update_yaxes(range=[0, 1.02], tickformat=".0%")
    else:
        values = [p[1] for p in overall] + [r[k] for r in spread["rounds"] for k in ("min", "max")]
        fig.update_yaxes(range=padded_range([*values, equilibrium]))
    fig.update_yaxes(title_text=what)
    _integer_rounds(fig, [p[0] for p in overall])
    return _layout(fig, 440)


def fork_figure(fork: dict, noun: str, reference: Sequence[tuple[str, str]] = ()) -> go.Figure:
    """A fork beside its parent over rounds (parent solid, fork dashed): the mean and the first
    reference column (numeric), or each option's share (categorical, one colour per option);
    a dotted line where the fork branches off."""
    fig = go.Figure()
    rows = fork["rounds"]
    x = [r["round"] for r in rows]
    k = fork["after_round"]
    # the fork's line branches off the parent's at round k, the state it starts from
    mine = [r if r["round"] >= k else {**r, "fork": None} for r in rows]

    def series(who: str, value) -> list[float]:
        return _nan([value(r[who]) if r[who] else None for r in mine])

    if fork["measure_kind"] == "numeric":
        for who, dash, color in (("parent", "solid", "#1f77b4"), ("fork", "dash", "#d62728")):
            fig.add_trace(go.Scatter(x=x, y=series(who, lambda st: st.get("mean")), mode="lines+markers",
                                     name=f"mean, {who}", line={"color": color, "dash": dash}))
        for c, label in reference[:1]:  # the simulation's first reference line (the ratio game's target)
            for who, dash in (("parent", "solid"), ("fork", "dash")):
                fig.add_trace(go.Scatter(x=x, y=series(who, lambda st, c=c: (st.get("summary") or {}).get(c)),
                                         mode="lines", name=f"{label}, {who}",
                                         line={"color": "#ff7f0e", "dash": dash, "width": 1.2}))
        fig.update_yaxes(title_text=noun)
    else:
        options = list(dict.fromkeys(o for r in rows for who in ("parent", "fork")
                                     for o in ((r[who] or {}).get("shares") or {})))
        colors = option_colors(options)
        for o in options:
            for who, dash in (("parent", "solid"), ("fork", "dash")):
                fig.add_trace(go.Scatter(x=x, y=series(who, lambda st, o=o: (st.get("shares") or {}).get(o)),
                                         mode="lines+markers", name=f"{o} ({who})",
                                         line={"color": colors[o], "dash": dash}))
        fig.update_yaxes(range=[0, 1.02], tickformat=".0%", title_text=f"share of valid {plural(noun)}")
    _line(fig, "x", k + 0.5, f"fork after round {k}", {"color": "#444444", "dash": "dot", "width": 1.5}, legend=True)
    _integer_rounds(fig, x)
    fig.update_layout(hovermode="x unified")
    return _layout(fig, 420)


def comparison_figure(series: dict[str, list[tuple[int, float | None]]], panels: Sequence[str],
                      percent_axis: bool = False, equilibrium: dict[str, float | None] | None = None) -> go.Figure:
    """Several runs overlaid over rounds, one colour per run and one panel per statistic:
    ``series[f"{run}\\t{panel}"]`` holds (round, value) points. ``equilibrium``: per run, drawn
    once per distinct value."""
    n = max(len(panels), 1)
    fig = make_subplots(rows=n, cols=1, subplot_titles=list(panels), vertical_spacing=0.25 / n if n > 1 else 0.1,
                        shared_xaxes=True)
    runs = list(dict.fromkeys(key.split("\t")[0] for key in series))
    fmt = ".1%" if percent_axis else ".4g"
    for i, panel in enumerate(panels):
        where = {"row": i + 1, "col": 1}
        values: list[float | None] = []
        for j, run in enumerate(runs):
            pts = series.get(f"{run}\t{panel}", [])
            values += [p[1] for p in pts]
            fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=_nan([p[1] for p in pts]), mode="lines+markers",
                                     name=run, legendgroup=run, showlegend=i == 0,
                                     line={"color": PALETTE[j % len(PALETTE)]},
                                     hovertemplate=f"{run}: %{{y:{fmt}}}<extra>{panel}, round %{{x}}</extra>"), **where)
        eqs = sorted({v for v in (equilibrium or {}).values() if v is not None})
        for eq in eqs:
            _line(fig, "y", eq, f"equilibrium {eq:g}", EQUILIBRIUM, legend=i == 0, **where)
        if percent_axis:
            fig.update_yaxes(range=[0, 1.02], tickformat=".0%", **where)
        else:
            fig.update_yaxes(range=padded_range([*values, *eqs]), **where)
    rounds = sorted({p[0] for pts in series.values() for p in pts})
    fig.update_xaxes(tickformat="d", dtick=1 if len(rounds) <= 20 else None)
    fig.update_xaxes(title_text="round", row=n, col=1)
    return _layout(fig, PANEL_HEIGHT * n + 60)
