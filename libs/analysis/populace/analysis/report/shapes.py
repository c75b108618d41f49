"""The report's sections for the shapes a run has, found from what it declared and recorded (never
from the simulation's name):

- **activity**: a run whose simulation selects who acts, changes a graph or declares a grid — who
  acted per round, and every numeric summary column the other figures do not draw (a feed's
  posts, likes, follows …, a grid's moves), one small panel each;
- **distribution per group**: a numeric measure on a scale of few whole values (a stance from -3
  to 3), where a group's mean hides a split — each value's share per persona group in the first
  and the last round;
- **graph**: a run that recorded edge edits — the graph after each round rebuilt from them (its
  in- and out-degree distributions, edits and edges per round);
- **grid**: a simulation that declares a grid (``Simulation.grid``, ``grid_columns``) — where each
  agent was, a picture per round, and the like-neighbour share of the picture per round."""

from __future__ import annotations

import math
from collections.abc import Sequence

import duckdb
import numpy as np
import plotly.graph_objects as go
from plotly.colors import sample_colorscale
from plotly.subplots import make_subplots

from populace.analysis.queries import tables_of
from populace.analysis.report.blocks import Note, Plot, Section, Table
from populace.analysis.report.figures import BAR_COLOR, BAR_EDGE, PALETTE, _integer_rounds, _layout, _nan
from populace.analysis.report.text import number, percent, shown_rounds
from populace.analysis.shapes import (
    MAX_VALUES,
    GridFrame,
    degree_table,
    grid_frames,
    measure_distribution,
    starting_graph,
)
from populace.analysis.tables import RunTables

STATS = ("mean", "median", "std", "min", "max")
MAX_SIDE = 150  # a grid picture shows at most this many cells a side (the top-left corner of a larger grid)
EMPTY_COLOR = "#ffffff"


def _shown(rounds: Sequence[int]) -> list[int]:
    return list(shown_rounds(list(rounds)))


# --- activity -------------------------------------------------------------------------------------
def undrawn_columns(info: dict, types: dict[str, str]) -> list[tuple[str, str]]:
    """(column, title) of the numeric summary columns no other figure draws: not the measure's
    statistics, not its trend lines (drawn over rounds beside a numeric measure), not ids."""
    drawn = set(info.get("trend_columns") or ()) | set(info.get("reference_columns") or ())
    if info.get("measure_kind") == "numeric":
        drawn |= set(STATS)
    return [(c, t) for c, t in info["labels"].items()
            if types.get(c) in ("DOUBLE", "BIGINT") and c not in drawn and not c.endswith("_id")]


def activity_figure(rounds: list[dict], agents: int | None, columns: Sequence[tuple[str, str]]) -> go.Figure:
    """Who acted per round (bars: acted, valid; the population as a line), then one small panel
    per summary column."""
    panels = 1 + len(columns)
    ncols = 1 if panels == 1 else min(3, panels - 1)
    nrows = 1 + math.ceil(len(columns) / ncols)
    titles = ["agents who acted"] + [""] * (ncols - 1) + [t for _, t in columns]
    specs = [[{"colspan": ncols}] + [None] * (ncols - 1)] + [[{}] * ncols for _ in range(nrows - 1)]
    fig = make_subplots(rows=nrows, cols=ncols, specs=specs, subplot_titles=[t for t in titles if t],
                        vertical_spacing=0.35 / nrows, horizontal_spacing=0.08)
    x = [r["round"] for r in rounds]
    fig.add_trace(go.Bar(x=x, y=[r["n"] for r in rounds], name="acted", marker={"color": BAR_COLOR},
                         hovertemplate="%{y:,} acted<extra>round %{x}</extra>"), row=1, col=1)
    fig.add_trace(go.Bar(x=x, y=[r["n_valid"] for r in rounds], name="valid answers",
                         marker={"color": BAR_EDGE}, hovertemplate="%{y:,} valid<extra>round %{x}</extra>"),
                  row=1, col=1)
    if agents:
        fig.add_trace(go.Scatter(x=x, y=[agents] * len(x), mode="lines", name=f"agents ({agents:,})",
                                 line={"color": "#333333", "dash": "dot"},
                                 hovertemplate=f"{agents:,} agents<extra></extra>"), row=1, col=1)
    fig.update_yaxes(title_text="agents", rangemode="tozero", row=1, col=1)
    _integer_rounds(fig, x, row=1, col=1)
    for i, (c, title) in enumerate(columns):
        where = {"row": 2 + i // ncols, "col": 1 + i % ncols}
        y = _nan([(r.get("summary") or {}).get(c) for r in rounds])
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=title, showlegend=False,
                                 line={"color": PALETTE[i % len(PALETTE)]},
                                 hovertemplate=f"{title}: %{{y:.4g}}<extra>round %{{x}}</extra>"), **where)
        fig.update_xaxes(tickformat="d", dtick=1 if len(x) <= 20 else None, **where)
    fig.update_layout(barmode="group")
    return _layout(fig, 300 + 220 * (nrows - 1))


