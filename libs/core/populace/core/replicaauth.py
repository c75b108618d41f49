"""One NATS user per replica set: the deploy file's `replicas` user, narrowed to one set's keys.

deploy/nats/auth.conf's `replicas` user writes KV `replicas` keys under its own name only
(`$KV.replicas.replicas.>`). Every machine that registers replicas with it shares it, so each can
overwrite or delete the others' entries. A replica set with a user of its own, `replicas-<set>`,
writes only `$KV.replicas.replicas-<set>.>` and reads only `_INBOX_replicas-<set>.>`: no other
user may write, overwrite or delete its keys, and the key of each of its replicas says who wrote
it (`populace.core.replica_hosts`), which a gateway's allow-list may bind hosts to
(`replicas-<set>@10.0.0.21`).

The block is derived from the deploy file's text, as a host's is (populace.core.hostauth): each
narrowing must match exactly once, so a change to the file that breaks one fails loudly."""

from __future__ import annotations

import re

from populace.core import authfile

SHARED_USER = "replicas"
PREFIX = "replicas-"
NARROWINGS = (
    ("user: replicas", 'user: "{user}"'),
    ('"$KV.replicas.replicas.>"', '"$KV.replicas.{user}.>"'),
    ('"_INBOX_replicas.>"', '"_INBOX_{user}.>"'),
)
_PASSWORD = re.compile(r"password: \$REPLICAS_PASSWORD")


class ReplicaAuthError(ValueError):
    pass


def user_of(set_name: str) -> str:
    """The NATS user of a replica set (and the first token of its keys in KV `replicas`)."""
    return PREFIX + set_name


def shared_block(conf: str) -> tuple[int, int]:
    """Where the `replicas` user's block `{ … }` is in the deploy file's text."""
    found = [m.start() for m in re.finditer(r"user: replicas\b(?!-)", conf)]
    if len(found) != 1:
        raise ReplicaAuthError(f"the NATS config has {len(found)} `user: replicas` blocks, expected 1")
    start = conf.rfind("{", 0, found[0])
    depth, i = 0, start
    while i < len(conf):
        depth += {"{": 1, "}": -1}.get(conf[i], 0)
        if depth == 0:
            return start, i + 1
        i += 1
    raise ReplicaAuthError("the `replicas` user's block is not closed")


def set_user(conf: str, set_name: str, password: str) -> str:
    """The NATS user block of one replica set, `replicas-<set>`."""
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,40}", set_name):
        raise ReplicaAuthError(f"replica set {set_name!r}: 1 to 40 letters, digits, '-' and '_'")
    if '"' in password or "\\" in password or not password:
        raise ReplicaAuthError("the password must be non-empty, without quotes or backslashes")
    user = user_of(set_name)
    if user in authfile.users(conf):
        raise ReplicaAuthError(f"{user!r} is the name of a user of the NATS config already")
    start, end = shared_block(conf)
    block = conf[start:end]
    for shared, own in NARROWINGS:
        if block.count(shared) != 1:
            raise ReplicaAuthError(f"the replicas block has {block.count(shared)} × {shared}, expected 1")
        block = block.replace(shared, own.format(user=user))
    if len(_PASSWORD.findall(block)) != 1:
        raise ReplicaAuthError("the replicas block's password is not `$REPLICAS_PASSWORD`")
    return _PASSWORD.sub(f'password: "{password}"', block)


def with_sets(conf: str, passwords: dict[str, str]) -> str:
    """The deploy file's text with one user per replica set (by set name) added after `replicas`."""
    _, end = shared_block(conf)
    blocks = "".join(f"\n\n    {set_user(conf, name, pw)}" for name, pw in passwords.items())
    return conf[:end] + blocks + conf[end:]
