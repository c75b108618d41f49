"""The report's interviews: per question the answer distribution overall and per persona group
(each option's share with its 95% Wilson interval; a Likert's or a number's mean with its 95%
Student-t interval), panels as lines per group over rounds, and the free-text answers, paged
and searchable like the reasoning. Several runs (replicates): the same, across runs.

Figures come from `populace.analysis.interviews`' rows (aggregated in DuckDB), never from all
answers; the free-text answers shown are capped like the reasoning."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import duckdb
import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from populace.analysis.interviews import interview_questions, interview_table, interview_usage, panel_table
from populace.analysis.report.answer_rows import MAX_ANSWER_ROWS, PAGE_SIZE, AnswerRows, profile_text, shown_note
from populace.analysis.report.blocks import Heading, Note, Plot, Section, Table
from populace.analysis.report.figures import (
    PANEL_HEIGHT,
    _error_bars,
    _integer_rounds,
    _layout,
    _nan,
    option_colors,
)
from populace.analysis.report.intervals import clip_interval, padded_range
from populace.analysis.report.reference_summaries import blocks as summary_blocks
from populace.analysis.report.text import number, percent, shortened

MAX_LINE_GROUPS = 8  # a panel's lines: the groups, up to this many


@dataclass
class TextAnswers:
    """Free-text answers to interviews, paged and searchable (agent id or words) in the browser."""

    answers: AnswerRows
    page_size: int = PAGE_SIZE
    kind: str = "interview_answers"


def _bounds(q: dict) -> tuple[float, float] | None:
    spec = q["spec"]
    if q["kind"] == "likert":
        return 1.0, float(spec.get("points") or 1)
    if q["kind"] == "number":
        return float(spec["min"]), float(spec["max"])
    return None


def share_figure(panels: dict[str, list[dict]], options: list[str], labels: dict[str, str] | None = None) -> go.Figure:
    """Each option's share (bars, 95% Wilson CI), one panel per grouping ("all", then by attribute)."""
    k = max(len(panels), 1)
    fig = make_subplots(rows=k, cols=1, subplot_titles=list(panels), vertical_spacing=0.3 / k if k > 1 else 0.1)
    colors = option_colors(options)
    for i, rows in enumerate(panels.values()):
        where = {"row": i + 1, "col": 1}
        groups = list(dict.fromkeys(r["group"] for r in rows))
        n_of = {r["group"]: r["n"] for r in rows}
        x = [f"{g} (n={n_of[g]:,})" for g in groups]
        for o in options:
            cell = {r["group"]: r for r in rows if r["option"] == o}
            share = [cell[g]["share"] if g in cell else None for g in groups]
            drawn = [clip_interval(cell[g]["ci_low"], cell[g]["ci_high"], (0.0, 1.0)) if g in cell else None
                     for g in groups]
            name = (labels or {}).get(o, o)
            hover = [f"{g}: {name} {percent(s)} of {n_of[g]:,}<br>" + (d.hover(percent) if d else "95% CI: undefined")
                     for g, s, d in zip(groups, share, drawn, strict=True)]
            fig.add_trace(go.Bar(x=x, y=_nan(share), error_y=_error_bars(share, drawn), name=name, legendgroup=o,
                                 showlegend=i == 0, marker={"color": colors[o]}, hovertext=hover, hoverinfo="text"),
                          **where)
        fig.update_yaxes(range=[0, 1.02], tickformat=".0%", title_text="share of valid answers", **where)
    fig.update_layout(barmode="group")
    return _layout(fig, (PANEL_HEIGHT + 40) * k + 60)