def activity_section(info: dict, rounds: list[dict], types: dict[str, str]) -> Section:
    agents = info.get("agents")
    columns = undrawn_columns(info, types)
    section = Section("Activity per round", anchor="activity")
    section.blocks.append(Plot(activity_figure(rounds, agents, columns),
                               "Agents who acted per round, and the summary columns per round"))
    acted = [r["n"] for r in rounds]
    if agents and acted:
        who = ("Every agent acted in every round." if min(acted) == max(acted) == agents else
               f"Acting agents per round: {min(acted):,} to {max(acted):,} of {agents:,} "
               f"(mean {number(sum(acted) / len(acted))}).")
        section.blocks.append(Note(who + " Panels: the simulation's summary columns that no other figure draws."))
    return section


# --- the measure's distribution per persona group --------------------------------------------------
def ordinal(info: dict) -> bool:
    """A numeric measure on a declared scale of at most MAX_VALUES whole values."""
    rng = info.get("measure_range")
    return (info.get("measure_kind") == "numeric" and rng is not None and float(rng[0]).is_integer()
            and float(rng[1]).is_integer() and rng[1] - rng[0] + 1 <= MAX_VALUES)


def distribution_figure(dists: dict[str, dict], rounds: Sequence[int], noun: str) -> go.Figure:
    """Each value's share per group, stacked, one row per attribute and one column per round."""
    attrs = list(dists)
    cats = next((d["categories"] for d in dists.values() if d["categories"]), [])
    colors = sample_colorscale("RdBu", [i / max(len(cats) - 1, 1) for i in range(len(cats))]) if cats else []
    fig = make_subplots(rows=len(attrs), cols=len(rounds), subplot_titles=[f"by {a}, round {r}" for a in attrs
                                                                            for r in rounds],
                        vertical_spacing=0.3 / len(attrs) if len(attrs) > 1 else 0.1, horizontal_spacing=0.06)
    for i, a in enumerate(attrs):
        d = dists[a]
        for j, r in enumerate(rounds):
            where = {"row": i + 1, "col": j + 1}
            rows = {row["group"]: row for row in d["rows"] if row["round"] == r}
            groups = [g for g in d["groups"] if g in rows]
            labels = [f"{g} (n={rows[g]['n']:,})" for g in groups]
            for k, c in enumerate(cats):
                share = [rows[g]["counts"].get(c, 0) / rows[g]["n"] for g in groups]
                count = [rows[g]["counts"].get(c, 0) for g in groups]
                fig.add_trace(go.Bar(x=labels, y=share, name=f"{noun} {c}", legendgroup=c,
                                     showlegend=i == 0 and j == 0, marker={"color": colors[k]}, customdata=count,
                                     hovertemplate=f"{noun} {c}: %{{y:.1%}} (%{{customdata:,}})<extra>%{{x}}</extra>"),
                              **where)
            fig.update_yaxes(range=[0, 1], tickformat=".0%", **where)
            if not groups:
                fig.add_annotation(text=f"no valid {noun}", showarrow=False, xref="x domain", yref="y domain",
                                   x=0.5, y=0.5, font={"color": "#888"}, **where)
    fig.update_layout(barmode="stack", legend_title_text=noun)
    return _layout(fig, 360 * len(attrs) + 60)


