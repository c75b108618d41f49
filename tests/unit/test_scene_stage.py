"""`scene.all`: a stage whose acts are simultaneous, driven by the platform without a task per
act. Its acts start together (one model latency per stage), come back in the members' order,
are recorded exactly as `member.act` records them (seq, tags of their model calls, errors), and
every rule, failure and cancellation is handled as for acts in tasks of their own."""

from __future__ import annotations

import asyncio

import pytest

from populace.core.contracts import MAX_ACTS_PER_MEMBER, RunConfig
from populace.sdk import (
    Agent,
    DummyLLM,
    Env,
    GroupEnv,
    InferError,
    ModelUnavailable,
    Outcome,
    Partial,
    Simulation,
    State,
    Summary,
)
from populace.sdk.llm import call_tag
from populace.sdk.local import run_local
from populace.sdk.play import SceneFailed
from populace.sdk.scene import PLAYING, Member, Scene

HERE = __name__
NUMBER = {"type": "integer", "minimum": 0, "maximum": 999}


class Said(Outcome):
    value: int | None = None
    measure = "value"


class Count(Partial):
    n: int = 0


class Nothing(Summary):
    played: int = 0


class Counting(Env[State, Count]):
    Partial = Count

    def reduce(self, agent_ids, outcomes):
        return Count(n=len(outcomes))

    def merge(self, partials):
        return Count(n=sum(p.n for p in partials))

    def decide(self, state, round, total):
        return state, Nothing(played=total.n)


class Speaker(Agent):
    __slots__ = ()

    async def act(self, phase, view, llm):
        mode = self.sim.mode
        if mode == "bug" and self.id % 3 == 1:
            raise ValueError("my bug")
        if mode == "yields":
            await asyncio.sleep(0)  # a bare yield: resumed on the loop's next turn
        if mode == "odd-await" and self.id % 3 == 2:
            await Odd()
        if mode == "no-task":
            assert asyncio.current_task() is None  # documented: a stage's acts run without a task
        raw = await llm.ask(f"{phase} {view}", key=self.id, schema=NUMBER)
        if mode.startswith("behalf"):  # a call on another member's behalf, and a second call of its own
            await llm.ask("for you", key=view, schema=NUMBER)
            raw = await llm.ask(f"again {view}", key=self.id, schema=NUMBER)
        return Said(value=int(raw), raw=raw)


class Odd:
    def __await__(self):
        yield "not a future"


class Stage(GroupEnv):
    async def scene(self, scene: Scene):
        mode = self.sim.mode
        members = scene.members
        views = [m.id * 10 for m in members]
        if mode.startswith("behalf"):
            views = [members[(i + 1) % len(members)].id for i in range(len(members))]
        if mode == "short":
            views = views[:-1]
        if mode == "twice":
            await scene.all("speak", views + [0], members=[*members, members[0]])
        if mode == "phase":
            await scene.all(7, views)
        if mode == "busy":  # every act a round allows, in stages: the next stage is one too many
            for _ in range(MAX_ACTS_PER_MEMBER):
                await scene.all("speak", views)
        if mode.endswith("sequential"):  # the same acts, one after another, each in the scene's task
            acts = [await m.act("speak", v) for m, v in zip(members, views)]
        else:
            acts = await scene.all("speak", views)
        for m, a in zip(members, acts):
            scene.outcome(m, Said(value=a.value, raw=a.raw, valid=a.valid))


class Stages(Simulation):
    name = "stages"
    Agent = Speaker
    Env = Counting
    GroupEnv = Stage
    Act = Said
    Outcome = Said
    Summary = Nothing
    mode = "all"

    def group_size(self):
        return 3


def stages(mode: str) -> str:
    cls = type(f"Stages_{mode}", (Stages,), {"mode": mode, "__module__": HERE})
    globals()[cls.__name__] = cls
    return f"{HERE}:{cls.__name__}"


