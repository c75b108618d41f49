"""How the report words and formats what it shows: numbers, shares, a run's parameters, model,
prompt and population, one line per run. Pure functions returning plain text: the templates
escape it (Jinja2 autoescape), so nothing here is HTML."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import numpy as np

from populace.core.contracts import money

JSON_MAX_CHARS = 120  # a JSON summary cell (the vote's counts) is shortened past this
MAX_TABLE_ROUNDS = 200  # per-round tables: all rounds up to this, else the first and last halves


def number(x: object, digits: int = 2) -> str:
    """'1,234' for an integer, '12.35' for a float, '—' for nothing or a non-finite value."""
    if x is None:
        return "—"
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return f"{int(x):,}"
    try:
        f = float(x)
    except (TypeError, ValueError):
        return str(x)
    if not math.isfinite(f):
        return "—"
    return f"{f:,.{digits}f}"


def percent(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{100 * x:.{digits}f}%"


def interval(low: float | None, high: float | None, fmt=number) -> str:
    """'[1.00, 2.00]', or '—' when the interval is undefined (n < 2)."""
    return "—" if low is None or high is None else f"[{fmt(low)}, {fmt(high)}]"


def params_text(params: dict, limit: int = 400) -> str:
    """A simulation's own config sections flattened: 'game.endowment=20, prompt.answer=cot'."""
    parts: list[str] = []

    def walk(prefix: str, v: object) -> None:
        if isinstance(v, dict) and (v or not prefix):
            for k, w in v.items():
                walk(f"{prefix}.{k}" if prefix else str(k), w)
        else:
            parts.append(f"{prefix}={json.dumps(v, ensure_ascii=False) if isinstance(v, (list, dict)) else v}")

    walk("", params)
    text = ", ".join(parts)
    return text if len(text) <= limit else text[:limit] + "…"


def flat_params(params: dict) -> dict[str, str]:
    """``{"game.ratio": "2/3", …}``: a config's leaves by dotted key, values as text (for a table
    comparing runs key by key)."""
    out: dict[str, str] = {}

    def walk(prefix: str, v: object) -> None:
        if isinstance(v, dict) and v:
            for k, w in v.items():
                walk(f"{prefix}.{k}" if prefix else str(k), w)
        elif prefix:
            out[prefix] = json.dumps(v, ensure_ascii=False) if isinstance(v, (list, dict)) else str(v)

    walk("", params)
    return out


def describe(info: dict) -> str:
    """One line saying what was played: the simulation's own description, else its parameters."""
    if info.get("description"):
        return info["description"]
    p = params_text(info.get("params") or {})
    return f"{info.get('simulation')}" + (f": {p}" if p else "")


def prompt_text(prompt: dict | None) -> str | None:
    if not prompt:
        return None
    return ", ".join(f"{k}={('on' if v else 'off') if isinstance(v, bool) else v}" for k, v in prompt.items())


def population_text(pop: dict | None) -> str | None:
    if not pop:
        return None
    parts = [f"{k}: {pop[k]}" for k in ("personas", "config", "source") if pop.get(k)]
    if pop.get("digest"):
        parts.append(f"sha256 {str(pop['digest'])[:12]}…")
    return "; ".join(parts) or json.dumps(pop, sort_keys=True)


def model_text(model: dict, manifest: dict | None = None) -> str:
    """'local (SmolLM2-135M-Instruct); temperature=0.7': the backend, and the model's name from
    the config or, failing that, the replicas' model ids the manifest recorded (a config naming
    only the backend says nothing about which model answered)."""
    if not model:
        return "—"
    text = str(model.get("backend", "?"))
    names = [model["name"]] if model.get("name") else manifest_model_names(manifest)
    if names:
        text += f" ({', '.join(names)})"
    extra = [f"{k}={model[k]}" for k in ("temperature", "max_tokens") if k in model]
    return text + (f"; {', '.join(extra)}" if extra else "")


def manifest_model_names(manifest: dict | None) -> list[str]:
    """The model ids a run's manifest recorded for its replicas (any shape: a name, a list of
    names, or a list of replicas with ``model``/``model_id``)."""
    model = (manifest or {}).get("model")
    if not isinstance(model, dict):
        return []
    found: list[str] = []
    for key in ("name", "model", "model_id", "models", "model_ids", "replicas"):
        value = model.get(key)
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, dict):
                item = item.get("model_id") or item.get("model") or item.get("name")
            if isinstance(item, str) and item and item not in found:
                found.append(item)
    return found


def usage_text(usage: dict | None) -> str | None:
    """The run's LLM work, infrastructure failures apart from the model's: a prompt no model
    answered was asked again, and is never recorded as an answer."""
    if usage is None:
        return None
    cached = f" ({usage['cached_tokens']:,} of the prompt tokens cached)" if usage.get("cached_tokens") else ""
    cost = f", {money(usage['dollars'])} at the models' prices" if usage.get("dollars") else ""
    return (f"{usage['llm_calls']:,} calls, {usage['prompt_tokens']:,} prompt + {usage['completion_tokens']:,} "
            f"completion tokens{cached}{cost}; {usage['infra_retries']:,} infrastructure retries (prompts asked "
            "again because no model answered; never recorded as answers)")


def most_chosen(row: dict) -> str:
    """'no (48.0%)', 'tie (36.0%)' or '—': a round's leading option."""
    if row.get("leader_share") is None:
        return "—"
    return f"{row['leader'] if row['leader'] is not None else 'tie'} ({percent(row['leader_share'])})"


def summary_cell(name: str, value: object, type_: str) -> str:
    """A summary cell: ids plain, JSON compact and shortened, numbers formatted."""
    if value is None:
        return "—"
    if type_ == "JSON" or type_.endswith("[]"):  # a LIST column's value is a list, shown like JSON
        text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
        return text if len(text) <= JSON_MAX_CHARS else text[:JSON_MAX_CHARS] + "…"
    if name.endswith("_id") or type_ in ("VARCHAR", "BOOLEAN"):
        return str(value)
    return number(value)


def capped_rounds(rows: list[dict], cap: int = MAX_TABLE_ROUNDS) -> tuple[list[dict], str | None]:
    """All rows up to ``cap``, else the first and the last halves with a note saying so."""
    if len(rows) <= cap:
        return rows, None
    head = cap // 2
    note = f"Showing the first {head} and the last {cap - head} of {len(rows):,} rounds."
    return rows[:head] + rows[len(rows) - (cap - head):], note


def shown_rounds(rounds: Sequence[int], max_panels: int = 6) -> list[int]:
    """All rounds if few, else the first ⌈max/2⌉ and the last ⌊max/2⌋."""
    rounds = list(rounds)
    if len(rounds) <= max_panels:
        return rounds
    head = (max_panels + 1) // 2
    return rounds[:head] + rounds[len(rounds) - (max_panels - head):]


def shortened(text: str | None, limit: int) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= limit else text[:limit] + f"… ({len(text) - limit:,} more characters)"
