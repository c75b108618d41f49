"""A panel written against last month's SDK (issue 37): agents state an opinion each round, keep
their opinions as a tuple of (topic, stance) pairs and remember (round, (topic, stance)); the
scenario interviews them after every round. Their `context()` (what an interview's prompt says
they know) writes those tuples as they are, so a tuple back as a list changes the answers."""

from __future__ import annotations

from populace.sdk import LLM, Agent, Env, Outcome, Partial, Simulation, State, Summary, answer_field

TOPICS = ("parks", "roads", "taxes")


class Stance(Outcome):
    measure = "stance"
    stance: int | None = None
    topic: str = ""


class Sum(Partial):
    total: int = 0
    n: int = 0


class Mood(Summary):
    mean_stance: float | None = None


class Citizen(Agent):
    __slots__ = ("opinions",)
    state_fields = ("opinions",)

    def __init__(self, agent_id, persona=None, sim=None) -> None:
        super().__init__(agent_id, persona, sim)
        self.opinions: tuple[tuple[str, int], ...] = ()

    def context(self) -> str:
        return f"opinions {self.opinions!r}; memory {self.memory!r}"

    async def turn(self, obs, llm: LLM) -> Stance:
        topic = TOPICS[(self.id + obs.round) % len(TOPICS)]
        raw = await llm.ask(f"{self.context()}: your stance on {topic}?", key=self.id)
        stance = answer_field(raw, "stance")
        if not isinstance(stance, int):
            return Stance(topic=topic, raw=raw, valid=False)
        self.opinions = (*[o for o in self.opinions if o[0] != topic], (topic, stance))
        self.remember((obs.round, (topic, stance)))
        return Stance(stance=stance, topic=topic, raw=raw)


class PanelEnv(Env[State, Sum]):
    Partial = Sum

    def reduce(self, agent_ids, outcomes) -> Sum:
        valid = [o.stance for o in outcomes if o.valid]
        return Sum(total=sum(valid), n=len(valid))

    def merge(self, partials) -> Sum:
        return Sum(total=sum(p.total for p in partials), n=sum(p.n for p in partials))

    def decide(self, state, round, total):
        return state, Mood(mean_stance=total.total / total.n if total.n else None)


class Panel(Simulation):
    name = "compat-panel"
    Agent = Citizen
    Env = PanelEnv
    Outcome = Stance
    Summary = Mood

    def answer_schema(self) -> dict:
        return {"type": "object", "properties": {"stance": {"type": "integer", "minimum": -2, "maximum": 2}},
                "required": ["stance"]}


INTERVIEWS = [{"id": "panel", "after": "every", "sample": 0.5,
               "questions": [{"id": "trust", "text": "How much do you trust the council?",
                              "labels": ["none", "some", "a lot"]}]}]
