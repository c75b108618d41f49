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

from nats.js import JetStreamContext
from pydantic import ValidationError

from populace.core import bus, checkpoints, subjects
from populace.core.contracts import ConfigRef, RoundOpen, RunConfig, config_json

# the cache is the layer below (the bus reads run states with it); its names stay importable from here
from populace.core.runconfig_cache import CACHE, MAX_RUNS, ConfigCache, ServiceCache, own_cache

__all__ = ["CACHE", "MAX_RUNS", "WRITER", "ConfigCache", "ConfigUnavailable", "ServiceCache", "announced", "fetch",
           "object_name", "own_cache", "store"]

WRITER = "orchestrator"  # its token in the chunk subjects of `checkpoints` (deploy/nats/auth.conf)


class ConfigUnavailable(RuntimeError):
    """A run's config cannot be read by the digest announced: missing, changed or not a config.
    An infrastructure fault (like a world that cannot be read), never the run's answer."""


def object_name(rid: str, ref: ConfigRef) -> str:
    return subjects.checkpoint_config(rid, ref.from_round, ref.digest)


async def store(js: JetStreamContext, rid: str, ref: ConfigRef, config: RunConfig) -> None:
    """Put the config where `ref` names it (its bytes must have the digest `ref` carries)."""
    data = config_json(config)
    digest = await checkpoints.put_bytes(js, object_name(rid, ref), data, writer=WRITER)
    if digest != ref.digest:  # config_json is canonical: a bug, not a fault of the bus
        raise ValueError(f"run {rid}: its config's bytes have sha256 {digest[:12]}…, not {ref.digest[:12]}…")


async def fetch(js: JetStreamContext, rid: str, ref: ConfigRef) -> RunConfig:
    """The config `ref` names, read and checked against its digest, then validated (and kept:
    the next run state read of this run does not validate it again)."""
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
    kept = CACHE.get(opened.run_id, opened.config_ref.digest)
    if kept is not None:
        return kept
    head = await bus.run_head(js, opened.run_id)
    if head is None or head.config_ref != opened.config_ref:
        return None
    return await fetch(js, opened.run_id, opened.config_ref)
