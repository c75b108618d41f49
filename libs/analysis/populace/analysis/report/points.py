"""The individual values behind a small group's mean, so a figure can show the points and not
only a bar (a mean of 2 agents hides how far apart they are). Only asked for groups of at most
a few dozen agents, so the rows that come back are few."""

from __future__ import annotations

import json

import duckdb

# The group labels must be exactly group_table's (education ranks, age bins …): its helpers
# are reused rather than copied, so a figure's strips and its table cannot disagree.
from populace.analysis.queries import (
    NONE_GROUP,
    _grouped_base,
    _json_path,
    _labels_for,
    _parse_attr,
    _run,
    last_round,
    tables_of,
)
from populace.analysis.tables import q


def group_points(con: duckdb.DuckDBPyConnection, run_id: str, by: str, round_: int | None = None
                 ) -> dict[str, list[float]]:
    """``{group label: [value, …]}`` of a numeric measure in one round (default: the last),
    labelled as ``group_table(con, run_id, by)`` labels its groups."""
    rt = tables_of(con, run_id)
    round_ = last_round(con, run_id) if round_ is None else round_
    if round_ is None or rt.kind != "numeric":
        return {}
    params = {"runs": [run_id], "rounds": [round_], "path": _json_path(by)}
    rows = _run(con, f"{_grouped_base(rt, 'o.' + q(rt.measure))} ORDER BY o.agent_id", params).fetchall()
    texts = {attr for _, attr, _ in rows if attr is not None and attr != "null"}
    parsed = {t: _parse_attr(t) for t in texts}
    hashable = {t: (json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v) for t, v in parsed.items()}
    mapping, order = _labels_for(by, list(hashable.values()))
    out: dict[str, list[float]] = {label: [] for label in order}
    for _, attr, value in rows:
        label = mapping[hashable[attr]] if attr in hashable else NONE_GROUP
        out.setdefault(label, []).append(float(value))
    return {label: values for label, values in out.items() if values}