def distribution_section(con: duckdb.DuckDBPyConnection, run_id: str, info: dict, rounds: list[dict],
                         attrs: list[str]) -> Section | None:
    if not (attrs and rounds and ordinal(info)):
        return None
    numbers = [r["round"] for r in rounds]
    picked = list(dict.fromkeys([numbers[0], numbers[-1]]))
    dists = {a: measure_distribution(con, run_id, a, picked) for a in attrs}
    noun = info.get("noun") or "answer"
    section = Section(f"Distribution of {noun} per group", anchor="distribution")
    if not any(d["rows"] for d in dists.values()):
        section.blocks.append(Note(f"No valid {noun} with a persona attribute to group by."))
        return section
    section.blocks.append(Plot(distribution_figure(dists, picked, noun),
                               f"Share of each {noun} per persona group in rounds {', '.join(map(str, picked))}"))
    section.blocks.append(Note(f"Each bar: one group's valid answers in the round, split by {noun} (on its scale "
                               "of few whole values a mean hides a split, so every value is shown)."))
    return section


# --- graphs that change ---------------------------------------------------------------------------
def degree_figure(table: list[dict], shown: Sequence[int]) -> go.Figure:
    """In- and out-degree distributions after each shown round (agents per degree, log scale)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=["in-degree (followers)", "out-degree (following)"],
                        horizontal_spacing=0.1)
    by_round = {t["round"]: t for t in table}
    for j, r in enumerate(shown):
        t = by_round[r]
        for col, key in ((1, "in_degree"), (2, "out_degree")):
            hist = t[key]
            degrees = sorted(hist)
            fig.add_trace(go.Scatter(x=degrees, y=[hist[d] for d in degrees], mode="lines+markers",
                                     name=f"after round {r}", legendgroup=str(r), showlegend=col == 1,
                                     line={"color": PALETTE[j % len(PALETTE)]},
                                     hovertemplate="degree %{x}: %{y:,} agents" f"<extra>after round {r}</extra>"),
                          row=1, col=col)
    fig.update_yaxes(type="log", dtick=1, title_text="agents")  # 1, 10, 100 …
    fig.update_xaxes(title_text="degree", tickformat="d")
    return _layout(fig, 420)


def graph_section(con: duckdb.DuckDBPyConnection, run_id: str, info: dict, rt: RunTables) -> Section | None:
    spec = rt.spec
    if not spec.edge_kinds:
        return None
    base, why_not = starting_graph(con, run_id)
    table = degree_table(con, run_id, base)
    kind = spec.edge_kinds[0]
    section = Section(f"The {kind} graph over rounds", anchor="graph")
    if not table:
        section.blocks.append(Note("No round recorded."))
        return section
    shown = _shown([t["round"] for t in table])
    section.blocks.append(Plot(degree_figure(table, shown), f"Degree distribution of the {kind} graph per round"))
    section.blocks.append(Table(
        ["round", "edits: add", "edits: remove", "edges", "mean degree", "max in-degree", "max out-degree"],
        [[number(t["round"]), number(t["adds"]), number(t["removes"]), number(t["edges"]), number(t["mean_degree"]),
          number(t["max_in"]), number(t["max_out"])] for t in table], left=()))
    if base is not None:
        start = (f"The run's starting graph (its `graph:`, {base.edges:,} edges, rebuilt from its config and checked "
                 "against its recorded digest), then ")
    elif why_not:
        start = (f"The run's starting graph (its `graph:`) is left out: {why_not}. So these are the edges its edits "
                 "made that still stand (an edit removing a starting edge counts as an edit only); ")
    else:
        start = ""
    section.blocks.append(Note(f"{start}the graph after each round, rebuilt from the recorded edits (table edges, "
                               f"kind {kind}) in the order they applied. An edge author → follower is the follower's "
                               "out-edge (whom it follows) and the author's in-edge (a follower). Degree 0 counts "
                               "every agent without one."))
    return section


# --- spaces ---------------------------------------------------------------------------------------
def grid_figure(frames: Sequence[GridFrame], colour_column: str) -> go.Figure:
    """A picture per round: each cell coloured by its agent's colour value, empty cells white."""
    k = len(frames)
    ncols = min(3, k)
    nrows = math.ceil(k / ncols)
    fig = make_subplots(rows=nrows, cols=ncols, horizontal_spacing=0.04, vertical_spacing=0.12 / nrows,
                        subplot_titles=[f"Round {f.round} ({f.agents:,} agents)" for f in frames])
    colours = frames[0].colours if frames else []
    n = len(colours)
    palette = [PALETTE[i % len(PALETTE)] for i in range(n)]
    # codes -1 (empty) .. n-1 as steps of one colour scale
    steps = [EMPTY_COLOR, *palette]
    scale = []
    for i, c in enumerate(steps):
        scale += [[i / len(steps), c], [(i + 1) / len(steps), c]]
    names = np.array(["empty", *(f"{colour_column} {c}" for c in colours)], dtype=object)
    for i, f in enumerate(frames):
        where = {"row": i // ncols + 1, "col": i % ncols + 1}
        z = f.occupant_colour[:MAX_SIDE, :MAX_SIDE]
        fig.add_trace(go.Heatmap(z=z, zmin=-1.5, zmax=n - 0.5, colorscale=scale, showscale=False,
                                 text=names[z + 1], hovertemplate="x %{x}, y %{y}: %{text}<extra></extra>",
                                 xgap=0, ygap=0), **where)
        fig.update_xaxes(showticklabels=False, showgrid=False, zeroline=False, constrain="domain", **where)
        fig.update_yaxes(showticklabels=False, showgrid=False, zeroline=False, autorange="reversed",
                         scaleanchor=f"x{i + 1 if i else ''}", constrain="domain", **where)
    for c, colour in zip(colours, palette, strict=True):  # a legend entry per colour value
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=f"{colour_column} {c}",
                                 marker={"color": colour, "symbol": "square", "size": 12}), row=1, col=1)
    return _layout(fig, 320 * nrows + 80)


