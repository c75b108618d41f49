"""What happens to a child after it exits: the restart policy's decision, as a pure function."""

from __future__ import annotations

from dataclasses import dataclass

from populace.core.contracts import ProcessState, RestartPolicy

# A child that ran this long before it died was healthy: its run of restarts starts again
# from 0, so a service that crashes once a day is not given up after `max_restarts` days.
STABLE_AFTER_S = 60.0


@dataclass(frozen=True)
class AfterExit:
    state: ProcessState  # restarting, exited or stopped
    restarts: int  # consecutive restarts, counting the one decided here
    delay_s: float | None = None  # restarting: start it again after this long


def backoff(policy: RestartPolicy, restarts: int) -> float:
    """The wait before restart number `restarts + 1`: backoff_s doubled per restart, capped."""
    return min(policy.backoff_s * 2.0 ** min(restarts, 30), RestartPolicy.MAX_BACKOFF_S)


def after_exit(policy: RestartPolicy, exit_code: int, restarts: int, ran_s: float,
               stop_requested: bool = False) -> AfterExit:
    """A child exited with `exit_code` (negative: killed by that signal) after `ran_s` seconds,
    having been restarted `restarts` times in a row. A child stopped on request stays stopped;
    a clean exit (0) is never a failure."""
    if stop_requested:
        return AfterExit("stopped", restarts)
    if ran_s >= STABLE_AFTER_S:
        restarts = 0
    if policy.mode == "never" or exit_code == 0 or restarts >= policy.max_restarts:
        return AfterExit("exited", restarts)
    return AfterExit("restarting", restarts + 1, backoff(policy, restarts))
