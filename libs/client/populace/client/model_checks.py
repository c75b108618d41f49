"""A run's models checked before it starts, so that what cannot work is refused with one line
naming the field instead of pausing the run later:

- `local_refusal`: where the gateway runs on this machine (a private stack: `populace demo`), a
  keyed model's variable is set (or its file readable), and a model at its URL answers and takes
  its key (GET `{api_base}/models`);
- `fleet_refusal`: on a fleet, a model that names no URL has a replica registered for it
  (KV `replicas`, `populace replicas … --serves NAME`).

Never prints or returns a key: messages name the field, the variable or the file."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx

from populace.core import bus, replica_hosts, subjects
from populace.core.contracts import SELF_REGISTERING, ModelEndpoint, ReplicaInfo
from populace.core.settings import Settings

PROBE_TIMEOUT_S = 10.0


def _key(m: ModelEndpoint, where: str) -> tuple[str | None, str | None]:
    """(the key, or None; why it cannot be read, or None)."""
    if m.api_key_env:
        value = os.environ.get(m.api_key_env, "").strip()
        if not value:
            return None, (f"{where}.api_key_env: {m.api_key_env} is not set in this environment (the gateway "
                          "reads the key from it)")
        return value, None
    if m.api_key_file:
        try:
            value = Path(m.api_key_file).read_text(errors="replace").strip()
        except OSError as err:
            return None, f"{where}.api_key_file: {m.api_key_file} cannot be read ({err.strerror or err})"
        if not value:
            return None, f"{where}.api_key_file: {m.api_key_file} is empty"
        return value, None
    return None, None


async def local_refusal(models: list[ModelEndpoint]) -> str | None:
    """Why these models cannot be called from a gateway on this machine (None: they can)."""
    async with httpx.AsyncClient() as http:
        for i, m in enumerate(models):
            where = f"models.{i}"
            key, why = _key(m, where)
            if why is not None:
                return why
            if m.api_base is None:
                continue
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            try:
                resp = await http.get(f"{m.api_base}/models", headers=headers, timeout=PROBE_TIMEOUT_S)
            except httpx.HTTPError as err:
                return f"{where}.base_url: {m.base_url} does not answer ({type(err).__name__})"
            if resp.status_code in (401, 403):
                return f"{where}: model {m.name!r} at {m.base_url} refused its key (HTTP {resp.status_code})"
    return None


async def fleet_refusal(nc, models: list[ModelEndpoint]) -> str | None:
    """Why a fleet cannot serve these models: one that names no URL and no replica serves."""
    waiting = [(i, m) for i, m in enumerate(models) if m.base_url is None and m.kind in SELF_REGISTERING]
    if not waiting:
        return None
    entries = replica_hosts.bound(await bus.registry_items(nc.jetstream(), subjects.REPLICAS_BUCKET, ReplicaInfo,
                                                           fresh_within_s=30.0),
                                  replica_hosts.parse(Settings().replica_hosts))
    served = {e.serves for e in entries if e.serves}
    for i, m in waiting:
        if m.name not in served:
            return (f"models.{i}.name: no replica serves {m.name!r} (start one with `populace replicas "
                    f"{'local' if m.kind == 'llamacpp' else m.kind} --serves {m.name}`, or give its base_url)")
    return None


def check_local(models: list[ModelEndpoint]) -> str | None:
    return asyncio.run(local_refusal(models)) if models else None