def like_figure(frames: Sequence[GridFrame], colour_column: str) -> go.Figure:
    fig = go.Figure(go.Scatter(x=[f.round for f in frames], y=_nan([f.like_share for f in frames]),
                               mode="lines+markers", name="like-neighbour share",
                               line={"color": BAR_EDGE, "width": 2.5},
                               hovertemplate="%{y:.1%}<extra>round %{x}</extra>"))
    fig.update_yaxes(range=[0, 1.02], tickformat=".0%", title_text=f"neighbours of the same {colour_column}")
    _integer_rounds(fig, [f.round for f in frames])
    return _layout(fig, 360, legend=False)


def grid_section(con: duckdb.DuckDBPyConnection, run_id: str, rounds: list[dict], rt: RunTables) -> Section | None:
    if rt.grid is None or rt.grid_columns is None or not rounds:
        return None
    grid = rt.grid
    colour = rt.grid_columns[1]
    numbers = [r["round"] for r in rounds]
    frames = grid_frames(con, run_id, numbers)
    section = Section(f"The grid ({grid.width}×{grid.height}{', torus' if grid.torus else ''})", anchor="grid")
    shown = set(_shown(numbers))
    section.blocks.append(Plot(grid_figure([f for f in frames if f.round in shown], colour),
                               f"The grid per round, each agent's cell coloured by its {colour}"))
    section.blocks.append(Plot(like_figure(frames, colour), "Like-neighbour share per round"))
    section.blocks.append(Table(["round", "agents placed", "like-neighbour share"],
                                [[number(f.round), number(f.agents), percent(f.like_share)] for f in frames], left=()))
    clipped = (f" Showing the top-left {MAX_SIDE}×{MAX_SIDE} cells of the picture."
               if grid.width > MAX_SIDE or grid.height > MAX_SIDE else "")
    clashes = sum(f.clashes for f in frames)
    section.blocks.append(Note(
        f"Each round: where the agents with an outcome that round stood (column {rt.grid_columns[0]}), coloured by "
        f"{colour}; white cells are empty. Like-neighbour share: over the agents with an occupied Moore neighbour, "
        f"the mean share of those neighbours with the same {colour}." + clipped
        + (f" {clashes:,} outcome(s) named a cell another agent of the round also named." if clashes else "")))
    return section


def shape_sections(con: duckdb.DuckDBPyConnection, run_id: str, info: dict, rounds: list[dict],
                   types: dict[str, str], attrs: list[str]) -> list[Section]:
    """The sections of the shapes this run has, in order (none for a run of everyone acting every
    round, on no grid and no changing graph: its report stays as it was)."""
    rt = tables_of(con, run_id)
    spec = rt.spec
    agents = info.get("agents")
    activation = bool(agents) and any(r["n"] != agents for r in rounds)
    out: list[Section | None] = []
    if rounds and (activation or spec.edge_kinds or rt.grid is not None):
        out.append(activity_section(info, rounds, types))
    out.append(distribution_section(con, run_id, info, rounds, attrs))
    out.append(graph_section(con, run_id, info, rt))
    out.append(grid_section(con, run_id, rounds, rt))
    return [s for s in out if s is not None]


__all__ = ["shape_sections"]
