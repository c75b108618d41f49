"""An environment that keeps a ledger of several MB between rounds (issue 40: the state stays
where it is used). Its state starts with `params.megabytes` of entries, gains one entry a round
(the round's total), and every round's observation is an entry picked deep in the ledger, which
every agent's answer depends on: a state lost, cut or changed anywhere between rounds changes the
outcomes and the summary's checksum. Given to the services by import path (`archive_sim:Archive`)
with this folder on their PYTHONPATH."""

from __future__ import annotations

from populace.sdk import LLM, Agent, Env, Observation, Outcome, Params, Partial, Simulation, State, Summary

MODULUS = 1_000_000_007


class ArchiveParams(Params):
    megabytes: float = 5.0  # the ledger's size as JSON before round 1


class Ledger(State):
    entries: list[int] = []


class Pick(Observation):
    entry: int = 0  # an entry picked from deep in the ledger
    length: int = 0


class Filed(Outcome):
    measure = "value"
    value: int | None = None


class Tally(Partial):
    n: int = 0
    total: int = 0


class LedgerSummary(Summary):
    length: int = 0
    checksum: int = 0  # of every entry: the whole state, as the round left it
    total: int = 0


class Clerk(Agent):
    __slots__ = ()

    async def turn(self, obs: Pick, llm: LLM) -> Filed:
        raw = await llm.ask(f"file entry {obs.entry} of {obs.length}", key=self.id)  # the model paces it
        return Filed(value=(obs.entry + self.id) % 1000, raw=raw)


class ArchiveEnv(Env[Ledger, Tally]):
    State = Ledger
    Partial = Tally

    def start(self) -> Ledger:
        n = int(self.params.megabytes * 1024 * 1024 / 11)  # ~10 digits and a comma each
        return Ledger(entries=[(i * 2_654_435_761) % MODULUS for i in range(n)])

    def observe(self, state: Ledger, round: int) -> Pick:
        entries = state.entries
        return Pick(round=round, entry=entries[(round * 7_919 + len(entries) // 3) % len(entries)],
                    length=len(entries))

    def reduce(self, agent_ids, outcomes) -> Tally:
        return Tally(n=len(outcomes), total=sum(o.value for o in outcomes if o.valid and o.value is not None))

    def merge(self, partials) -> Tally:
        return Tally(n=sum(p.n for p in partials), total=sum(p.total for p in partials))

    def decide(self, state: Ledger, round: int, total: Tally) -> tuple[Ledger, LedgerSummary]:
        entries = [*state.entries, total.total]
        return Ledger(entries=entries), LedgerSummary(length=len(entries), checksum=sum(entries) % MODULUS,
                                                      total=total.total)


class Archive(Simulation):
    name = "archive"
    Params = ArchiveParams
    Agent = Clerk
    Env = ArchiveEnv
    Outcome = Filed
    Observation = Pick
    Summary = LedgerSummary