def mean_figure(panels: dict[str, list[dict]], bounds: tuple[float, float] | None) -> go.Figure:
    """The mean answer per group (bars, 95% Student-t CI cut to the question's range)."""
    k = max(len(panels), 1)
    fig = make_subplots(rows=k, cols=1, subplot_titles=list(panels), vertical_spacing=0.3 / k if k > 1 else 0.1)
    for i, rows in enumerate(panels.values()):
        where = {"row": i + 1, "col": 1}
        x = [f"{r['group']} (n={r['n']:,})" for r in rows]
        means = [r["mean"] for r in rows]
        drawn = [clip_interval(r["ci_low"], r["ci_high"], bounds) for r in rows]
        hover = [f"{r['group']}: mean {number(r['mean'])} of {r['n']:,}<br>"
                 + (d.hover() if d else "95% CI: undefined (fewer than 2 answers)") for r, d in zip(rows, drawn,
                                                                                                   strict=True)]
        fig.add_trace(go.Bar(x=x, y=_nan(means), error_y=_error_bars(means, drawn), hovertext=hover, hoverinfo="text",
                             marker={"color": "#8fbf8f", "line": {"color": "#3d6b3d", "width": 1}},
                             name="mean ± 95% CI", showlegend=i == 0), **where)
        values = [v for d in drawn if d for v in (d.low, d.high)] + [m for m in means if m is not None]
        fig.update_yaxes(range=padded_range(values, bounds), title_text="mean answer", **where)
    return _layout(fig, (PANEL_HEIGHT + 40) * k + 60)


def panel_figure(rows: list[dict], kind: str, bounds: tuple[float, float] | None,
                 labels: dict[str, str] | None = None) -> go.Figure:
    """A panel question over rounds: the mean per group (Likert, number), or each option's
    share (options; per group with one line style per group), each with its 95% band."""
    fig = go.Figure()
    groups = list(dict.fromkeys(r["group"] for r in rows))[:MAX_LINE_GROUPS]
    if kind == "options":
        options = list(dict.fromkeys(r["option"] for r in rows))
        colors = option_colors(options)
        dashes = ("solid", "dot", "dash", "longdash", "dashdot", "longdashdot")
        for gi, g in enumerate(groups):
            for o in options:
                pts = [r for r in rows if r["group"] == g and r["option"] == o]
                name = (labels or {}).get(o, o) + ("" if g == "all" else f" — {g}")
                fig.add_trace(go.Scatter(
                    x=[r["after_round"] for r in pts], y=_nan([r["share"] for r in pts]), mode="lines+markers",
                    name=name, line={"color": colors[o], "dash": dashes[gi % len(dashes)]},
                    error_y=_error_bars([r["share"] for r in pts],
                                        [clip_interval(r["ci_low"], r["ci_high"], (0.0, 1.0)) for r in pts]),
                    hovertext=[f"{name}, after round {r['after_round']}: {percent(r['share'])} of {r['n']:,}"
                               for r in pts], hoverinfo="text"))
        fig.update_yaxes(range=[0, 1.02], tickformat=".0%", title_text="share of valid answers")
    else:
        palette = option_colors(groups)
        for g in groups:
            pts = [r for r in rows if r["group"] == g]
            fig.add_trace(go.Scatter(
                x=[r["after_round"] for r in pts], y=_nan([r["mean"] for r in pts]), mode="lines+markers", name=g,
                line={"color": palette[g]},
                error_y=_error_bars([r["mean"] for r in pts],
                                    [clip_interval(r["ci_low"], r["ci_high"], bounds) for r in pts]),
                hovertext=[f"{g}, after round {r['after_round']}: mean {number(r['mean'])} of {r['n']:,}" for r in pts],
                hoverinfo="text"))
        values = [v for r in rows for v in (r["ci_low"], r["ci_high"], r["mean"]) if v is not None]
        fig.update_yaxes(range=padded_range(values, bounds), title_text="mean answer")
    _integer_rounds(fig, sorted({r["after_round"] for r in rows}))
    fig.update_xaxes(title_text="after round")
    return _layout(fig, 420)


def _question_rows(rows: list[dict], q: dict) -> list[dict]:
    return [r for r in rows if (r["survey"], r["question"]) == (q["survey"], q["question"])]


