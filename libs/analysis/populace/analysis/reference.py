"""Human reference data, and a simulated population scored against it.

A reference file (CSV or Parquet) holds the answers of real people to a question an interview
asked (column `question`, and optionally `survey`), or the values of a run's outcome measure
(column `measure`, e.g. the vote's `choice`), either one row per person (`answer`) or a
histogram (`answer` and `count`), optionally per group (columns named by persona attributes,
listed as the file's groups) and for a given round (`round`). It says where the data come from:

    # citation: Nagel, R. (1995). Unraveling in Guessing Games. AER 85(5), 1313-1326. Table 1.
    # groups: education
    question,education,answer,count
    trust,Ph.D.,3,41
    …

(Parquet: the same as key-value metadata `citation`, `groups`, `synthetic`.) A file with no
citation is refused; a test fixture says `# synthetic: <why>` instead, and every output names it
synthetic. Populace ships no reference of its own: none whose primary source could be checked
here. Reading a file (streamed, within limits: populace.analysis.reference_file) is apart from
comparing it.

`compare(con, run_id, reference)` puts the run beside it per question and group: the two
distributions, a distance — total variation (½ Σ |p − q|) for options, Wasserstein-1 (the mean
absolute difference of the quantile functions, in the answer's units) for numbers — and a 95%
bootstrap interval of that distance (both samples resampled, `BOOTSTRAP` times, seeded)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import duckdb
import numpy as np
from scipy.stats import wasserstein_distance

from populace.analysis.queries.attribute_groups import NONE_GROUP, _json_path, _labels_for, _parse_attr
from populace.analysis.queries.lookup import _check_runs, tables_of
from populace.analysis.reference_file import Reference, ReferenceError, answer_text, load_reference

__all__ = ["BOOTSTRAP", "Reference", "ReferenceError", "bootstrap", "compare", "distance", "load_reference"]

BOOTSTRAP = 1000
LEVEL = 0.95


def _numeric(values: Sequence[str]) -> np.ndarray | None:
    try:
        out = np.array([float(v) for v in values], dtype=float)
    except ValueError:
        return None
    return out if np.isfinite(out).all() else None


def distance(kind: str, sim: dict[str, float], ref: dict[str, float]) -> float | None:
    """Total variation (options) or Wasserstein-1 (numbers) between two histograms (answer -> count)."""
    ns, nr = sum(sim.values()), sum(ref.values())
    if ns <= 0 or nr <= 0:
        return None
    if kind == "options":
        keys = set(sim) | set(ref)
        return 0.5 * sum(abs(sim.get(k, 0) / ns - ref.get(k, 0) / nr) for k in keys)
    xs, xr = _numeric(list(sim)), _numeric(list(ref))
    if xs is None or xr is None:
        return None
    return float(wasserstein_distance(xs, xr, np.array(list(sim.values())), np.array(list(ref.values()))))


def bootstrap(kind: str, sim: dict[str, float], ref: dict[str, float], n: int = BOOTSTRAP, level: float = LEVEL,
              seed: int = 0) -> tuple[float | None, float | None]:
    """A percentile bootstrap interval of the distance: each sample resampled with replacement
    (a multinomial draw of its size over its own histogram), `n` times."""
    rng = np.random.default_rng(seed)
    keys_s, keys_r = list(sim), list(ref)
    ps, pr = np.array(list(sim.values()), dtype=float), np.array(list(ref.values()), dtype=float)
    ns, nr = round(float(ps.sum())), round(float(pr.sum()))
    if ns <= 0 or nr <= 0:
        return None, None
    ps, pr = ps / ps.sum(), pr / pr.sum()
    out = []
    for _ in range(n):
        a = rng.multinomial(ns, ps)
        b = rng.multinomial(nr, pr)
        d = distance(kind, dict(zip(keys_s, a.astype(float), strict=True)), dict(zip(keys_r, b.astype(float),
                                                                                         strict=True)))
        if d is not None:
            out.append(d)
    if not out:
        return None, None
    lo, hi = np.quantile(out, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def _simulated(con: duckdb.DuckDBPyConnection, run_ids: list[str], key: tuple, groups: list[str]
               ) -> tuple[str, dict[tuple, dict[str, float]], int | None]:
    """(kind, group values -> answer -> count, round) of the runs' answers the reference row names."""
    target, name, survey, rnd, _ = key
    if target == "question":
        where = "question = $name" + (" AND survey = $survey" if survey else "")
        params: dict = {"runs": run_ids, "name": name, **({"survey": survey} if survey else {})}
        found = con.execute(f"SELECT any_value(kind), max(after_round) FROM interview_questions WHERE run_id IN "
                            f"(SELECT unnest($runs)) AND {where} AND position >= 0", params).fetchone()
        if not found or found[0] is None:
            raise ReferenceError(f"question: {name!r} was not asked in run(s) {', '.join(run_ids)}")
        kind = "options" if found[0] == "options" else ("text" if found[0] == "text" else "number")
        rnd = rnd or found[1]
        params["round"] = rnd
        source = (f"SELECT run_id, agent_id, answer AS v FROM interviews WHERE run_id IN (SELECT unnest($runs)) AND "
                  f"{where} AND after_round = $round AND valid")
    else:
        rts = [tables_of(con, rid) for rid in run_ids]
        rt = rts[0]
        if rt.measure != name:
            raise ReferenceError(f"measure: {name!r} is not run {rt.run_id}'s measure ({rt.measure!r})")
        kind = "options" if rt.kind == "categorical" else "number"
        last = con.execute(f'SELECT max(round) FROM "{rt.spec.outcomes}" WHERE run_id IN (SELECT unnest($1))',
                           [run_ids]).fetchone()[0]
        rnd = rnd or last
        params = {"runs": run_ids, "round": rnd}
        source = (f'SELECT run_id, agent_id, CAST("{rt.measure}" AS VARCHAR) AS v FROM "{rt.spec.outcomes}" '
                  f'WHERE run_id IN (SELECT unnest($runs)) AND round = $round AND valid AND "{rt.measure}" IS NOT NULL')
    if kind == "text":
        raise ReferenceError(f"question: {name!r} is free text; a reference compares options and numbers")
    attrs = ", ".join(f"CAST(coalesce(json_extract(any_value(p.profile), $g{i}), json_extract(any_value(p.persona), "
                      f"$g{i})) AS VARCHAR) AS g{i}" for i in range(len(groups)))
    for i, g in enumerate(groups):
        params[f"g{i}"] = _json_path(g)
    if groups:
        sql = (f"WITH s AS ({source}), a AS (SELECT p.run_id, p.agent_id, {attrs} FROM agent_profiles p WHERE "
               "p.run_id IN (SELECT unnest($runs)) GROUP BY p.run_id, p.agent_id) "
               f"SELECT {', '.join(f'a.g{i}' for i in range(len(groups)))}, s.v, count(*) FROM s "
               f"LEFT JOIN a ON a.run_id = s.run_id AND a.agent_id = s.agent_id GROUP BY ALL")
    else:
        sql = f"WITH s AS ({source}) SELECT v, count(*) FROM s GROUP BY v"
    rows = con.execute(sql, params).fetchall()
    out: dict[tuple, dict[str, float]] = {}
    labelers = []
    for i, g in enumerate(groups):
        texts = {r[i] for r in rows if r[i] is not None and r[i] != "null"}
        parsed = {t: _parse_attr(t) for t in texts}
        hashable = {t: (json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v) for t, v in parsed.items()}
        mapping, _ = _labels_for(g, list(hashable.values()))
        labelers.append(lambda t, m=mapping, h=hashable: m[h[t]] if t in h else NONE_GROUP)
    for r in rows:
        label = tuple(labelers[i](r[i]) for i in range(len(groups)))
        value = answer_text(r[len(groups)])
        cell = out.setdefault(label, {})
        cell[value] = cell.get(value, 0.0) + float(r[-1])
    return kind, out, rnd


