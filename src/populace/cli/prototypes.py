"""The prototype tables of `populace results --prototypes` (and the line a prototype run's plain
`results` adds): per round and prototype, who called the model, who copied, the audits and the
divergence with its interval (docs/prototypes.md)."""

# No `from __future__ import annotations` (typer evaluates string ones at each start: populace.cli.main)
from typing import TYPE_CHECKING

from populace.cli import display

if TYPE_CHECKING:
    from rich.table import Table


def _num(x: object, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def prototype_table(rows: list[dict], title: str) -> "Table":
    t = display.table(title=title)
    for name in ("round", "prototype", "agents", "share", "called", "copied", "no answer", "audited", "divergence",
                 "95% CI", "guard"):
        t.add_column(name, justify="left" if name == "prototype" else "right")
    for r in rows:
        metric = {"w1": "W1", "js": "JS"}.get(r["metric"] or "", "")
        div = "—" if r["divergence"] is None else f"{metric} {_num(r['divergence'])}" + (
            f" (TV {_num(r['tv'])})" if r.get("tv") is not None else "")
        ci = "—" if r["ci_low"] is None else f"{_num(r['ci_low'])}–{_num(r['ci_high'])}"
        guard = (f"raised to {r['next_share']:.3g}" if r["breach"] and r["next_share"] > r["share"]
                 else "over tolerance" if r["breach"] else "")
        t.add_row(str(r["round"]), r["prototype"], f"{r['agents']:,}", f"{r['share']:.3g}",
                  f"{r['representatives']:,} ({r['valid']:,} valid)", f"{r['drawn']:,}",
                  f"{r['unanswered']:,}" if r["unanswered"] else "", f"{r['audited_valid']:,}/{r['audited']:,}", div,
                  ci, guard)
    return t


def summary_line(s: dict | None) -> str | None:
    """One line for a prototype run's plain `results`."""
    if s is None:
        return None
    line = (f"prototypes: {s['representatives']:,} of {s['outcomes']:,} outcomes are the agents' own calls, "
            f"{s['drawn']:,} copied; {s['audits']:,} audits; model calls {s['calls_share']:.1%} of outcomes")
    w = s.get("worst")
    if w:
        line += (f"; largest divergence {w['metric'].upper()} {_num(w['divergence'])} (95% CI {_num(w['ci_low'])}–"
                 f"{_num(w['ci_high'])}) in round {w['round']}, {w['prototype']}")
    if s["breaches"]:
        line += f"; {s['breaches']} over tolerance"
    return line + " (results --prototypes)"
