"""The agent: a small object (an id, a persona by reference, the run's simulation by
reference, a bounded memory) whose turn takes the round's observation and the LLM port and
returns an outcome. Hosts keep a million of these in one process, so a subclass that keeps
more state should declare it in `__slots__` (and in `state_fields`, so a checkpoint saves it).
The same class runs many agents per process or one per process: only the LLM port differs.

A checkpoint always saves `memory` (the platform's), plus what `state_fields` lists: a class
that writes `state_fields = ("score",)` saves `("memory", "score")`. An attribute a turn
changes that neither lists is lost by a resume or fork; `populace run --local`,
`simulate(local=True)` and `populace.sdk.testing.check_resume` refuse such an agent, naming
the attribute (populace.sdk.statecheck)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from populace.sdk.statejson import DEEP_MEMORY, PLAIN

if TYPE_CHECKING:
    from populace.core.contracts import Question, Survey
    from populace.population.cast import Persona
    from populace.sdk.llm import LLM
    from populace.sdk.outcome import Outcome
    from populace.sdk.simulation import Observation, Simulation


class Agent:
    __slots__ = ("id", "memory", "persona", "sim")

    memory_size: ClassVar[int] = 5  # items `remember` keeps (the oldest go first)
    # What a checkpoint saves: `memory` always, then the attributes a subclass lists here (its
    # own list is added to `memory`, never instead of it; listing "memory" again is harmless).
    state_fields: ClassVar[tuple[str, ...]] = ("memory",)
    # Attributes a turn may change that a resume need not keep, because the agent rebuilds them
    # from its saved state (a cache): the state check (populace.sdk.statecheck) skips them.
    transient_fields: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declared = cls.__dict__.get("state_fields")
        # A list of names is added to `memory`: a subclass that wrote ("score",) used to replace
        # it, and every resumed run then played from agents with no memory. Anything else (a bare
        # string such as ("score") is the usual slip) is left for Simulation.check to name.
        if isinstance(declared, (tuple, list)) and all(isinstance(n, str) for n in declared):
            cls.state_fields = tuple(dict.fromkeys(("memory", *declared)))

    def __init__(self, agent_id: int, persona: Persona | None = None, sim: Simulation | None = None) -> None:
        self.id = agent_id
        self.persona = persona  # shared by reference, never a per-agent copy (None: no population)
        self.sim = sim  # the run: its params, prompts and population, shared by every agent
        self.memory: tuple = ()

    def remember(self, item: Any) -> None:
        size = self.memory_size
        if size <= 0:
            return
        # an item deeper than a checkpoint's memory rule keeps (populace.sdk.statejson): this class's
        # memories are saved typed from then on (~70 ns a call: a loop, not a set, for a short tuple)
        kind = type(item)
        if kind is tuple:
            for x in item:
                if type(x) not in PLAIN:
                    DEEP_MEMORY.add(type(self))
                    break
        elif kind not in PLAIN:
            DEEP_MEMORY.add(type(self))
        mem = self.memory + (item,)
        self.memory = mem[-size:] if len(mem) > size else mem

    async def turn(self, obs: Observation, llm: LLM) -> Outcome:  # pragma: no cover - abstract
        """Play one round: read `obs`, ask the model (`await llm.ask(prompt, key=self.id)`),
        return this agent's outcome. An exception here is recorded as this agent's invalid
        outcome with the error's text; the host goes on."""
        raise NotImplementedError

    async def act(self, phase: str, view: Any, llm: LLM) -> Outcome:  # pragma: no cover - scenes only
        """One act in a scene (a simulation whose group env plays scenes): `phase` names what
        the scene asks (e.g. "offer"), `view` is what the scene shows this agent. Returns the
        simulation's `Act` outcome; an exception is this act's invalid outcome, as in a turn."""
        raise NotImplementedError(f"{type(self).__name__} has no act(); a scene asked it to act {phase!r}")

    def wakes(self, obs: Observation) -> bool:
        """Whether this agent acts this round, among those the environment selected (activation
        decided by the agent itself, e.g. from its memory). Everyone by default; pure and seeded
        (use `self.sim.rng(...)`), so every placement decides the same.

        Two forms, told apart by how many arguments the override takes:
        - `wakes(self, obs)`: `obs` is the round's shared observation (`Env.observe`);
        - `wakes(self, obs, view)`: the same, and `view` is this agent's own view of the round's
          world (`Env.view(world, round, agent_id)`, exactly what its turn would get; None when
          the environment gives no view). The view is made again for the turn: keep it cheap."""
        return True

    def settled(self, outcome: Outcome, news: Any) -> None:
        """Called after the agent's group env settled the round: `outcome` is this agent's own,
        with what the group env filled in (e.g. a payoff), `news` what the group env announced
        to its members. Nothing by default."""

    def context(self) -> str:
        """What this agent knows, as text for an interview's prompt: its memory, one item a line
        (override it to say it in your simulation's words)."""
        from populace.sdk.interview import memory_text

        return memory_text(self.memory)

    async def answer(self, asked: Question | Survey, llm: LLM) -> str:
        """Answer an interview (`populace.sdk.interview`): one question, or a survey's questions
        together. Runs on a copy of the agent (its state at a round's end): nothing it does here
        is remembered. Returns the model's raw text; the platform parses it against the
        question's kind. The default asks once, in a structured call: the agent's persona, its
        `context()` and the question, under the question's schema."""
        from populace.sdk import interview

        return await interview.default_call(self, asked, llm)

    def state(self) -> dict[str, Any]:
        """The agent's declared state, for a checkpoint."""
        return {name: getattr(self, name) for name in self.state_fields}

    def restore(self, state: dict[str, Any]) -> None:
        """Set the declared state from a checkpoint: each field as it was saved (the platform
        rebuilds tuples, sets and the like first: populace.sdk.statejson). A memory given as a
        JSON list still comes back as `remember` keeps it (tuples)."""
        for name in self.state_fields:
            if name in state:
                value = state[name]
                if name == "memory" and (value is None or type(value) is list):
                    value = tuple(tuple(v) if type(v) is list else v for v in value or ())
                setattr(self, name, value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.id})"


def wakes_with_view(cls: type[Agent]) -> bool:
    """Whether an Agent class's `wakes` takes the agent's view too: `wakes(self, obs, view)`."""
    from populace.sdk.select import takes

    return takes(cls.wakes, 2)
