"""Where a model's key comes from, and where it may go: the only place a key is read.

A run's model names where its key comes from (`api_key_env: OPENAI_API_KEY`, or `api_key_file:
/run/secrets/openai`), never the key. The gateway reads it from its own environment or file, keeps
it in memory, and sends it only as the `Authorization` header of calls to that model. Since a run
config (and a request from any host) may name any source and any URL, the gateway's own settings
say which source may go to which host (POPULACE_GATEWAY_KEYS, "SOURCE@host[:port],…") and which
hosts a model's URL may name at all (POPULACE_GATEWAY_MODEL_HOSTS): a forged request cannot have
the gateway send a key, or its prompts, anywhere else. A private stack (`populace demo/run` with a
`models:` section) derives both from the scenario it runs.

No message this module builds holds a key: every error names the model and the source."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from populace.core.contracts import LOOPBACK_HOSTS, ModelEndpoint

MAX_KEY_FILE_BYTES = 16 * 1024
KEY_FILE_RECHECK_S = 5.0  # a rotated key file is read again after this long


class KeyUnavailable(RuntimeError):
    """The gateway cannot call this model: its key cannot be read, or may not go to its URL."""


@dataclass(frozen=True)
class Binding:
    source: str  # env:NAME or file:PATH
    host: str
    port: int | None  # None: any port of the host


def source_of(endpoint: ModelEndpoint) -> str | None:
    if endpoint.api_key_env:
        return f"env:{endpoint.api_key_env}"
    if endpoint.api_key_file:
        return f"file:{endpoint.api_key_file}"
    return None


def _host_port(text: str, where: str) -> tuple[str, int | None]:
    parts = urlsplit(f"//{text}")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{where}: {text!r} is not host[:port]") from None
    if not parts.hostname or parts.path or parts.username:
        raise ValueError(f"{where}: {text!r} is not host[:port]")
    return parts.hostname.lower(), port


def parse_bindings(spec: str) -> list[Binding]:
    """POPULACE_GATEWAY_KEYS: "env:NAME@host[:port],file:PATH@host[:port],…"."""
    out = []
    for item in (x.strip() for x in spec.split(",") if x.strip()):
        source, at, target = item.rpartition("@")
        if not at or not source.startswith(("env:", "file:")) or len(source.split(":", 1)[1]) == 0:
            raise ValueError(f"POPULACE_GATEWAY_KEYS: {item.split('@')[0][:60]!r} must be env:NAME@host[:port] or "
                             "file:PATH@host[:port]")
        host, port = _host_port(target, "POPULACE_GATEWAY_KEYS")
        out.append(Binding(source, host, port))
    return out


def parse_hosts(spec: str) -> tuple[bool, list[tuple[str, int | None]]]:
    """POPULACE_GATEWAY_MODEL_HOSTS: "*" (any host), or "host[:port],…"."""
    items = [x.strip() for x in spec.split(",") if x.strip()]
    if "*" in items:
        return True, []
    return False, [_host_port(x, "POPULACE_GATEWAY_MODEL_HOSTS") for x in items]


class KeyRing:
    """The gateway's keys: read on first use, from the environment or a file (read again when it
    changes), and handed out only for a model whose URL is bound to the key's source."""

    def __init__(self, keys_spec: str = "", hosts_spec: str = ",".join(LOOPBACK_HOSTS),
                 environ: dict[str, str] | None = None) -> None:
        self.bindings = parse_bindings(keys_spec)
        self.any_host, self.hosts = parse_hosts(hosts_spec)
        self._environ = os.environ if environ is None else environ
        self._files: dict[str, tuple[float, float, str]] = {}  # path -> (checked at, mtime, key)

    def refusal(self, endpoint: ModelEndpoint, url: str | None = None) -> str | None:
        """Why this gateway will not call `endpoint` at its base_url, or at `url` (a replica that
        registered for it): None when it may. Names no key."""
        url = url or endpoint.base_url
        if url is None:
            return None
        parts = urlsplit(url)
        host, port = (parts.hostname or "").lower(), parts.port
        source = source_of(endpoint)
        if source is not None:
            if not any(b.source == source and b.host == host and b.port in (None, port) for b in self.bindings):
                return (f"model {endpoint.name!r}: its key ({source}) may not be sent to {host}"
                        f"{f':{port}' if port else ''} (POPULACE_GATEWAY_KEYS binds each key to the hosts it may "
                        "go to)")
            return None
        allowed = self.any_host or any(h == host and p in (None, port) for h, p in self.hosts) or any(
            b.host == host and b.port in (None, port) for b in self.bindings)
        if not allowed:
            return (f"model {endpoint.name!r}: {host}{f':{port}' if port else ''} is not a host this gateway calls "
                    "(POPULACE_GATEWAY_MODEL_HOSTS)")
        return None

    def key(self, endpoint: ModelEndpoint) -> str | None:
        """The key of `endpoint` (None: it has none). Raises KeyUnavailable naming the source."""
        if endpoint.api_key_env:
            value = self._environ.get(endpoint.api_key_env, "").strip()
            if not value:
                raise KeyUnavailable(f"model {endpoint.name!r}: api_key_env {endpoint.api_key_env} is not set in the "
                                     "gateway's environment")
            return value
        if endpoint.api_key_file:
            return self._from_file(endpoint.name, endpoint.api_key_file)
        return None

    def headers(self, endpoint: ModelEndpoint | None, url: str | None = None) -> dict[str, str]:
        """The Authorization header for a call of `endpoint` (at `url`, a replica that registered
        for it; default its base_url). Raises KeyUnavailable when the key may not go there."""
        if endpoint is None or not endpoint.keyed:
            return {}
        if url is not None and (why := self.refusal(endpoint, url)):
            raise KeyUnavailable(why)
        key = self.key(endpoint)
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _from_file(self, model: str, path: str) -> str:
        now = time.monotonic()
        cached = self._files.get(path)
        if cached is not None and now - cached[0] < KEY_FILE_RECHECK_S:
            return cached[2]
        try:
            mtime = os.stat(path).st_mtime
            if cached is not None and cached[1] == mtime:
                self._files[path] = (now, mtime, cached[2])
                return cached[2]
            with Path(path).open("rb") as f:
                data = f.read(MAX_KEY_FILE_BYTES + 1)
        except OSError as err:
            raise KeyUnavailable(f"model {model!r}: api_key_file {path} cannot be read "
                                 f"({err.strerror or err})") from None
        if len(data) > MAX_KEY_FILE_BYTES:
            raise KeyUnavailable(f"model {model!r}: api_key_file {path} is larger than a key "
                                 f"({MAX_KEY_FILE_BYTES} bytes at most)")
        value = data.decode("utf-8", "replace").strip()
        if not value:
            raise KeyUnavailable(f"model {model!r}: api_key_file {path} is empty")
        self._files[path] = (now, mtime, value)
        return value

    def redact(self, text: str) -> str:
        """`text` with every key this ring has read replaced (a provider's error may quote it)."""
        for value in [*(v for v in (self._environ.get(b.source[4:]) for b in self.bindings
                                    if b.source.startswith("env:")) if v), *(c[2] for c in self._files.values())]:
            if len(value) >= 8:
                text = text.replace(value.strip(), "[key]")
        return text
