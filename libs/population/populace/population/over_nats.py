"""Persona generation over NATS: a meta-prompt per sampled profile, sent to the inference
gateway as InferBatch requests (`llm.infer.<user>` request/reply), the answers checked, and the
failures regenerated with a new seed and temperature or left to the template fallback.

What to ask and what to keep (the meta-prompt, the schema, the consistency checks,
de-duplication, `--unique K`) is decided in :mod:`populace.population.generation`; this module
only talks to a stack that is already up (`populace.client.personas` starts a private one).
All personas are generated concurrently: prompts sharing a schema are sent together, at most
``concurrency`` per InferBatch (``batch_id`` unique, ``run_id`` ``personas-<hash>``, ``keys``
the persona indexes), and ``InferReply.valid[i]`` says whether answer *i* satisfied the schema.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from populace.population.generation import (
    MAX_TOKENS,
    MAX_TRIES,
    SYSTEM_PROMPT,
    TEMPERATURES,
    consistency_problem,
    dedupe_key,
    model_seed,
    parse_persona,
    persona_schema,
    user_prompt,
)

REQUEST_TIMEOUT_S = 900.0  # one InferBatch; the gateway bounds each call itself
MAX_INFLIGHT_BATCHES = 64


class PersonaGenerationError(RuntimeError):
    """The LLM path could not run at all (no gateway, no replica, stack failed to start)."""


@dataclass
class GeneratedPersona:
    persona: dict | None = None
    attempts: int = 0
    first_try: bool = False
    sampling_seed: int | None = None
    temperature: float | None = None
    reason: str | None = None
    rejected: list[str] = field(default_factory=list)  # why each earlier try was not kept


class LlmGenerator:
    """Generates personas for ``profiles`` through the gateway on ``nc``."""

    def __init__(self, nc, profiles: Sequence[dict], backend: str, seed: int, run_id: str,
                 concurrency: int, on_done: Callable[[], None]) -> None:
        self.nc, self.profiles, self.backend, self.seed = nc, profiles, backend, seed
        self.run_id, self.concurrency, self.on_done = run_id, concurrency, on_done
        self.outcomes = [GeneratedPersona() for _ in profiles]
        self.seen: dict[tuple[str, str], int] = {}
        self.regenerated = 0
        self.duplicates_removed = 0
        self.session = uuid.uuid4().hex[:8]
        self.batches = 0
        self.sem = asyncio.Semaphore(MAX_INFLIGHT_BATCHES)
        self.tasks: set[asyncio.Task] = set()
        self.fatal: BaseException | None = None

    async def run(self) -> list[GeneratedPersona]:
        self._submit(list(range(len(self.profiles))), 0)
        while self.tasks:
            done, _ = await asyncio.wait(self.tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                self.tasks.discard(t)
                if (err := t.exception()) is not None and self.fatal is None:
                    self.fatal = err
            if self.fatal is not None:
                for t in self.tasks:
                    t.cancel()
                await asyncio.gather(*self.tasks, return_exceptions=True)
                raise self.fatal
        return self.outcomes

    def _submit(self, indexes: list[int], attempt: int) -> None:
        """One batch per (schema, chunk of `concurrency`): prompts sharing a schema together."""
        by_schema: dict[str, list[int]] = {}
        for i in indexes:
            key = json.dumps(persona_schema(self.profiles[i]), sort_keys=True)
            by_schema.setdefault(key, []).append(i)
        for group in by_schema.values():
            for start in range(0, len(group), self.concurrency):
                chunk = group[start:start + self.concurrency]
                self.tasks.add(asyncio.create_task(self._batch(chunk, attempt)))

    async def _batch(self, indexes: list[int], attempt: int) -> None:
        from nats.errors import NoRespondersError
        from nats.errors import TimeoutError as NatsTimeout

        from populace.core import bus, replies, subjects
        from populace.core.contracts import InferBatch, InferReply, ModelConfig

        self.batches += 1
        model = ModelConfig(backend=self.backend, seed=model_seed(self.seed, attempt),
                            temperature=TEMPERATURES[min(attempt, len(TEMPERATURES) - 1)],
                            max_tokens=MAX_TOKENS)
        batch = InferBatch(
            batch_id=f"{self.run_id}-{self.session}-{self.batches}", run_id=self.run_id,
            round=attempt + 1, model=model, system=SYSTEM_PROMPT,
            keys=indexes, prompts=[user_prompt(self.profiles[i]) for i in indexes],
            response_schema=persona_schema(self.profiles[indexes[0]]),
        )
        texts: list[str] = [""] * len(indexes)
        valid = [False] * len(indexes)
        error: str | None = None
        async with self.sem:
            try:
                msg = await replies.request(self.nc, "gateway", subjects.llm_infer(replies.requester(self.nc)),
                                            bus.encode(batch), timeout=REQUEST_TIMEOUT_S)
            except NoRespondersError:
                raise PersonaGenerationError(
                    "no inference gateway answers llm.infer on this NATS server "
                    "(start a stack with `populace up`, or leave out --nats)") from None
            except (TimeoutError, NatsTimeout):
                error = f"timeout: no reply in {REQUEST_TIMEOUT_S:.0f}s"
            else:
                reply = InferReply.model_validate_json(msg.data)
                if reply.error is not None:
                    error = f"gateway error: {reply.error}"
                elif len(reply.texts) != len(indexes):
                    error = f"gateway error: {len(reply.texts)} answers for {len(indexes)} prompts"
                else:
                    texts = reply.texts
                    valid = reply.valid or [False] * len(indexes)
        retry: list[int] = []
        for pos, i in enumerate(indexes):
            out = self.outcomes[i]
            out.attempts = attempt + 1
            reason = error
            persona = None
            if reason is None:
                persona = parse_persona(texts[pos]) if valid[pos] else None
                if persona is None:
                    reason = f"invalid answer: {texts[pos][:120]!r}"
                else:
                    reason = consistency_problem(persona, self.profiles[i])
            if reason is None:
                key = dedupe_key(persona)  # type: ignore[arg-type]
                if key in self.seen and self.seen[key] != i:
                    self.duplicates_removed += 1
                    reason = f"duplicate of persona {self.seen[key]}"
                else:
                    self.seen[key] = i
            if reason is None:
                out.persona, out.reason = persona, None
                out.first_try = attempt == 0
                out.sampling_seed = model.seed * 1_000_003 + i
                out.temperature = model.temperature
                self.on_done()
            else:
                out.reason = reason
                out.rejected.append(reason)
                if attempt + 1 < MAX_TRIES:
                    retry.append(i)
                else:
                    self.on_done()
        if retry:
            self.regenerated += len(retry)
            self._submit(retry, attempt + 1)


async def replica_models(nc, backend: str) -> list[str]:
    from populace.core import bus, replica_hosts, subjects
    from populace.core.contracts import ReplicaInfo

    try:
        entries = replica_hosts.bound(await bus.registry_items(nc.jetstream(), subjects.REPLICAS_BUCKET, ReplicaInfo))
    except Exception:
        return []
    return sorted({e.model for e in entries if e.backend == backend})


async def generate_over_nats(url: str, profiles: Sequence[dict], backend: str, seed: int, run_id: str,
                        concurrency: int, progress) -> tuple[list[GeneratedPersona], LlmGenerator, str]:
    from populace.core.extras import fleet_missing

    try:
        from populace.core import bus
    except ModuleNotFoundError as missing:
        raise fleet_missing("generating personas over NATS", missing) from missing
    try:
        nc = await bus.connect_or_fail(url, "populace-personas")
    except ConnectionError as err:
        raise PersonaGenerationError(str(err)) from None
    try:
        models = await replica_models(nc, backend)
        if not models:
            raise PersonaGenerationError(
                f"no {backend!r} LLM replica is registered on {url} "
                f"(start one with `populace replicas {backend} --nats {url}`, or leave out --nats)")
        task = progress.add_task(f"personas ({backend})", total=len(profiles))
        gen = LlmGenerator(nc, profiles, backend, seed, run_id, concurrency,
                            on_done=lambda: progress.advance(task))
        outcomes = await gen.run()
        return outcomes, gen, "+".join(models)
    finally:
        await nc.close()
