"""Does a checkpoint keep everything an agent's turns change? A resume, a fork and a re-placed
host rebuild each agent from its class (`Agent(id, persona, sim)`) and its checkpoint (the
attributes `state_fields` names, through JSON). Any other attribute a turn changed is lost, and
the resumed run silently plays from different agents.

The check compares a live agent with the copy a checkpoint would give back: every attribute
(slots and `__dict__`) but the platform's `id`, `persona` and `sim`. It runs between rounds on a
sample of the agents of `populace run --local` and `simulate(local=True)` (never on the fleet's
hot path), and on every agent in `populace.sdk.testing.check_resume`.

    check_agents(run.agents)   # raises UnsavedState naming the attribute, the agent and the fix
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pydantic_core import PydanticSerializationError, from_json, to_json

from populace.sdk.agent import Agent
from populace.sdk.process import ProcessAgent
from populace.sdk.simulation import SimulationError
from populace.sdk.statejson import StateTypeError, decode_state, encode_column

if TYPE_CHECKING:
    from populace.sdk.hosting import HostedRun
    from populace.sdk.llm import LLM

PLATFORM_ATTRIBUTES = ("id", "persona", "sim")  # set when an agent is built, never by a turn
# Agents checked per share between rounds of a local run: a spread of ids, enough to meet an
# attribute that only some agents change, and a few milliseconds at any population size.
DEFAULT_SAMPLE = 256
_MISSING = object()


class UnsavedState(SimulationError):
    """An agent's attribute that a resume or fork would lose, or not get back equal."""


def attributes(agent: Agent) -> dict[str, Any]:
    """Every attribute the agent holds (its slots over its classes, then its `__dict__`),
    without the platform's."""
    out: dict[str, Any] = {}
    for klass in type(agent).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name in ("__dict__", "__weakref__"):
                continue
            if name.startswith("__") and not name.endswith("__"):
                name = f"_{klass.__name__.lstrip('_')}{name}"  # a private slot's stored name
            if name not in out:
                value = getattr(agent, name, _MISSING)
                if value is not _MISSING:
                    out[name] = value
    for name, value in getattr(agent, "__dict__", {}).items():
        out.setdefault(name, value)
    return {k: v for k, v in out.items() if k not in PLATFORM_ATTRIBUTES}


def stored(agent: Agent) -> dict[str, Any]:
    """The agent's declared state as a checkpoint holds it: encoded as the agent-host encodes it
    (populace.sdk.statejson), through JSON (pydantic-core, populace.core.checkpoints)."""
    cls = type(agent)
    saved = {name: encode_column(name, [value], lambda i: agent.id, cls)[0] for name, value in agent.state().items()}
    return from_json(to_json(saved))


def checkpointed(agent: Agent) -> dict[str, Any]:
    """The agent's declared state as a checkpoint gives it back: `stored`, decoded as a restore
    decodes it."""
    return decode_state(stored(agent), type(agent))


def restored(agent: Agent, sim: Any = None) -> Agent:
    """A new agent built as a resumed host builds it, with the state a checkpoint keeps of `agent`
    (`sim`: the run's simulation as the new process has it; default: the same object)."""
    fresh = type(agent)(agent.id, agent.persona, agent.sim if sim is None else sim)
    fresh.restore(checkpointed(agent))
    return fresh


def same(a: Any, b: Any) -> bool:
    """Equal values; for objects without `==` (a random.Random) or with a NaN inside, equal
    pickles."""
    if a is b:
        return True
    try:
        if bool(a == b):
            return True
    except Exception:  # numpy arrays and other values whose == is not a bool
        pass
    try:
        return pickle.dumps(a) == pickle.dumps(b)
    except Exception:
        return False


