"""What a run's LLM work cost, for the report: per round its cached tokens and dollars (cells
the per-round LLM table appends), and per model (a run with `models:`) its agents, calls,
tokens and dollars (`populace.analysis.calls.model_stats`)."""

from __future__ import annotations

from populace.analysis.calls import round_cost
from populace.analysis.report.blocks import Note, Table
from populace.analysis.report.text import number
from populace.core.contracts import money

__all__ = ["COST_HEADERS", "cost_cells", "has_cost", "models_table", "round_cost"]

COST_HEADERS = ["cached tokens", "dollars"]
MODEL_HEADERS = ["model", "agents", "LLM calls", "valid", "prompt tokens", "cached tokens", "completion tokens",
                 "dollars", "latency mean (ms)", "p50"]


def has_cost(costs: list[tuple[int | None, float | None]]) -> bool:
    """Whether any round has cached tokens or dollars worth a column."""
    return any(cached or dollars for cached, dollars in costs)


def cost_cells(cached: int | None, dollars: float | None) -> list[str]:
    return [number(cached), "—" if dollars is None else money(dollars)]


def models_table(models: dict[str, dict]) -> list:
    """The per-model table and its note (nothing for a run without `models:`)."""
    if not models:
        return []
    rows = [[name, number(m["agents"]), number(m["calls"]), number(m["valid"]), number(m["prompt_tokens"]),
             number(m["cached_tokens"]), number(m["completion_tokens"]),
             "—" if m["dollars"] is None else money(m["dollars"]), number(m["latency_ms_mean"]),
             number(m["latency_ms_p50"])] for name, m in models.items()]
    return [Table(MODEL_HEADERS, rows),
            Note("LLM work by model, from the gateway's records of each call (table llm_calls; each agent's model "
                 "in agent_models). Cached tokens: prompt tokens the provider served from its prompt cache; "
                 "dollars: at the prices in the run's `models:` (— for a model without prices).")]
