"""One self-contained, interactive HTML report of a run, or of several runs side by side, for
any simulation (``render_report``, ``write_report``).

    from populace.analysis import write_report
    with duckdb.connect("populace.duckdb", read_only=True) as con:
        write_report(con, "run-1", "report.html", by=["education"])
        write_report(con, ["run-1", "run-2"], "compare.html")

The package, one concern per module: ``sections`` (what one run's report shows, read from
DuckDB), ``comparison`` (several runs), ``figures`` (Plotly figures from table rows),
``intervals`` (CIs cut to the measure's range, padded axes), ``answer_rows`` (invalid answers and
reasoning, capped), ``text`` (wording and number formats), ``blocks`` (what a page is made
of), ``page`` (Jinja2 templates in ``templates/``, plotly.js inlined once)."""

from populace.analysis.report.figures import histogram_bins
from populace.analysis.report.page import render_report, runs_named, write_report
from populace.analysis.report.text import describe, params_text, shown_rounds

__all__ = ["describe", "histogram_bins", "params_text", "render_report", "runs_named", "shown_rounds",
           "write_report"]