def _table(rows: list[dict], labels: dict[str, str]) -> Table:
    out = []
    for r in rows:
        if r.get("option") is not None:
            out.append([r["group"], labels.get(r["option"], r["option"]), f"{r['count']:,}/{r['n']:,}",
                        percent(r["share"]), f"[{percent(r['ci_low'])}, {percent(r['ci_high'])}]"])
        elif "mean" in r:
            out.append([r["group"], "mean", f"{r['n_valid']:,}/{r['n_asked']:,}", number(r["mean"]),
                        f"[{number(r['ci_low'])}, {number(r['ci_high'])}]"])
    return Table(["group", "answer", "answers", "share / mean", "95% CI"], out, left=(0, 1))


def _labels_of(q: dict) -> dict[str, str]:
    spec = q["spec"]
    if q["kind"] == "likert" and spec.get("labels"):
        return {str(i): f"{i} {label}" for i, label in enumerate(spec["labels"], 1)}
    return {}


def text_answers(con: duckdb.DuckDBPyConnection, run_id: str, limit: int = MAX_ANSWER_ROWS) -> AnswerRows:
    """The free-text answers (text questions, and any invalid answer's raw text) of the first
    agents, with their profile."""
    total = con.execute("SELECT count(*) FROM interviews i JOIN interview_questions q ON q.run_id = i.run_id AND "
                        "q.after_round = i.after_round AND q.survey = i.survey AND q.question = i.question AND "
                        "q.request IS NOT DISTINCT FROM i.request WHERE i.run_id = ? AND q.kind = 'text'",
                        [run_id]).fetchone()[0]
    profiles = "LEFT JOIN agent_profiles p ON p.run_id = i.run_id AND p.agent_id = i.agent_id" if con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'agent_profiles'").fetchone()[0] else ""
    rows = con.execute(
        f"SELECT i.after_round, i.survey, i.question, i.agent_id, coalesce(i.answer, i.raw), "
        f"{'p.profile' if profiles else 'NULL'} FROM interviews i JOIN interview_questions q "
        "ON q.run_id = i.run_id AND q.after_round = i.after_round AND q.survey = i.survey AND q.question = i.question "
        f"AND q.request IS NOT DISTINCT FROM i.request {profiles} WHERE i.run_id = ? AND q.kind = 'text' "
        "ORDER BY i.agent_id, i.after_round, i.survey, i.question LIMIT ?", [run_id, limit]).fetchall()
    shown = [{"round": r, "question": f"{s}/{qid}", "agent_id": a, "answer": shortened(t or "", 2000),
              "profile": profile_text(p)} for r, s, qid, a, t, p in rows]
    return AnswerRows(shown, int(total), shown_note(len(shown), int(total), "free-text answers",
                                                  "first agents' (by id)"))


