"""The report's comparison with published summaries (a file of n, mean, median, e.g. the ratio
game's Nagel 1995 first period): per reference row, the run's mean and median with their 95%
intervals beside the people's figures, in a figure (points with whiskers) and a table that says
how far apart they are and whether the people's figure lies inside the run's interval."""

from __future__ import annotations

import math

import plotly.graph_objects as go

from populace.analysis.report.blocks import Heading, Note, Plot, Table
from populace.analysis.report.figures import _layout
from populace.analysis.report.text import number

RUN, PEOPLE = "#1f77b4", "#d62728"


def title(row: dict) -> str:
    """What a summary row is about: the measure (or question), its round and the parameters."""
    what = f"{row['survey'] + '/' if row['survey'] else ''}{row['question']}" if row["target"] == "question" \
        else f"measure {row['question']}"
    params = ", ".join(f"{k} = {v}" for k, v in row["params"].items())
    group = f", group {row['group']}" if row["group"] != "all" else ""
    return f"{what}, round {row['round']}{group}" + (f" ({params})" if params else "")


def figure(row: dict) -> go.Figure:
    """The run's mean and median (points, 95% whiskers) and the people's (diamonds; whiskers when
    the file gives an sd)."""
    fig = go.Figure()
    stats = [s for s in ("mean", "median") if row.get(f"{s}_ref") is not None or row.get(f"{s}_sim") is not None]
    for who, colour, symbol in (("sim", RUN, "circle"), ("ref", PEOPLE, "diamond")):
        ys = [row.get(f"{s}_{who}") for s in stats]
        lows = [row.get(f"{s}_{who}_low") for s in stats]
        highs = [row.get(f"{s}_{who}_high") for s in stats]
        up = [h - y if None not in (h, y) else math.nan for y, h in zip(ys, highs, strict=True)]
        down = [y - lo if None not in (lo, y) else math.nan for y, lo in zip(ys, lows, strict=True)]
        n = row["n_sim"] if who == "sim" else row["n_ref"]
        name = f"this run (n={n:,})" if who == "sim" else f"people (n={n:,})"
        fig.add_trace(go.Scatter(
            x=stats, y=[math.nan if y is None else y for y in ys], mode="markers", name=name,
            marker={"color": colour, "size": 11, "symbol": symbol},
            error_y={"type": "data", "symmetric": False, "array": up, "arrayminus": down, "color": colour,
                     "thickness": 1.5, "width": 8},
            hovertemplate="%{x}: %{y:.2f}<extra>" + name + "</extra>"))
    fig.update_yaxes(title_text=row["question"])
    return _layout(fig, 320)


def blocks(rows: list[dict]) -> list:
    """A heading, a figure and a table per reference row."""
    out: list = [Note("Each figure of the people's beside this run's, with the run's 95% intervals: the mean's "
                      "Student-t interval, the median's distribution-free one (order statistics). "
                      "'inside' says whether the people's figure lies in the run's interval.", "text")]
    for r in rows:
        out.append(Heading(title(r)))
        out.append(Plot(figure(r), f"{title(r)}: this run's mean and median beside the people's"))
        table = []
        for stat in ("mean", "median"):
            ref, sim = r.get(f"{stat}_ref"), r.get(f"{stat}_sim")
            if ref is None and sim is None:
                continue
            low, high = r.get(f"{stat}_sim_low"), r.get(f"{stat}_sim_high")
            ci = f"[{number(low)}, {number(high)}]" if None not in (low, high) else "—"
            people = number(ref) if ref is not None else "—"
            if stat == "mean" and r.get("mean_ref_low") is not None:
                people += f" [{number(r['mean_ref_low'])}, {number(r['mean_ref_high'])}]"
            inside = {True: "inside", False: "outside", None: "—"}[r.get(f"{stat}_inside")]
            table.append([stat, number(sim), ci, people, f"{r['n_sim']:,}", f"{r['n_ref']:,}",
                          number(r.get(f"{stat}_diff")), inside])
        out.append(Table(["figure", "this run", "run's 95% CI", "people", "run n", "people n", "people − run",
                          "people's figure"], table, left=(0, 7)))
    return out