def compare(con: duckdb.DuckDBPyConnection, run_ids: str | Sequence[str], reference: Reference,
            n_boot: int = BOOTSTRAP) -> list[dict]:
    """One dict per reference question (or measure) and group: ``question, survey, round, group,
    kind, n_sim, n_ref, simulated, reference`` (answer -> share), ``mean_sim, mean_ref``
    (numbers), ``distance_kind, distance, ci_low, ci_high`` and the reference's ``source``."""
    run_ids = _check_runs(con, [run_ids] if isinstance(run_ids, str) else run_ids)
    out: list[dict] = []
    cache: dict[tuple, tuple] = {}
    for key, ref_counts in sorted(reference.counts.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        target, name, survey, rnd, group = key
        head = (target, name, survey, rnd)
        if head not in cache:
            cache[head] = _simulated(con, run_ids, (*head, group), reference.groups)
        kind, sim_by_group, used_round = cache[head]
        if reference.groups:
            sim = sim_by_group.get(group, {})
        else:
            sim = {}
            for cell in sim_by_group.values():
                for k, v in cell.items():
                    sim[k] = sim.get(k, 0.0) + v
        ns, nr = sum(sim.values()), sum(ref_counts.values())
        d = distance(kind, sim, ref_counts)
        low, high = bootstrap(kind, sim, ref_counts, n_boot) if d is not None else (None, None)
        row = {"target": target, "question": name, "survey": survey, "round": used_round,
               "group": " · ".join(group) if group else "all", "kind": kind, "n_sim": int(ns), "n_ref": nr,
               "simulated": {k: v / ns for k, v in sim.items()} if ns else {},
               "reference": {k: v / nr for k, v in ref_counts.items()} if nr else {},
               "distance_kind": "total variation" if kind == "options" else "Wasserstein-1",
               "distance": d, "ci_low": low, "ci_high": high, "source": reference.label}
        if kind == "number":
            for side, counts, n in (("mean_sim", sim, ns), ("mean_ref", ref_counts, nr)):
                xs = _numeric(list(counts))
                row[side] = float(np.dot(xs, list(counts.values())) / n) if xs is not None and n else None
        out.append(row)
    return out
