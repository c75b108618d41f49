"""A run's config, validated once per process. The orchestrator stores the resolved config in
the object store `checkpoints` (canonical JSON, named by run, round and sha256); round opens
name it by digest (`ConfigRef`), never carry it. A receiver validates a config it has not seen
once, keeps it by run id, and reads every run state from KV `runs` with it instead of
validating the config inside again.

    ref = ConfigRef.of(config, from_round)          # what the state and round opens carry
    await store(js, rid, ref, config)               # the orchestrator, before spawning
    config = await fetch(js, rid, ref)              # a receiver: checked against the digest
    state = CACHE.state(entry.value)                # a KV `runs` read: the config validated once
"""

from __future__ import annotations

from collections import OrderedDict
from contextvars import ContextVar

from nats.js import JetStreamContext
from pydantic import ValidationError
from pydantic_core import from_json

from populace.core import subjects
from populace.core.contracts import ConfigRef, RoundOpen, RunConfig, RunState, config_json

WRITER = "orchestrator"  # its token in the chunk subjects of `checkpoints` (deploy/nats/auth.conf)
MAX_RUNS = 1000  # configs kept per process: a run's is dropped when it ends, or the oldest beyond this


class ConfigUnavailable(RuntimeError):
    """A run's config cannot be read by the digest announced: missing, changed or not a config.
    An infrastructure fault (like a world that cannot be read), never the run's answer."""


def object_name(rid: str, ref: ConfigRef) -> str:
    return subjects.checkpoint_config(rid, ref.from_round, ref.digest)


async def store(js: JetStreamContext, rid: str, ref: ConfigRef, config: RunConfig) -> None:
    """Put the config where `ref` names it (its bytes must have the digest `ref` carries)."""
    from populace.core import checkpoints  # it imports the bus, which imports this module

    data = config_json(config)
    digest = await checkpoints.put_bytes(js, object_name(rid, ref), data, writer=WRITER)
    if digest != ref.digest:  # config_json is canonical: a bug, not a fault of the bus
        raise ValueError(f"run {rid}: its config's bytes have sha256 {digest[:12]}…, not {ref.digest[:12]}…")


async def fetch(js: JetStreamContext, rid: str, ref: ConfigRef) -> RunConfig:
    """The config `ref` names, read and checked against its digest, then validated (and kept:
    the next run state read of this run does not validate it again)."""
    from populace.core import checkpoints

    kept = CACHE.get(rid, ref.digest)
    if kept is not None:
        return kept
    name = object_name(rid, ref)
    try:
        config = RunConfig.model_validate_json(await checkpoints.get_bytes(js, name, ref.digest))
    except checkpoints.CheckpointError as err:
        raise ConfigUnavailable(f"run {rid}'s config {ref.digest[:12]}… cannot be read: {err}") from None
    except ValidationError as err:
        raise ConfigUnavailable(f"run {rid}'s config object {name} is not a run config: "
                                f"{err.error_count()} error(s), first: {err.errors()[0]['msg']}") from None
    CACHE.put(rid, ref.digest, config)
    return config


async def announced(js: JetStreamContext, opened: RoundOpen) -> RunConfig | None:
    """The config an admitted round open names: the one kept for its digest, or read by it if
    it is the run's current config (KV `runs`). None: the open names another (an older
    announcement, which admission lets through and its receivers drop), so nothing is read by
    a digest nobody vouches for."""
    from populace.core import bus  # it imports this module

    kept = CACHE.get(opened.run_id, opened.config_ref.digest)
    if kept is not None:
        return kept
    head = await bus.run_head(js, opened.run_id)
    if head is None or head.config_ref != opened.config_ref:
        return None
    return await fetch(js, opened.run_id, opened.config_ref)


class ConfigCache:
    """Each run's config by run id, with its digest: the newest one seen (a resume with a new
    budget replaces it). Bounded; `forget` drops a run that ended."""

    def __init__(self, limit: int = MAX_RUNS) -> None:
        self.limit = limit
        self._runs: OrderedDict[str, tuple[str, RunConfig]] = OrderedDict()

    def get(self, rid: str, digest: str) -> RunConfig | None:
        kept = self._runs.get(rid)
        if kept is None or kept[0] != digest:
            return None
        self._runs.move_to_end(rid)
        return kept[1]

    def put(self, rid: str, digest: str, config: RunConfig) -> None:
        self._runs[rid] = (digest, config)
        self._runs.move_to_end(rid)
        while len(self._runs) > self.limit:
            self._runs.popitem(last=False)

    def forget(self, rid: str) -> None:
        self._runs.pop(rid, None)

    def state(self, data: bytes | str) -> RunState:
        """A run state from its JSON (KV `runs`), with the config kept for its digest in place of
        validating the one inside again (a state without a digest, or with a new one: validated,
        then kept). Raises ValidationError / ValueError like RunState.model_validate_json."""
        raw = from_json(data)
        ref = raw.get("config_ref") if isinstance(raw, dict) else None
        rid = raw.get("run_id") if isinstance(raw, dict) else None
        digest = ref.get("digest") if isinstance(ref, dict) else None
        kept = self.get(rid, digest) if isinstance(rid, str) and isinstance(digest, str) else None
        if kept is None:
            state = RunState.model_validate(raw)
            if digest is not None and ConfigRef.of(state.config).digest == digest:  # kept only if it is that config
                self.put(state.run_id, digest, state.config)
            return state
        # an instance is taken as it is (pydantic does not validate a model instance again)
        return RunState.model_validate({**raw, "config": kept})


class ServiceCache:
    """The run configs of the service running in this context: one cache per process, unless
    several services share the process (populace.core.serve's `--together`), where each has its
    own (`own_cache`). Shared, one service's `forget` would make another read a config again,
    and another's `put` of a resumed run's new config would hide from the environment that the
    config changed (it resolves a run again only for a config it has not seen)."""

    def __init__(self) -> None:
        self._process = ConfigCache()
        self._own: ContextVar[ConfigCache | None] = ContextVar("populace_run_configs", default=None)

    def current(self) -> ConfigCache:
        return self._own.get() or self._process

    def own(self) -> None:
        self._own.set(ConfigCache())

    def get(self, rid: str, digest: str) -> RunConfig | None:
        return self.current().get(rid, digest)

    def put(self, rid: str, digest: str, config: RunConfig) -> None:
        self.current().put(rid, digest, config)

    def forget(self, rid: str) -> None:
        self.current().forget(rid)

    def state(self, data: bytes | str) -> RunState:
        return self.current().state(data)


CACHE = ServiceCache()  # a service's every reader shares its cache


def own_cache() -> None:
    """From now on, in this context (and the tasks started from it), a cache of its own."""
    CACHE.own()