def rows(columns: dict[str, list]) -> list[dict]:
    return [{k: v for k, v in zip(columns, values) if k != "latency_ms"} for values in zip(*columns.values())]


def play(mode: str, agents: int = 7, **kw):
    return asyncio.run(run_local(RunConfig(simulation=stages(mode), agents=agents, rounds=2, seed=3), **kw))


@pytest.mark.parametrize("mode", ["all", "behalf"])
def test_a_stage_records_exactly_what_acts_one_after_another_record(mode):
    """Same acts, seqs in the members' order, same model draws (each call tagged as its member's own,
    a call on another's behalf too), same outcomes: on one process, on several, and with every agent
    in its own process."""
    together = play(mode)
    others = [play(f"{mode}-sequential"), play(mode, hosts=3)]
    if mode == "all":  # each agent in its own OS process, its calls relayed through the stage's steps
        others.append(play(mode, hosts=2, one_per_process=True))
    for other in others:
        assert rows(together.acts) == rows(other.acts) and rows(together.outcomes) == rows(other.outcomes)
    first = [a for a in rows(together.acts) if a["round"] == 1 and a["group_id"] == 0]
    assert [a["seq"] for a in first] == [0, 1, 2] and all(a["valid"] and a["error"] is None for a in first)
    assert len({a["value"] for a in rows(together.acts)}) > 3  # each member's draws its own


def test_a_stage_asks_every_member_before_any_answer():
    asked: list[int] = []

    class Gate:
        """Answers nothing until the whole stage (3 members) asked."""

        def __init__(self):
            self.waiting: list[tuple[asyncio.Future, int]] = []
            self.seqs: dict = {}

        def ask(self, prompt, *, key, prefix_chars=0, system=None, schema=None):
            asked.append(key)
            call_tag(self.seqs, key)
            fut = asyncio.get_running_loop().create_future()
            self.waiting.append((fut, key))
            if len(self.waiting) == 3:
                for f, k in self.waiting:
                    f.set_result(str(k))
                self.waiting = []
            return fut

    res = asyncio.run(run_local(RunConfig(simulation=stages("all"), agents=3, rounds=1), llm=lambda run, n: Gate()))
    assert sorted(asked) == [0, 1, 2] and res.outcomes["value"] == [0, 1, 2]


def test_an_acts_bug_and_an_odd_await_are_that_acts_errors_and_the_stage_goes_on():
    res = play("bug", agents=3)
    errors = {a["agent_id"]: a["error"] for a in rows(res.acts)}
    assert errors == {0: None, 1: "agent: ValueError: my bug", 2: None}
    odd = play("odd-await", agents=3)
    bad = [a for a in rows(odd.acts) if a["error"]]
    assert {a["agent_id"] for a in bad} == {2} and all(not a["valid"] for a in bad)
    assert bad[0]["error"] == "agent: RuntimeError: an act awaited 'not a future', which is not an asyncio future"
    for mode in ("yields", "no-task"):  # a bare yield is resumed; no act sees a task of its own
        assert all(a["valid"] for a in rows(play(mode, agents=3).acts))


def test_no_model_answering_one_act_stops_the_round_and_leaves_no_act_running():
    def outage(run, n):
        class Down(DummyLLM):
            async def ask(self, prompt, *, key, **kw):
                if key == 4:
                    raise InferError("no replica")
                await asyncio.sleep(0.01)
                return await super().ask(prompt, key=key, **kw)
        return Down(seed=0, round_=n, schema=NUMBER)

    with pytest.raises(ModelUnavailable, match="no replica"):
        play("all", llm=outage)


@pytest.mark.parametrize("mode, message", [
    ("short", r"all\('speak'\) got 2 views for 3 members"),
    ("twice", r"agent \d+ was asked to act while its previous act was still running"),
    ("phase", r"an act's phase is a string, not int"),
    ("busy", r"more than 100 acts per member \(3\) in a round"),
])
def test_a_stage_that_breaks_a_rule_fails_the_round_naming_it(mode, message):
    with pytest.raises(SceneFailed, match=rf"simulation 'stages', round 1, group \d+: .*{message}"):
        play(mode, agents=3)


