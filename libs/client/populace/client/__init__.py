"""The Populace client: prepare a scenario, submit it, follow it and read its results — used
by the `populace` CLI, notebooks and scripts (`simulate`, `start`), and the manager."""

from populace.client.api import Run, SimulationResult, simulate, start
from populace.client.interviews import InterviewRefused, interview
from populace.client.prepare import PreparedRun, prepare, prepare_file
from populace.client.run import RunOutcome, RunStalled, new_run_id, play

__all__ = ["InterviewRefused", "PreparedRun", "Run", "RunOutcome", "RunStalled", "SimulationResult", "interview",
           "new_run_id", "play", "prepare", "prepare_file", "simulate", "start"]