def _short(value: Any, limit: int = 80) -> str:
    text = "(not set)" if value is _MISSING else repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def problems(agent: Agent) -> list[tuple[str, str]]:
    """(attribute, what is wrong) for each attribute a checkpoint of `agent` would not bring
    back equal; empty when a resumed agent would be this one."""
    cls = type(agent)
    try:
        fresh = restored(agent)
    except AttributeError as err:
        return [("state_fields", f"{cls.__name__}.state_fields names an attribute agent {agent.id} does not have "
                                 f"({err})")]
    except StateTypeError as err:  # names the field
        return [("state_fields", f"its saved state cannot be kept: {err}")]
    except (PydanticSerializationError, TypeError, ValueError) as err:
        return [("state_fields", f"agent {agent.id}'s saved state ({', '.join(cls.state_fields)}) cannot be "
                                 f"stored as JSON: {err}")]
    live, back = attributes(agent), attributes(fresh)
    out = []
    for name in sorted(set(live) | set(back)):
        if name in cls.transient_fields:
            continue
        now, then = live.get(name, _MISSING), back.get(name, _MISSING)
        if same(now, then):
            continue
        if name in cls.state_fields:
            out.append((name, f"{name!r} is saved, but comes back from its checkpoint as {_short(then)} instead of "
                              f"{_short(now)} (see populace.sdk.statejson for what a state field may hold)"))
        else:
            out.append((name, f"{name!r} changed ({_short(then)} when built, {_short(now)} now) but is not saved"))
    return out


def sample(agents: Sequence[Agent], size: int | None) -> Sequence[Agent]:
    """Up to `size` agents spread evenly over `agents` (None: all of them)."""
    n = len(agents)
    if size is None or n <= size:
        return agents
    return [agents[i * n // size] for i in range(size)]


def check_agents(agents: Sequence[Agent], *, size: int | None = DEFAULT_SAMPLE, when: str = "") -> None:
    """Raise UnsavedState naming each attribute (and the first agent it was seen on) that a
    checkpoint of these agents would lose. Agents in their own processes are not visible here
    and are skipped."""
    found: dict[str, tuple[Agent, str]] = {}
    for agent in sample(agents, size):
        if not isinstance(agent, Agent):
            continue  # departed, or a newcomer not made yet (populace.sdk.population)
        if isinstance(agent, ProcessAgent):
            return
        for name, text in problems(agent):
            found.setdefault(name, (agent, text))
    if not found:
        return
    first = next(iter(found.values()))[0]
    cls = type(first)
    details = "; ".join(f"agent {a.id}: {text}" for a, text in found.values())
    unsaved = [n for n in found if n not in cls.state_fields and n != "state_fields"]
    fix = (f"add it to {cls.__name__}.state_fields (state_fields = {tuple(unsaved)!r}; memory is always saved), "
           "or to transient_fields if the agent rebuilds it from its saved state") if unsaved else \
        "keep the saved state to what a checkpoint keeps (numbers, text, booleans, None, and lists, tuples, dicts, " \
        "sets, frozensets, deques and Fractions of them)"
    sim = getattr(first.sim, "name", "") or cls.__module__
    raise UnsavedState(f"simulation {sim!r}: a resume or fork of this run would not continue it exactly"
                       f"{' ' + when if when else ''} — {details}. Fix: {fix}.")


class StateCheck:
    """An LLM-port factory for `run_local` that checks, before each round from the second and
    once more at the end (`finish`), a sample of every share's agents: the factory is the one
    per-round call the local runner makes with a share's agents."""

    def __init__(self, factory: Callable[[HostedRun, int], LLM], *, size: int | None = DEFAULT_SAMPLE) -> None:
        self.factory = factory
        self.size = size
        self.runs: dict[int, HostedRun] = {}
        self.last_round = 0

    def __call__(self, run: HostedRun, round_: int) -> LLM:
        self.runs[id(run)] = run
        if round_ > 1:
            check_agents(run.agents, size=self.size, when=f"after round {round_ - 1}")
        self.last_round = max(self.last_round, round_)
        return self.factory(run, round_)

    def finish(self) -> None:
        for run in self.runs.values():
            check_agents(run.agents, size=self.size, when=f"after round {self.last_round}")


__all__ = ["DEFAULT_SAMPLE", "StateCheck", "UnsavedState", "attributes", "check_agents", "checkpointed",
           "problems", "restored", "same"]