def test_a_scene_cancelled_mid_stage_cancels_its_acts():
    class Never:
        def __init__(self):
            self.futures: list[asyncio.Future] = []

        def ask(self, prompt, *, key, **kw):
            self.futures.append(asyncio.get_running_loop().create_future())
            return self.futures[-1]

    async def main():
        port = Never()
        scene = Scene(1, 0, Stages(Stages.Params(), agents=3), port, Said, lambda err: (Said(valid=False), str(err)))
        scene.members = tuple(Member(Speaker(i, None, scene.sim), scene) for i in range(3))

        async def run_scene():
            PLAYING.set(scene)
            await scene.all("speak", [1, 2, 3])

        task = asyncio.create_task(run_scene())
        for _ in range(3):
            await asyncio.sleep(0)
        assert len(port.futures) == 3 and scene.in_flight == 3
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(3):
            await asyncio.sleep(0)
        assert all(f.cancelled() for f in port.futures)
        assert scene.in_flight == 0 and not any(m._busy for m in scene.members) and scene.acts == []

    asyncio.run(main())


class HeldGate:
    """A slicer's gate (populace.sdk.slicing) that holds its first entry until `release`."""

    def __init__(self):
        self.entries = 0
        self.release: asyncio.Future | None = None

    def __call__(self):
        self.entries += 1
        if self.entries != 1:
            return None
        self.release = asyncio.get_running_loop().create_future()
        return self._wait(self.release)

    @staticmethod
    async def _wait(fut):
        await fut


class Asked:
    def __init__(self):
        self.futures: dict[int, asyncio.Future] = {}

    def ask(self, prompt, *, key, **kw):
        self.futures[key] = asyncio.get_running_loop().create_future()
        return self.futures[key]


def gated_scene(port, gate):
    scene = Scene(1, 0, Stages(Stages.Params(), agents=3), port, Said, lambda err: (Said(valid=False), str(err)),
                  gate=gate)
    scene.members = tuple(Member(Speaker(i, None, scene.sim), scene) for i in range(3))
    return scene


async def turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_a_stage_passes_the_loops_gate_as_one_entry_before_its_acts_start():
    """A stage held at the gate (author code held the loop a slice) starts its acts once the gate
    lets it through, all at once; its acts and seqs are as without the gate."""
    async def main():
        port, gate = Asked(), HeldGate()
        scene = gated_scene(port, gate)

        async def run_scene():
            PLAYING.set(scene)
            return await scene.all("speak", [1, 2, 3])

        task = asyncio.create_task(run_scene())
        await turns()
        assert port.futures == {} and gate.entries == 1 and scene.in_flight == 3  # held: no act started
        gate.release.set_result(None)
        await turns()
        assert list(port.futures) == [0, 1, 2] and gate.entries == 1
        for key, fut in port.futures.items():
            fut.set_result(str(key))
        acts = await task
        assert [a.value for a in acts] == [0, 1, 2]
        assert [(a[1], a[2]) for a in sorted(scene.acts)] == [(0, 0), (1, 1), (2, 2)] and scene.in_flight == 0

    asyncio.run(main())


def test_a_scene_cancelled_while_its_stage_waits_at_the_gate_cancels_its_acts():
    async def main():
        port, gate = Asked(), HeldGate()
        scene = gated_scene(port, gate)

        async def run_scene():
            PLAYING.set(scene)
            await scene.all("speak", [1, 2, 3])

        task = asyncio.create_task(run_scene())
        await turns()
        assert port.futures == {}
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await turns()
        assert port.futures == {} and gate.release.cancelled()  # no act ever asked
        assert scene.in_flight == 0 and not any(m._busy for m in scene.members) and scene.acts == []

    asyncio.run(main())
