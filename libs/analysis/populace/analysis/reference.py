"""Human reference data, and a simulated population scored against it.

A reference file (CSV or Parquet) holds the answers of real people to a question an interview
asked (column `question`, and optionally `survey`), or the values of a run's outcome measure
(column `measure`, e.g. the vote's `choice`), either one row per person (`answer`) or a
histogram (`answer` and `count`), optionally per group (columns named by persona attributes,
listed as the file's groups) and for a given round (`round`). It says where the data come from:

    # citation: a survey's own citation
    # groups: education
    question,education,answer,count
    trust,Ph.D.,3,41
    …

(Parquet: the same as key-value metadata `citation`, `groups`, `synthetic`.) A file with no
citation is refused; a test fixture says `# synthetic: <why>` instead, and every output names it
synthetic. Reading a file (streamed, within limits: populace.analysis.reference_file) is apart
from comparing it; docs/populations-and-reports.md has the format with an example of each kind.

`compare(con, run_id, reference)` puts the run beside it per question and group: the two
distributions, a distance — total variation (½ Σ |p − q|) for options, Wasserstein-1 (the mean
absolute difference of the quantile functions, in the answer's units) for numbers — and a 95%
bootstrap interval of that distance (both samples resampled, `BOOTSTRAP` times, seeded). A file of
summaries (a published table's n, mean, median, sd) is compared figure by figure: the run's mean
with its Student-t interval and its median with a distribution-free interval, beside the
people's (their mean's interval too when the file gives `sd`).

A row about run parameters (`param.game.ratio` …) is compared with the runs whose parameters
match it (numbers and fractions by value: 2/3 is 2/3), so one file holds a study's treatments.
A simulation ships its own references (`Simulation.references`: files in its package, e.g. the
ratio game's Nagel 1995 first-period summaries); `builtin_references` finds them for a run."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import duckdb
import numpy as np
from scipy.stats import wasserstein_distance

from populace.analysis.queries.attribute_groups import NONE_GROUP, _json_path, _labels_for, _parse_attr
from populace.analysis.queries.lookup import _check_runs, tables_of
from populace.analysis.reference_file import Reference, ReferenceError, answer_text, load_reference
from populace.analysis.stats import histogram_summary
from populace.analysis.tables import run_tables

__all__ = ["BOOTSTRAP", "Reference", "ReferenceError", "bootstrap", "builtin_references", "compare", "distance",
           "load_reference", "matching"]

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
    target, name, survey, rnd = key[:4]
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
    (numbers), ``distance_kind, distance, ci_low, ci_high`` and the reference's ``source``. For a
    file of summaries, ``kind`` "summary" and the figures (see `_summary_rows`). Only the rows
    about the runs' parameters (`matching`); ReferenceError when none is."""
    run_ids = _check_runs(con, [run_ids] if isinstance(run_ids, str) else run_ids)
    rows = matching(con, run_ids, reference)
    if reference.summaries:
        return _summary_rows(con, run_ids, reference, rows)
    out: list[dict] = []
    simulated = _simulated_once(con, run_ids, reference.groups)
    for key in rows:
        ref_counts = reference.counts[key]
        target, name, survey, _round, group, params = key
        kind, sim_by_group, used_round = simulated(key)
        sim = _of_group(sim_by_group, group, reference.groups)
        ns, nr = sum(sim.values()), sum(ref_counts.values())
        d = distance(kind, sim, ref_counts)
        low, high = bootstrap(kind, sim, ref_counts, n_boot) if d is not None else (None, None)
        row = {"target": target, "question": name, "survey": survey, "round": used_round,
               "group": " · ".join(group) if group else "all", "kind": kind, "n_sim": int(ns), "n_ref": nr,
               "simulated": {k: v / ns for k, v in sim.items()} if ns else {},
               "reference": {k: v / nr for k, v in ref_counts.items()} if nr else {},
               "distance_kind": "total variation" if kind == "options" else "Wasserstein-1",
               "distance": d, "ci_low": low, "ci_high": high, "source": reference.label, "params": dict(params)}
        if kind == "number":
            for side, counts, n in (("mean_sim", sim, ns), ("mean_ref", ref_counts, nr)):
                xs = _numeric(list(counts))
                row[side] = float(np.dot(xs, list(counts.values())) / n) if xs is not None and n else None
        out.append(row)
    return out


def _simulated_once(con: duckdb.DuckDBPyConnection, run_ids: list[str], groups: list[str]):
    """`_simulated` for a reference row's key, read once per question and round (the rows of its
    groups and parameters share it)."""
    cache: dict[tuple, tuple] = {}

    def simulated(key: tuple) -> tuple:
        head = key[:4]  # target, question, survey, round
        if head not in cache:
            cache[head] = _simulated(con, run_ids, key, groups)
        return cache[head]

    return simulated


def _of_group(sim_by_group: dict[tuple, dict[str, float]], group: tuple, groups: list[str]) -> dict[str, float]:
    if groups:
        return sim_by_group.get(group, {})
    sim: dict[str, float] = {}
    for cell in sim_by_group.values():
        for k, v in cell.items():
            sim[k] = sim.get(k, 0.0) + v
    return sim