def interview_sections(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str], attrs: Sequence[str]
                       ) -> list[Section]:
    """The interviews of one run (or several, replicates): a section per question, the panels
    over rounds, the free-text answers (one run)."""
    run_ids = list(run_ids)
    questions = interview_questions(con, run_ids)
    if not questions:
        return []
    overall = interview_table(con, run_ids)
    by = {a: interview_table(con, run_ids, by=a) for a in attrs}
    sections = []
    intro = Section("Interviews", anchor="interviews")
    usage = [u for rid in run_ids if (u := interview_usage(con, rid))]
    intro.blocks.append(Note(
        "Answers of agents asked from a copy of their state after a round (nothing they answered changed the run). "
        f"{sum(u['answers'] for u in usage):,} answers, {sum(u['valid'] for u in usage):,} valid; their LLM work "
        f"apart from the rounds': {sum(u['llm_calls'] for u in usage):,} calls, "
        f"{sum(u['prompt_tokens'] + u['completion_tokens'] for u in usage):,} tokens. Options: each option's share "
        "with its 95% Wilson interval; Likert and number: the mean with its 95% Student-t interval"
        + (", and across the runs (each one replicate)." if len(run_ids) > 1 else "."), "text"))
    sections.append(intro)
    for n, q in enumerate(questions, 1):
        rows = _question_rows(overall, q)
        if not rows:
            continue
        k = rows[0]["after_round"]
        asked = "planned" if not q["requests"] else f"post hoc ({', '.join(q['requests'])})"
        section = Section(f"Interview {n}. {q['survey']}/{q['question']}: {shortened(q['text'], 80)}",
                          anchor=f"interview-{n}")
        section.blocks.append(Note(f"{q['kind']} question, {asked}, after round{'s' if len(q['rounds']) > 1 else ''} "
                                   f"{', '.join(map(str, q['rounds']))}; shown after round {k}.", "text"))
        labels = _labels_of(q)
        panels = {"all agents": rows, **{f"by {a}": _question_rows(r, q) for a, r in by.items()}}
        panels = {name: [r for r in rs if r["after_round"] == k] for name, rs in panels.items() if rs}
        if q["kind"] in ("options", "likert"):
            options = q["spec"].get("options") or [str(i) for i in range(1, (q["spec"].get("points") or 0) + 1)]
            shares = {name: [r for r in rs if r["option"] is not None] for name, rs in panels.items()}
            section.blocks.append(Plot(share_figure(shares, options, labels),
                                       f"share of each answer to {q['question']}, overall and per group"))
        if q["kind"] in ("likert", "number"):
            means = {name: [r for r in rs if r["option"] is None] for name, rs in panels.items()}
            section.blocks.append(Plot(mean_figure(means, _bounds(q)), f"mean answer to {q['question']} per group"))
        if q["kind"] == "text":
            examples = [[r["group"], f"{r['n_valid']:,}/{r['n_asked']:,}", " | ".join(r["examples"])] for r in rows]
            section.blocks.append(Table(["group", "valid answers", "some answers"], examples, left=(0, 2)))
        else:
            section.blocks.append(_table([r for rs in panels.values() for r in rs], labels))
        sections.append(section)
    panels = panel_table(con, run_ids, by=attrs[0] if attrs else None)
    if panels:
        section = Section("Panels over rounds", anchor="panels")
        section.blocks.append(Note("Questions asked after several rounds (the same agents each time): "
                                   + (f"per {attrs[0]} group, " if attrs else "")
                                   + "with 95% intervals.", "text"))
        for q in questions:
            rows = _question_rows(panels, q)
            if rows:
                section.blocks.append(Heading(f"{q['survey']}/{q['question']}: {shortened(q['text'], 80)}"))
                section.blocks.append(Plot(panel_figure(rows, q["kind"] if q["kind"] == "options" else "mean",
                                                        _bounds(q), _labels_of(q)),
                                           f"{q['question']} over rounds per group"))
        sections.append(section)
    if len(run_ids) == 1 and any(q["kind"] == "text" for q in questions):
        answers = text_answers(con, run_ids[0])
        section = Section("Interview answers in the agents' words", anchor="interview-answers")
        if answers.note:
            section.blocks.append(Note(answers.note))
        section.blocks.append(TextAnswers(answers))
        sections.append(section)
    return sections


MAX_REFERENCE_PANELS = 6  # groups drawn per question (the table has every group)
MAX_NUMBER_BARS = 40  # a number question's distinct answers drawn as bars; more are binned


def _binned(shares: dict[str, float], edges: list[float]) -> list[float]:
    out = [0.0] * (len(edges) - 1)
    for k, v in shares.items():
        x = float(k)
        i = min(max(int(np.searchsorted(edges, x, side="right")) - 1, 0), len(out) - 1)
        out[i] += v
    return out


