"""LLM ports that answer in process: for unit tests of a simulation's agents (no NATS, no
model) and for local runs on the dummy model.

    llm = ScriptedLLM({0: '{"guess": 10}'}, default='{"guess": 50}')
    outcome = await agent.turn(obs, llm)
    assert llm.asked[0].prompt.startswith("You are")
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from populace.core import synth
from populace.sdk.llm import InferError, call_tag
from populace.sdk.profile import Outstanding


@dataclass(frozen=True, slots=True)
class Asked:
    key: int
    prompt: str
    prefix_chars: int
    system: str | None
    schema: dict | None


class ScriptedLLM:
    """Answers from a script: a function `(key, prompt) -> text`, a mapping from agent id to
    text (or to a list of texts, one per call in order), or one text for everyone. A text that
    is an `Exception` instance is raised instead (e.g. `InferError("down")` to test an outage).
    Every call is kept in `asked`."""

    def __init__(self, script: Callable[[int, str], str] | Mapping[int, str | Sequence[str]] | str = "",
                 default: str | None = None) -> None:
        self._script = script
        self._default = default
        self._calls: dict[int, int] = {}
        self.asked: list[Asked] = []

    def _text(self, key: int, prompt: str) -> str | BaseException:
        script = self._script
        if callable(script):
            return script(key, prompt)
        if isinstance(script, str):
            return script
        if key not in script:
            if self._default is None:
                raise KeyError(f"ScriptedLLM has no answer for key {key}")
            return self._default
        entry = script[key]
        if isinstance(entry, (str, BaseException)):
            return entry
        i = self._calls[key] = self._calls.get(key, -1) + 1
        return entry[min(i, len(entry) - 1)]

    async def ask(self, prompt: str, *, key: int, prefix_chars: int = 0, system: str | None = None,
                  schema: dict | None = None) -> str:
        self.asked.append(Asked(key, prompt, prefix_chars, system, schema))
        text = self._text(key, prompt)
        if isinstance(text, BaseException):
            raise text
        return text


class DummyLLM:
    """The paper's dummy model in process: the same seeded answers the gateway's dummy backend
    gives (`populace.core.synth`), so a local run reproduces a fleet run exactly."""

    def __init__(self, *, seed: int, round_: int, system: str = "", schema: dict | None = None,
                 latency_s: float = 0.0) -> None:
        self.seed, self.round, self.system, self.schema = seed, round_, system, schema
        self.latency_s = latency_s
        self.calls = 0
        self._render = synth.renderer(schema)
        self._renders: dict[int, tuple[dict, Callable]] = {}  # id(schema) -> (schema, its renderer)
        self._seqs: dict = {}  # key (or caller, key) -> its calls so far this round: each call seeded apart
        self._out = Outstanding()  # with a latency: the seconds a call was out

    @property
    def model_wait_s(self) -> float:
        return self._out.now()

    async def ask(self, prompt: str, *, key: int, prefix_chars: int = 0, system: str | None = None,
                  schema: dict | None = None) -> str:
        self.calls += 1
        tag = call_tag(self._seqs, key)
        seed = self.seed if tag == 0 else synth.call_seed(self.seed, tag)
        if self.latency_s:
            self._out.begin()
            try:
                await asyncio.sleep(self.latency_s)
            finally:
                self._out.end()
        if schema is None:
            return self._render(seed, self.round, key)
        # a simulation passes the same schema object call after call: compiled once per object
        known = self._renders.get(id(schema))
        if known is None or known[0] is not schema:
            known = self._renders[id(schema)] = (schema, synth.renderer(schema))
        return known[1](seed, self.round, key)

    def flush(self) -> None:
        pass


__all__ = ["Asked", "DummyLLM", "InferError", "ScriptedLLM"]
