"""The Populace client: prepare a scenario, submit it, follow it and read its results — used
by the `populace` CLI, notebooks and scripts (`simulate`, `start`, `interview`), and the manager."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# eager: the name `prepare` must stay this function, not the submodule of the same name
from populace.client.prepare import PreparedRun, prepare, prepare_file

if TYPE_CHECKING:
    from populace.client.api import Run, SimulationResult, simulate, start
    from populace.client.interviews import InterviewFailed, InterviewRefused, interview
    from populace.client.run import RunOutcome, RunStalled, new_run_id, play

# imported on first use: they bring NATS and Arrow, which preparing a scenario (`populace
# validate`) or showing progress does not need
_LAZY = {"Run": "api", "SimulationResult": "api", "simulate": "api", "start": "api",
         "InterviewFailed": "interviews", "InterviewRefused": "interviews", "interview": "interviews",
         "RunOutcome": "run", "RunStalled": "run", "new_run_id": "run", "play": "run"}

__all__ = ["InterviewFailed", "InterviewRefused", "PreparedRun", "Run", "RunOutcome", "RunStalled", "SimulationResult",
           "interview", "new_run_id", "play", "prepare", "prepare_file", "simulate", "start"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"populace.client.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
