"""The two model bases every contract derives from (`Strict`: the control plane, `Wire`: the data
plane) and the bounded field types the families share: what a forged or corrupted message
carries is refused at the edge."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from populace.core.subjects import valid_token

SCHEMA_VERSION = 1


class Strict(BaseModel):
    """Control-plane model: unknown keys are an error, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Wire(BaseModel):
    """Data-plane model: versioned; unknown keys are an error too (a typo is a bug); no
    float is NaN or infinite."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    v: Literal[1] = SCHEMA_VERSION


def _not_bool(v: object) -> object:
    # YAML `yes`/`true` must not silently become 1 agent or 1.0 seconds.
    if isinstance(v, bool):
        raise ValueError("must be a number, not true/false")
    return v


FiniteFloat = Annotated[float, BeforeValidator(_not_bool), Field(allow_inf_nan=False)]
Count = Annotated[int, BeforeValidator(_not_bool)]


SHA256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


def _check_token(v: str) -> str:
    if not valid_token(v):
        raise ValueError(f"{v!r} must be one NATS subject token (no '.', ' ', '*', '>')")
    return v


RunId = Annotated[str, Field(min_length=1, max_length=64)]


def _finite_json(v: object) -> object:
    """A JSON document (a simulation's payload, summary, state) holds no NaN or infinity: a
    NaN in a partial made the environment raise in a loop, and DuckDB refuses it as JSON."""
    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, float) and not math.isfinite(x):
            raise ValueError("numbers must be finite (no NaN or infinity)")
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return v


# Bounded wire types: what a forged or corrupted message carries is refused at the edge (a
# dead letter), never stored and never a stalled round. Bounds follow RunConfig's.
Token = Annotated[str, Field(min_length=1, max_length=64), AfterValidator(_check_token)]
AgentId = Annotated[int, Field(ge=0, lt=100_000_000)]
RoundNo = Annotated[int, Field(ge=1, le=10_000)]
Epoch = Annotated[int, Field(ge=0, le=1_000_000)]
Amount = Annotated[int, Field(ge=0, lt=2**63)]
Millis = Annotated[float, Field(ge=0, allow_inf_nan=False)]
JsonDoc = Annotated[dict, AfterValidator(_finite_json)]
CheckpointName = Annotated[str, Field(min_length=1, max_length=200)]  # subjects.checkpoint_agents / _env
