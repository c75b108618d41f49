"""Which registered LLM replicas may be called: the replica allow-list and the registry key's writer.

Replicas register themselves in KV `replicas`, and whoever holds a `replicas` credential writes
the URL a gateway will send prompts (personas, memory) to and take answers from. Two checks
bound it, both pure:

- **Keys bound to their writers.** Each replica set's NATS user may write only keys under its
  own name (`$KV.replicas.<user>.>`, deploy/nats/auth.conf; `populace auth replicas SET`), so
  a key `<writer>.<replica id>` says who wrote it, as a host's own subjects do; an entry whose
  body names another replica id than its key is refused. One set's credential cannot overwrite,
  delete or shadow another's replicas.
- **An allow-list of where replicas may be** (POPULACE_REPLICA_HOSTS, read by the gateway, the
  manager and `populace node`): comma-separated items `[writer@]host[:port]` or
  `[writer@]network/prefix`; `*` allows any host. A host name matches by name only, never
  resolved (a name cannot be pointed into an allowed network); an address matches by value or
  network. `writer@` binds an item to one replica set's user. The default, loopback
  (127.0.0.0/8, ::1, localhost), covers private stacks and the tests; a fleet lists its replica
  machines (`10.0.0.0/24`, `replicas-gpu@10.0.0.21:8000`).

A registered URL must be `http(s)://host[:port][/path]` in plain characters, so the URL the
gateway checks is the URL it calls (no user info, query or escapes for two parsers to read
differently)."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from populace.core import subjects
from populace.core.contracts import ReplicaInfo

SETTING = "POPULACE_REPLICA_HOSTS"
LOOPBACK = "127.0.0.0/8,::1,localhost"
_URL = re.compile(r"https?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(:\d{1,5})?(/[A-Za-z0-9._~/-]*)?")
_NAME = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?")
_WRITER = re.compile(r"[A-Za-z0-9_-]+")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Allowed:
    """One item of the allow-list: a network, an address or a host name, with a port or any."""

    writer: str | None  # None: any replica set's
    network: Network | None = None
    address: Address | None = None
    name: str | None = None
    port: int | None = None

    def admits(self, writer: str | None, host: Address | str, port: int) -> bool:
        if self.writer is not None and writer != self.writer:
            return False
        if self.port is not None and port != self.port:
            return False
        if self.network is not None:
            return not isinstance(host, str) and host.version == self.network.version and host in self.network
        if self.address is not None:
            return host == self.address
        return host == self.name


@dataclass(frozen=True)
class ReplicaHosts:
    any_host: bool
    items: tuple[Allowed, ...]
    spec: str

    def refusal(self, url: str, writer: str | None = None) -> str | None:
        """Why a replica at `url`, registered by `writer`, may not be called: None when it may."""
        if not _URL.fullmatch(url):
            return f"{url[:120]!r} is not http(s)://host[:port][/path]"
        parts = urlsplit(url)
        name = (parts.hostname or "").lower()
        port = parts.port or (443 if parts.scheme == "https" else 80)
        if self.any_host:
            return None
        host = _address(name)
        if any(item.admits(writer, host if host is not None else name, port) for item in self.items):
            return None
        by = f" registered by {writer}" if writer else ""
        return f"{name}:{port}{by} is not in {SETTING} ({self.spec})"


    def advertise_refusal(self, host: str, writer: str | None, ports: list[int] | None) -> str | None:
        """Why replicas advertised at `host` (by `writer`, on `ports`; None: ports not known
        before they start) would be refused: None when every one of them is allowed. What
        `populace node` checks before it starts any."""
        if self.any_host:
            return None
        name = host.lower()
        address = _address(name)
        target = address if address is not None else name.strip("[]")
        if ports is None:
            if any(item.port is None and item.admits(writer, target, 0) for item in self.items):
                return None
            where = f"{name} (on ports picked when they start)"
        else:
            if all(any(item.admits(writer, target, port) for item in self.items) for port in ports):
                return None
            where = f"{name}:{','.join(str(p) for p in ports)}"
        by = f" registered by {writer}" if writer else ""
        return f"{where}{by} is not in {SETTING} ({self.spec})"


def _address(text: str) -> Address | None:
    try:
        return ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return None


def _item(text: str) -> Allowed:
    writer, at, rest = text.rpartition("@")
    if at and not _WRITER.fullmatch(writer):
        raise ValueError(f"{SETTING}: {text!r}: the writer before @ is a NATS user name (letters, digits, - and _)")
    writer_or_none = writer if at else None
    if "/" in rest:
        try:
            return Allowed(writer_or_none, network=ipaddress.ip_network(rest, strict=False))
        except ValueError:
            raise ValueError(f"{SETTING}: {text!r} is neither a network (address/prefix) nor host[:port]") from None
    if (address := _address(rest)) is not None and (rest.count(":") != 1 or rest.startswith("[")):
        return Allowed(writer_or_none, address=address)  # an address without a port (IPv6 bare or bracketed)
    try:
        parts = urlsplit(f"//{rest}")
        port = parts.port
    except ValueError:
        raise ValueError(f"{SETTING}: {text!r} is not host[:port]") from None
    host = (parts.hostname or "").lower()
    if not host or parts.path or parts.username is not None:
        raise ValueError(f"{SETTING}: {text!r} is not host[:port]")
    if (address := _address(host)) is not None:
        return Allowed(writer_or_none, address=address, port=port)
    if not _NAME.fullmatch(host):
        raise ValueError(f"{SETTING}: {text!r}: {host!r} is not a host name")
    return Allowed(writer_or_none, name=host, port=port)


def parse(spec: str) -> ReplicaHosts:
    """The allow-list in POPULACE_REPLICA_HOSTS; ValueError naming the setting and the item."""
    items = [x.strip() for x in spec.split(",") if x.strip()]
    if "*" in items:
        return ReplicaHosts(True, (), spec)
    return ReplicaHosts(False, tuple(_item(x) for x in items), spec)


def entry_refusal(key: str, replica_id: str, url: str, hosts: ReplicaHosts) -> str | None:
    """Why a KV `replicas` entry must not be called: its key is under no writer's name or names
    another replica than its body, or its URL is not allowed for its writer. None: it may."""
    parts = subjects.replica_key_parts(key)
    if parts is None:
        return (f"key {key[:80]!r} is not <writer>.<replica id> (an entry written by an older Populace, or "
                "by hand)")
    writer, keyed = parts
    if keyed != replica_id:
        return f"key {key[:80]!r} names replica {keyed!r}, its entry {replica_id[:80]!r}"
    return hosts.refusal(url, writer)


def named_by_key(key: str, info: ReplicaInfo) -> ReplicaInfo:
    """A registered replica as every reader names it: by its key, `<writer>.<replica id>` (two
    sets' replicas of one id are two replicas; neither takes the other's place)."""
    return info.model_copy(update={"replica_id": key})


def bound(items: list[tuple[str, ReplicaInfo]], hosts: ReplicaHosts | None = None) -> list[ReplicaInfo]:
    """The entries of KV `replicas` (bus.registry_items) whose key names their writer and their
    replica, each named by its key; with `hosts`, only those it admits too (what a gateway with
    that allow-list calls: a run's manifest, a check that a model is served)."""
    return [named_by_key(key, info) for key, info in items
            if (parts := subjects.replica_key_parts(key)) is not None and parts[1] == info.replica_id
            and (hosts is None or hosts.refusal(info.url, parts[0]) is None)]
