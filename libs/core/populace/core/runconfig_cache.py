"""The run configs a process has validated, by run id and digest: every run state read from KV
`runs` takes its config from here instead of validating the one inside again. Pure (the
contracts only), so the bus reads run states with it; reading and storing a config by its
digest is populace.core.runconfigs, above the bus and the object store."""

from __future__ import annotations

from collections import OrderedDict
from contextvars import ContextVar

from pydantic_core import from_json

from populace.core.contracts import ConfigRef, RunConfig, RunState

MAX_RUNS = 1000  # configs kept per process: a run's is dropped when it ends, or the oldest beyond this


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
