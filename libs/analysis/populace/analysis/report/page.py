"""The report as one self-contained HTML page, rendered by Jinja2 (autoescape on) from the
templates beside this file: one run's report, or several runs side by side.

Self-contained means no request of any kind: plotly.js is inlined once (no CDN, no MathJax,
no web font, no topojson: the figures use none), the figures are JSON in ``data-figure``
attributes drawn by a small inline script, and the style is inline."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from importlib.resources import files
from pathlib import Path

import duckdb
import plotly.offline
from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from populace.analysis.queries import (
    attributes,
    fork_table,
    group_spread,
    known_runs,
    round_table,
    run_info,
    tables_of,
)
from populace.analysis.reference import Reference, ReferenceError, builtin_references, compare
from populace.analysis.report.blocks import Note, Plot, Section
from populace.analysis.report.comparison import comparison_sections
from populace.analysis.report.interviews import interview_sections, reference_sections
from populace.analysis.report.sections import run_sections
from populace.analysis.report.text import describe
from populace.analysis.tables import has_table

MAX_GROUP_PLOTS = 4  # persona attributes drawn by default (the first ones of the profile)

_templates = Environment(loader=PackageLoader("populace.analysis.report", "templates"),
                         autoescape=select_autoescape(default=True, default_for_string=True),
                         trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


@cache
def _asset(name: str) -> Markup:
    """A style sheet or script shipped beside the templates, inlined as it is (read as a file, not
    a template, so its braces are never taken for Jinja's)."""
    return Markup(files("populace.analysis.report").joinpath("templates", name).read_text(encoding="utf-8"))


@cache
def plotly_js() -> Markup:
    """The plotly.js bundle shipped with the plotly package (no download)."""
    js = plotly.offline.get_plotlyjs()
    if "</script" in js.lower():  # it would end the inline <script> early
        raise RuntimeError("the plotly.js bundle contains '</script' and cannot be inlined")
    return Markup(js)


def _number_plots(sections: Sequence[Section]) -> int:
    """Give every figure its element id and its JSON; returns how many there are."""
    n = 0
    for section in sections:
        for block in section.blocks:
            if isinstance(block, Plot):
                n += 1
                block.dom_id = f"figure-plot-{n}"
                block.spec = block.figure.to_json()
    return n


def _page(template: str, sections: Sequence[Section], **context) -> str:
    plots = _number_plots(sections)
    return _templates.get_template(template).render(
        sections=sections, css=_asset("report.css"), script=_asset("report.js"),
        plotly_js=plotly_js() if plots else None, **context)


def _run_page(con: duckdb.DuckDBPyConnection, run_id: str, by: str | Sequence[str] | None,
              reference: Reference | None = None) -> str:
    info = run_info(con, run_id)
    rounds = round_table(con, run_id)
    types = tables_of(con, run_id).summary_types
    if by is None:
        attrs = attributes(con, run_id)[:MAX_GROUP_PLOTS]
    else:
        attrs = [by] if isinstance(by, str) else list(by)
    spread = group_spread(con, run_id) if info["grouped"] and info["measure"] else None
    header, sections = run_sections(con, run_id, info, rounds, types, attrs, spread, fork_table(con, run_id))
    if reference is not None:
        sections[1:1] = reference_sections(compare(con, [run_id], reference), reference.label,
                                           reference.synthetic is not None)
    # the human data the simulation ships: after the run's own figures, before its invalid answers
    at = next((i for i, s in enumerate(sections) if s.anchor == "invalid"), len(sections))
    sections[at:at] = builtin_sections(con, run_id)
    return _page("run.html.j2", sections, title=f"Populace run {run_id}",
                 subtitle=f"{info.get('name') or ''} — {describe(info)}", header=header, warning=info.get("note"))


def builtin_sections(con: duckdb.DuckDBPyConnection, run_id: str) -> list[Section]:
    """The run beside the human data its simulation ships (`Simulation.references`), the rows
    about its parameters; a note when a shipped file has none for them or cannot be read."""
    try:
        shipped = builtin_references(con, run_id)
    except ReferenceError as err:  # the simulation's own file: said, not fatal to the report
        note = Note(f"The simulation's reference data cannot be read: {err}", "warn")
        return [Section("Against human data", [note], anchor="reference-builtin")]
    out: list[Section] = []
    for i, ref in enumerate(shipped):
        anchor = f"reference-builtin-{i + 1}"
        try:
            rows = compare(con, [run_id], ref)
        except ReferenceError as err:
            out.append(Section("Against human data", [Note(f"{ref.label}: {err}", "note")], anchor=anchor))
            continue
        out += reference_sections(rows, ref.label, ref.synthetic is not None, anchor=anchor)
    for section in out:
        section.title = "Against human data (shipped with the simulation)"
    return out


def _comparison_page(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str],
                     reference: Reference | None = None) -> str:
    infos, sections = comparison_sections(con, run_ids)
    sections += interview_sections(con, run_ids, [])
    if reference is not None:
        sections += reference_sections(compare(con, run_ids, reference), reference.label,
                                       reference.synthetic is not None)
    warnings = [f"{i['run_id']}: {i['note']}" for i in infos if i.get("note")]
    return _page("comparison.html.j2", sections, title=f"Populace: {len(infos)} runs compared", runs=infos,
                 warnings=warnings)


def render_report(con: duckdb.DuckDBPyConnection, run_id: str | Sequence[str],
                  by: str | Sequence[str] | None = None, reference: Reference | None = None) -> str:
    """The report as one self-contained HTML page (str): one run's report for a run id, or
    several runs side by side for a list of two or more.

    ``by``: the attributes to group by in a run's report (a name or a list); default: every
    profile attribute of the run, at most 4. ``reference``: human data the runs are put beside
    (populace.analysis.reference). Raises AnalysisError for an unknown run or attribute, or a
    reference that does not fit the runs."""
    run_ids = [run_id] if isinstance(run_id, str) else list(dict.fromkeys(run_id))
    if len(run_ids) == 1:
        return _run_page(con, run_ids[0], by, reference)
    return _comparison_page(con, run_ids, reference)


def write_report(con: duckdb.DuckDBPyConnection, run_id: str | Sequence[str], out_path: str | Path,
                 by: str | Sequence[str] | None = None, reference: Reference | None = None) -> Path:
    """Render the report (``render_report``) and write it to ``out_path`` (UTF-8); returns the path."""
    text = render_report(con, run_id, by=by, reference=reference)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return out


def runs_named(con: duckdb.DuckDBPyConnection, names: Sequence[str]) -> list[str]:
    """Run ids for what a user typed: a run id stays itself; a sweep's id
    (``sweep-20250101-120000``, in each of its runs' manifests) stands for its runs, in the
    order they started. Anything else is kept, for the analysis to name as unknown."""
    known = set(known_runs(con))
    out: list[str] = []
    for name in names:
        if name in known or not has_table(con, "runs"):
            out.append(name)
            continue
        swept = [r[0] for r in con.execute(
            "SELECT run_id FROM runs WHERE manifest_json->>'$.sweep.id' = ? ORDER BY started_at, run_id",
            [name]).fetchall()]
        out += swept or [name]
    return list(dict.fromkeys(out))