def reference_figure(rows: list[dict]) -> go.Figure:
    """Simulated beside reference, one panel per group: each answer's share (options), or the
    distribution of a number (its distinct values, or bins of them)."""
    rows = rows[:MAX_REFERENCE_PANELS]
    k = max(len(rows), 1)
    titles = [f"{r['group']}: {r['distance_kind']} {number(r['distance'], 3)}" for r in rows]
    fig = make_subplots(rows=k, cols=1, subplot_titles=titles, vertical_spacing=0.3 / k if k > 1 else 0.1)
    for i, r in enumerate(rows):
        where = {"row": i + 1, "col": 1}
        keys = list(dict.fromkeys([*r["reference"], *r["simulated"]]))
        if r["kind"] == "number":
            values = sorted(float(x) for x in keys)
            if len(values) > MAX_NUMBER_BARS:
                edges = list(np.linspace(values[0], values[-1], 21))
                x = [f"{edges[j]:.3g}–{edges[j + 1]:.3g}" for j in range(20)]
                sim, ref = _binned(r["simulated"], edges), _binned(r["reference"], edges)
            else:
                names = {float(x): x for x in keys}
                x = [names[v] for v in values]
                sim = [r["simulated"].get(v, 0.0) for v in x]
                ref = [r["reference"].get(v, 0.0) for v in x]
        else:
            x = keys
            sim = [r["simulated"].get(v, 0.0) for v in x]
            ref = [r["reference"].get(v, 0.0) for v in x]
        fig.add_trace(go.Bar(x=x, y=sim, name=f"simulated (n={r['n_sim']:,})" if k == 1 else "simulated",
                             marker={"color": "#1f77b4"}, legendgroup="sim", showlegend=i == 0,
                             hovertemplate="%{x}: %{y:.1%} simulated<extra></extra>"), **where)
        fig.add_trace(go.Bar(x=x, y=ref, name=f"reference (n={r['n_ref']:,.0f})" if k == 1 else "reference",
                             marker={"color": "#ff7f0e"}, legendgroup="ref", showlegend=i == 0,
                             hovertemplate="%{x}: %{y:.1%} reference<extra></extra>"), **where)
        fig.update_yaxes(tickformat=".0%", title_text="share", **where)
    fig.update_layout(barmode="group")
    return _layout(fig, (PANEL_HEIGHT + 20) * k + 60)


def reference_sections(rows: list[dict], source: str, synthetic: bool, anchor: str = "reference") -> list[Section]:
    """Simulated against the reference, per question and group, with the distance and its 95%
    bootstrap interval; a file of summaries figure by figure (report.reference_summaries)."""
    section = Section("Against reference data", anchor=anchor)
    tone = "warn" if synthetic else "text"
    if rows and all(r["kind"] == "summary" for r in rows):
        section.blocks.append(Note(f"Reference: {source}.", tone))
        section.blocks += summary_blocks(rows)
        return [section]
    section.blocks.append(Note(f"Reference: {source}. Distance: total variation (½ Σ |p − q|, 0 = the same "
                               "shares, 1 = none in common) for options, Wasserstein-1 (in the answer's units) for "
                               "numbers, with a 95% bootstrap interval (both samples resampled).", tone))
    by_target: dict[tuple, list[dict]] = {}
    for r in rows:
        by_target.setdefault((r["target"], r["question"], r["survey"], r["round"]), []).append(r)
    for (target, name, survey, rnd), rs in by_target.items():
        what = f"{survey + '/' if survey else ''}{name}" if target == "question" else f"measure {name}"
        section.blocks.append(Heading(f"{what}, after round {rnd}"))
        section.blocks.append(Plot(reference_figure(rs), f"{what}: simulated beside the reference per group"))
        table = []
        for r in rs:
            means = (f"{number(r.get('mean_sim'))} / {number(r.get('mean_ref'))}" if r["kind"] == "number" else "")
            table.append([r["group"], f"{r['n_sim']:,}", f"{r['n_ref']:,.0f}", means, r["distance_kind"],
                          number(r["distance"], 3), f"[{number(r['ci_low'], 3)}, {number(r['ci_high'], 3)}]"])
        section.blocks.append(Table(["group", "simulated", "reference", "mean (sim / ref)", "distance", "value",
                                     "95% bootstrap CI"], table, left=(0, 4)))
    return [section]