def _summary_rows(con: duckdb.DuckDBPyConnection, run_ids: list[str], reference: Reference,
                  keys: list[tuple]) -> list[dict]:
    """Per summary row: ``kind`` "summary", the runs' ``n_sim``, ``mean_sim`` with ``mean_sim_low``,
    ``mean_sim_high`` (Student-t 95%), ``median_sim`` with ``median_sim_low``, ``median_sim_high``
    (the order statistics that bound it with ≥ 95%), ``sd_sim``; the people's ``n_ref``,
    ``mean_ref``, ``median_ref``, ``sd_ref`` (None where the file gives none) and their mean's
    interval when it gives `sd`; ``mean_diff``, ``median_diff`` (people − run) and whether the
    people's figure lies in the run's interval (``mean_inside``, ``median_inside``)."""
    out: list[dict] = []
    simulated = _simulated_once(con, run_ids, reference.groups)
    for key in keys:
        figures = reference.summaries[key]
        target, name, survey, _round, group, params = key
        kind, sim_by_group, used_round = simulated(key)
        what = f"{target} {name!r}"
        if kind != "number":
            raise ReferenceError(f"{what}: a summary (mean, median) compares numbers; the runs' answers are {kind}")
        sim = _of_group(sim_by_group, group, reference.groups)
        xs = _numeric(list(sim))
        run = histogram_summary(xs if xs is not None else np.zeros(0), np.array(list(sim.values()), dtype=float))
        n_ref, sd_ref = int(figures["n"] or 0), figures["sd"]
        mean_ref, median_ref = figures["mean"], figures["median"]
        ref_low = ref_high = None
        if sd_ref is not None and mean_ref is not None and n_ref >= 2:
            from populace.analysis.stats import t_interval

            ref_low, ref_high = t_interval(mean_ref, sd_ref, n_ref)
        row = {"target": target, "question": name, "survey": survey, "round": used_round,
               "group": " · ".join(group) if group else "all", "kind": "summary", "params": dict(params),
               "source": reference.label, "n_sim": run["n"], "n_ref": n_ref,
               "mean_sim": run["mean"], "mean_sim_low": run["mean_low"], "mean_sim_high": run["mean_high"],
               "median_sim": run["median"], "median_sim_low": run["median_low"],
               "median_sim_high": run["median_high"], "sd_sim": run["sd"],
               "mean_ref": mean_ref, "median_ref": median_ref, "sd_ref": sd_ref, "mean_ref_low": ref_low,
               "mean_ref_high": ref_high}
        for fig in ("mean", "median"):
            ref_value, sim_value = row[f"{fig}_ref"], row[f"{fig}_sim"]
            low, high = row[f"{fig}_sim_low"], row[f"{fig}_sim_high"]
            row[f"{fig}_diff"] = ref_value - sim_value if ref_value is not None and sim_value is not None else None
            row[f"{fig}_inside"] = (low <= ref_value <= high) if None not in (ref_value, low, high) else None
        out.append(row)
    return out


# --- which rows are about these runs -------------------------------------------------------------

def matching(con: duckdb.DuckDBPyConnection, run_ids: list[str], reference: Reference) -> list[tuple]:
    """The reference's rows (keys, in a stable order) whose `param.<path>` values equal every run's
    parameters; ReferenceError naming the parameters when none does."""
    keys = sorted({*reference.counts, *reference.summaries}, key=lambda k: tuple(str(x) for x in k))
    if not reference.params:
        return keys
    runs = [run_tables(con, rid).params for rid in run_ids]
    kept = [k for k in keys if all(_same(_dig(p, path), text) for p in runs for path, text in k[5])]
    if not kept:
        theirs = "; ".join(f"{path} = {', '.join(_shown(_dig(p, path)) for p in runs)}" for path in reference.params)
        offered = sorted({f"{path} {text}" for k in keys for path, text in k[5]})
        raise ReferenceError(f"no row of {reference.label or reference.path} is about these runs' parameters "
                             f"({theirs}); its rows are about {', '.join(offered)}")
    return kept


_MISSING = object()


def _dig(params: dict, path: str) -> object:
    value: object = params
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _shown(value: object) -> str:
    return "(not set)" if value is _MISSING else str(value)


def _number(value: object) -> Fraction | float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        try:
            return Fraction(value.strip())
        except (ValueError, ZeroDivisionError):
            return None
    return None


def _same(value: object, text: str) -> bool:
    """A run's parameter equals a row's: as numbers (fractions exactly, a float to 1e-9) or as text."""
    if value is _MISSING:
        return False
    a, b = _number(value), _number(text)
    if a is not None and b is not None:
        if isinstance(a, Fraction) and isinstance(b, Fraction):
            return a == b
        return abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(b)))
    return answer_text(value) == text


# --- references a simulation ships ----------------------------------------------------------------

def builtin_references(con: duckdb.DuckDBPyConnection, run_id: str) -> list[Reference]:
    """The reference files the run's simulation ships (`Simulation.references`, paths beside its
    module), read and checked like any other; none when its class cannot be loaded here."""
    import inspect

    from populace.sdk.registry import load_simulation

    name = run_tables(con, run_id).spec.simulation
    try:
        sim = load_simulation(name)
    except Exception:  # not installed here: the report says so elsewhere
        return []
    base = Path(inspect.getfile(sim)).parent
    return [load_reference(base / path) for path in getattr(sim, "references", ())]
