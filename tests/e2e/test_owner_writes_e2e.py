"""Issue 41, attacks 3-6, on real processes with users on: one NATS user per service and per host
(deploy/nats/auth.conf, populace.core.hostauth). One bargaining run (scenes with acts and lines) on
host-0 and host-1 is attacked while it plays, and a post-hoc interview of it once it is recorded:
- host-9, a fleet member placed in no run, stores a 24 MB object under its partial's name and names
  it in 4 partial messages (one 80 MB object grew the environment from 145 to 1,394 MB and made a
  concurrent run 22× slower): refused before any read, the environment grows ≤ 50 MB, the run
  completes exactly;
- host-1, placed in the run, writes into host-0's scenes: its own agent claiming a group of
  host-0's, with acts and the scene's lines (speaker -1) there; a batch with no agents carrying
  acts and lines of host-0's group; a group of its own with more lines than its members may say.
  Every forged group is refused, the run completes with exactly the rows one process records
  (no forged act or line in DuckDB), and a forged batch after the run was recorded is refused;
- host-1, ordered to answer part of a post-hoc interview, first sends a batch with no answers and
  other questions under the interview's survey id (0 of 2,000 answers were kept), answers for
  its own agents after another round than asked (kept: 3,000 rows for a 2,000-answer request),
  and answers for host-0's agents: each is refused against the order, and the interview
  completes with exactly the answers one process gives.
The module mostly waits (the dummy model's latency, the recorder's fetches)."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import nats
import psutil
import pytest
from locked_reads import read_recorded
from test_shapes_e2e import assert_as_in_one_process
from test_state_integrity_e2e import dead_letters, refused_on

from populace.client.interviews import ask
from populace.client.prepare import prepare
from populace.client.run import new_run_id, play, run_state
from populace.client.stack import Stack
from populace.core import bus, checkpoints, subjects
from populace.core.contracts import (
    ActColumns,
    InterviewBatch,
    InterviewPlaced,
    LineColumns,
    OutcomeBatch,
    PartialRef,
    Question,
    RoundOpen,
    RoundPartial,
    RunConfig,
    Survey,
)
from populace.core.hostauth import with_hosts
from populace.sdk.local import LocalResult, interview_local, run_local

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
USERS = ("orchestrator", "environment", "gateway", "recorder", "agent-host", "replicas", "node", "cli", "manager",
         "admin")
HOSTS = ("host-0", "host-1", "host-9")  # host-9: credentials only, no process: placed in no run
AGENTS, ROUNDS, BLOCK = 160, 2, 40
CONFIG = {"simulation": "bargaining", "agents": AGENTS, "rounds": ROUNDS, "seed": 3,
          "model": {"latency_s": 0.3, "seed": 6}, "game": {"block": BLOCK, "turns": 4}}
BOMB_BYTES = 24 * 2**20
BOMB_PARTIALS = 4
SURVEY = Survey(id="after", questions=[
    Question(id="fair", text="Was the split fair?", options=["yes", "no"]),
    Question(id="trust", text="How much do you trust the other player?", points=5)])


@pytest.fixture(scope="module")
def stack(tmp_path_factory, stacks):
    """Each service and host connects as its own NATS user though they share one process (the
    server enforces what a user may do per connection); the environment, whose RSS the bomb
    test measures, keeps a process of its own."""
    tmp = tmp_path_factory.mktemp("owner-writes")
    users = {u: f"owners-{u}-{os.getpid()}" for u in (*USERS, *HOSTS)}
    defs = "".join(f'{u.upper().replace("-", "_")}_PASSWORD: "{users[u]}"\n' for u in USERS)
    conf = tmp / "auth.conf"
    conf.write_text(defs + with_hosts((ROOT / "deploy" / "nats" / "auth.conf").read_text(),
                                      {h: users[h] for h in HOSTS}))
    return stacks(hosts=2, db=str(tmp / "populace.duckdb"), users=users, nats_args=["-c", str(conf)],
                  env={"POPULACE_STORAGE": "memory"}, one_process=True, apart=("environment",), timeout=120)


def rss(stack: Stack, key: str) -> int:
    return psutil.Process(stack.procs[key].pid).memory_info().rss


def pick(cols: dict[str, list], rows: list[int], keys) -> dict[str, list]:
    return {k: [cols[k][i] for i in rows] for k in keys}


def forged_batches(rid: str, n: int, local: LocalResult, mine: tuple[int, int], theirs: tuple[int, int]
                   ) -> list[OutcomeBatch]:
    """What host-1 sends about round `n` before its own batches: (a) its first agent's outcome in a
    group of host-0's, with an act and two of the scene's lines there; (b) no agent at all, with an
    act of host-0's agent and a scene line in that group; (c) its agent in its own group, with one
    line more than one member may say in a round."""
    o, a = local.outcomes, local.acts
    me = mine[0]
    row = next(i for i, (r, x) in enumerate(zip(o["round"], o["agent_id"])) if r == n and x == me)
    own_group = o["group_id"][row]
    foreign = theirs[0] // BLOCK * (BLOCK // 2)  # a pair of host-0's first block
    act = pick(a, [0], ["seq", "phase", "valid", "raw", "latency_ms", "error"])
    act_cols = pick(a, [0], ["say", "propose", "accept"])

    def outcome(group: int, acts: list[tuple[int, int]], lines: list[int]) -> OutcomeBatch:
        k, m = len(acts), len(lines)
        return OutcomeBatch(
            run_id=rid, round=n, host_id="host-1", seq=10_000 + len(lines), agent_ids=[me],
            columns=pick(o, [row], ["role", "partner", "deal", "share", "turns"]),
            valid=[o["valid"][row]], raws=[o["raw"][row]], latency_ms=[o["latency_ms"][row]], errors=[o["error"][row]],
            group_ids=[group],
            acts=ActColumns(group_id=[g for g, _ in acts], agent_id=[x for _, x in acts],
                            **{key: v * k for key, v in act.items()}, columns={c: v * k for c, v in act_cols.items()})
            if acts else None,
            lines=LineColumns(group_id=lines, seq=list(range(m)), speaker=[-1] * m, text=["forged"] * m,
                              fields=[None] * m))

    foreign_claim = outcome(foreign, [(foreign, me)], [foreign, foreign])
    empty = OutcomeBatch(
        run_id=rid, round=n, host_id="host-1", seq=20_000, agent_ids=[], columns={c: [] for c in
                                                                                   ("role", "partner", "deal",
                                                                                    "share", "turns")},
        valid=[], raws=[], latency_ms=[], errors=[], group_ids=[],
        acts=ActColumns(group_id=[foreign], agent_id=[theirs[0]], **act, columns=act_cols),
        lines=LineColumns(group_id=[foreign], seq=[0], speaker=[-1], text=["forged"], fields=[None]))
    chatty = outcome(own_group, [], [own_group] * 101)
    return [foreign_claim, empty, chatty]


@pytest.fixture(scope="module")
def attacked(stack):
    """The run, played while host-9 bombs the environment's partials and host-1 forges scenes;
    with the environment's RSS before the bomb and once its partials were refused."""
    prepared = prepare(RunConfig.model_validate(CONFIG))
    local = asyncio.run(run_local(prepared.resolved))
    rid = new_run_id()
    seen: dict = {"forged": 0}

    async def go():
        nc = await nats.connect(stack.url, **stack.credentials("cli"))
        evil = await nats.connect(stack.url, **stack.credentials("host-1"))
        bomber = await nats.connect(stack.url, **stack.credentials("host-9"))
        before_dlq = len(await dead_letters(stack))
        queue: asyncio.Queue = asyncio.Queue()

        async def attack() -> None:
            while (n := await queue.get()) is not None:
                if n not in ("placed", 1):
                    continue  # nothing to send as a later round opens
                state = await run_state(nc, rid)
                # past spawning: its hosts spawned (the recorder has its placement); as a rule its
                # first round opening, none of its outcomes played yet (the model takes 0.3 s an
                # act, a scene several acts). On a loaded machine the run may be over by then:
                # waiting for "running" would wait forever
                while state is None or state.status == "spawning":
                    await asyncio.sleep(0.01)
                    state = await run_state(nc, rid)
                ranges = {sh.host_id: sh.ranges[0] for sh in state.shares}
                if n == "placed":
                    # every round's forgeries as round 1 opens: none can come after host-1's own
                    # batches (which would refuse them whole, as duplicates, not group by group)
                    for r in range(1, ROUNDS + 1):
                        for b in forged_batches(rid, r, local, ranges["host-1"], ranges["host-0"]):
                            await bus.publish_js(evil.jetstream(), subjects.run_outcomes(rid, r, "host-1"), b,
                                                 msg_id=f"forged-{uuid.uuid4().hex}")
                            seen["forged"] += 1
                elif n == 1:  # the bomb: stored under host-9's own token, named by 4 partials
                    seen["rss_before"] = rss(stack, "environment")
                    name = subjects.checkpoint_partial(rid, 1, "host-9@0")
                    data = b"[" + b"0," * (BOMB_BYTES // 2) + b"0]"
                    digest = await checkpoints.put_bytes(bomber.jetstream(), name, data, writer="host-9")
                    ref = PartialRef(ref=name, sha256=digest, size=len(data)).model_dump()
                    seen["bomb"] = RoundPartial(run_id=rid, round=1, host_id="host-9", n=80, n_valid=80, payload=ref)
                    for k in range(BOMB_PARTIALS):
                        await bus.publish_js(bomber.jetstream(), subjects.run_partial(rid, 1, "host-9", 0),
                                             seen["bomb"], msg_id=f"bomb-{rid}-{k}")

        queue.put_nowait("placed")

        def on_event(kind, model) -> None:
            if isinstance(model, RoundOpen) and model.nudge == 0:
                queue.put_nowait(model.round)

        attacking = asyncio.create_task(attack())
        try:
            out = await asyncio.wait_for(play(nc, prepared.config, run_id=rid, manifest=prepared.manifest,
                                              on_event=on_event, stall_s=180), 240)
            queue.put_nowait(None)
            await attacking
            # once more after the run: its round 1 long decided, the bomb is still a host's the
            # run never placed (not a straggler to drop quietly), so it is refused as well
            await bus.publish_js(bomber.jetstream(), subjects.run_partial(rid, 1, "host-9", 0), seen["bomb"],
                                 msg_id=f"bomb-{rid}-late")
            return out, before_dlq
        finally:
            attacking.cancel()
            for c in (bomber, evil, nc):
                await c.close()

    out, before = asyncio.run(go())
    bombs = refused_on(stack, before, subjects.run_partial(rid, 1, "host-9", 0), BOMB_PARTIALS + 1)
    seen["rss_after"] = rss(stack, "environment")
    return {"out": out, "local": local, "rid": rid, "bombs": bombs, "dlq_before": before, **seen}


def test_a_partial_bomb_from_a_host_in_no_run_is_refused_before_it_is_read(stack, attacked):
    assert attacked["out"].status == "completed", attacked["out"].reason
    assert len(attacked["bombs"]) == BOMB_PARTIALS + 1  # during round 1, and one after the run
    assert all(d[0].startswith("environment.") and "share host-9@0 was never placed in run" in d[2]
               for d in attacked["bombs"]), attacked["bombs"]
    grew = attacked["rss_after"] - attacked["rss_before"]
    assert grew <= 50 * 2**20, f"the environment grew by {grew / 2**20:.0f} MB"


def test_foreign_transcript_lines_and_acts_are_refused_and_the_run_is_exact(stack, attacked):
    out, local, rid = attacked["out"], attacked["local"], attacked["rid"]
    assert out.status == "completed", out.reason
    assert attacked["forged"] == 3 * ROUNDS
    rec = out.recorded
    assert (rec.status, rec.outcomes, rec.acts_missing, rec.lines_missing) == ("completed", AGENTS * ROUNDS, 0, 0)
    assert_as_in_one_process(stack.db, rid, local)  # every outcome, act and line as one process plays them
    # the attacker's late batches may still reach the recorder, which holds the file to refuse them
    refused, forged_lines = read_recorded(stack.db, lambda con: (
        con.execute("SELECT round, share, group_id, agents, acts, lines, reason FROM _refused_groups "
                    "WHERE run_id = ? ORDER BY round, reason", [rid]).fetchall(),
        con.execute("SELECT count(*) FROM transcripts WHERE run_id = ? AND text = 'forged'", [rid]).fetchone()[0]))
    assert forged_lines == 0
    assert len(refused) == 3 * ROUNDS and {r[1] for r in refused} == {"host-1@0"}
    for n in range(1, ROUNDS + 1):
        reasons = [r[6] for r in refused if r[0] == n]
        assert any("group_ids: agent" in why and "cannot be in group" in why for why in reasons), reasons
        assert any(why.startswith("acts.agent_id: agent") and "has no outcome in this batch" in why
                   for why in reasons), reasons
        assert any(why.startswith("lines.group_id:") and "has 101 lines in round" in why for why in reasons), reasons

    # after the run was recorded: a forged batch of the same kind is refused whole
    async def late():
        nc = await nats.connect(stack.url, **stack.credentials("cli"))
        evil = await nats.connect(stack.url, **stack.credentials("host-1"))
        try:
            state = await run_state(nc, rid)
            ranges = {sh.host_id: sh.ranges[0] for sh in state.shares}
            batch = forged_batches(rid, ROUNDS, local, ranges["host-1"], ranges["host-0"])[2]
            await bus.publish_js(evil.jetstream(), subjects.run_outcomes(rid, ROUNDS, "host-1"), batch,
                                 msg_id=f"late-{uuid.uuid4().hex}")
        finally:
            await evil.close()
            await nc.close()

    before = len(asyncio.run(dead_letters(stack)))
    asyncio.run(late())
    (dead,) = refused_on(stack, before, subjects.run_outcomes(rid, ROUNDS, "host-1"), 1)
    assert dead[0].startswith("recorder.") and "already has an outcome in round 2" in dead[2], dead
    assert_as_in_one_process(stack.db, rid, local)


def test_a_post_hoc_interview_completes_with_exactly_its_answers_under_forged_batches(stack, attacked):
    rid, local = attacked["rid"], attacked["local"]
    request = f"iv-{uuid.uuid4().hex[:8]}"
    expected = asyncio.run(interview_local(local, 2, SURVEY))
    earlier = asyncio.run(interview_local(local, 1, SURVEY))
    sent: list[str] = []

    def rows_of(answers: dict[str, list], agents: set[int]) -> list[int]:
        return [i for i, a in enumerate(answers["agent_id"]) if a in agents]

    def batch(answers: dict[str, list], rows: list[int], after: int, survey: Survey = SURVEY) -> InterviewBatch:
        col = pick(answers, rows, ("agent_id", "question", "answer", "value", "raw", "valid", "error"))
        return InterviewBatch(run_id=rid, after_round=after, host_id="host-1", seq=90_000 + len(sent), survey=survey,
                              request=request, agent_ids=col["agent_id"], questions=col["question"],
                              answers=col["answer"], values=col["value"], raws=col["raw"], valid=col["valid"],
                              errors=col["error"], latency_ms=[1.0] * len(rows))

    async def go():
        nc = await nats.connect(stack.url, **stack.credentials("cli"))
        evil = await nats.connect(stack.url, **stack.credentials("host-1"))
        attacked_once = asyncio.Event()

        async def on_placed(msg) -> None:
            placed = InterviewPlaced.model_validate_json(msg.data)
            if attacked_once.is_set() or placed.error:
                return
            attacked_once.set()
            own = {a for f, c in placed.hosts["host-1"] for a in range(f, f + c)}
            others = {a for f, c in placed.hosts["host-0"] for a in range(f, f + c)}
            swap = Survey(id=SURVEY.id, questions=[Question(id="other", text="Something else?", options=["x", "y"])])
            js = evil.jetstream()
            for after, b in ((2, batch(expected, [], 2, swap)),
                             (1, batch(earlier, rows_of(earlier, own), 1)),
                             (2, batch(expected, rows_of(expected, others), 2))):
                await bus.publish_js(js, subjects.run_interviews(rid, after, "host-1"), b,
                                     msg_id=f"forged-{uuid.uuid4().hex}")
                sent.append(subjects.run_interviews(rid, after, "host-1"))

        sub = await nc.subscribe(subjects.run_asked(rid, request), cb=on_placed)
        try:
            return await ask(nc, rid, 2, SURVEY, request=request, timeout_s=180)
        finally:
            await sub.unsubscribe()
            await evil.close()
            await nc.close()

    before = len(asyncio.run(dead_letters(stack)))
    asked = asyncio.run(go())
    n = len(expected["agent_id"])
    assert n == AGENTS * len(SURVEY.questions)
    assert asked.placed.expected == n and asked.recorded.answers == n
    keys = ("agent_id", "question", "answer", "value", "raw", "valid")
    got, questions = read_recorded(stack.db, lambda con: (
        con.execute(f"SELECT {', '.join(keys)}, after_round FROM interviews WHERE run_id = ? AND request = ? "
                    "ORDER BY agent_id, question", [rid, request]).fetchall(),
        con.execute("SELECT question FROM interview_questions WHERE run_id = ? AND request = ? "
                    "AND position >= 0 ORDER BY position", [rid, request]).fetchall()))
    assert got == sorted((*(expected[k][i] for k in keys), 2) for i in range(n))
    assert questions == [("fair",), ("trust",)]
    assert len(sent) == 3
    dead = [d for subject in set(sent) for d in refused_on(stack, before, subject, sent.count(subject))]
    reasons = sorted(d[2] for d in dead)
    assert all(d[0].startswith("recorder.") for d in dead), dead
    assert len(reasons) == 3 and any("asks survey 'after' with its own questions" in r for r in reasons), reasons
    assert any(f"request {request!r} asks after round 2, not after round 1" in r for r in reasons), reasons
    assert any("is not one of host-1's agents" in r for r in reasons), reasons
