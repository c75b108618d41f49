"""One NATS user per agent-host: the deploy file's `agent-host` user, narrowed to one host id.

deploy/nats/auth.conf gives every agent-host one shared user, which may publish any host's
outcomes and partials. A host with a user of its own (named by its host id) may publish only
its own: `run.*.outcomes.*.<id>`, `run.*.interviews.*.<id>`, `run.*.mail.*.*.*.<id>`,
`run.*.partial.*.<id>.*`, `run.*.spawned.<id>`, `run.*.fault.<id>`, `progress.*.*.<id>`, `llm.infer.<id>`,
its own KV `hosts` entry, its own objects in `checkpoints` (chunks and metadata under its id); it
hears only its own spawn and interview orders and reads only its own inboxes (`_INBOX_<id>.>`) and
gateway replies (`reply.gateway.<id>.>`); on RUN it may create, read and delete one consumer,
`mail-<id>`, filtered to its own mail. The environment and the recorder refuse a body that claims
another sender than its subject, so a host's credentials cannot speak for another host.

The block is derived from the deploy file's text, not written out again here: each narrowing
must match exactly once, so a change to the file that breaks one fails loudly."""

from __future__ import annotations

import re

from populace.core import authfile, subjects
from populace.core.subjects import valid_token

_MAIL = subjects.mail_consumer("{id}")
# The user every agent-host without a user of its own shares: it may speak for any host.
SHARED_HOST_USER = "agent-host"

# (what the shared block says, what one host's says); {id} is the host id
NARROWINGS = (
    ('user: agent-host', 'user: "{id}"'),
    ('"run.*.spawned.*"', '"run.*.spawned.{id}"'),
    ('"run.*.outcomes.*.*"', '"run.*.outcomes.*.{id}"'),
    ('"run.*.interviews.*.*"', '"run.*.interviews.*.{id}"'),
    ('"run.*.mail.*.*.*.*"', '"run.*.mail.*.*.*.{id}"'),
    ('"run.*.mail.>"', '"run.*.mail.*.{id}.>"'),
    ('"run.*.partial.*.*.*"', '"run.*.partial.*.{id}.*"'),
    ('"run.*.fault.*"', '"run.*.fault.{id}"'),
    ('"progress.*.*.*"', '"progress.*.*.{id}"'),
    ('"$KV.hosts.>"', '"$KV.hosts.{id}"'),
    ('"_INBOX_agent-host.>"', '"_INBOX_{id}.>"'),
    ('"run.*.spawn.*"', '"run.*.spawn.{id}"'),
    ('"run.*.ask.*"', '"run.*.ask.{id}"'),  # post-hoc interview orders
    ('"$KV.services.agent-host.*"', '"$KV.services.agent-host.{id}"'),  # its liveness entry
    ('"$O.checkpoints.C.*.*"', '"$O.checkpoints.C.{id}.*"'),  # its checkpoints' chunks
    ('"$O.checkpoints.M.*.*.*"', '"$O.checkpoints.M.{id}.*.*"'),  # … and their metadata
    # its mail read back from RUN: one consumer of its own name, its own mail only
    ('"$JS.API.CONSUMER.CREATE.RUN.*.run.*.mail.*.*.*.*"',
     f'"$JS.API.CONSUMER.CREATE.RUN.{_MAIL}.{subjects.any_mail_for("{id}")}"'),
    ('"$JS.API.CONSUMER.INFO.RUN.*"', f'"$JS.API.CONSUMER.INFO.RUN.{_MAIL}"'),
    ('"$JS.API.CONSUMER.MSG.NEXT.RUN.*"', f'"$JS.API.CONSUMER.MSG.NEXT.RUN.{_MAIL}"'),
    ('"$JS.API.CONSUMER.DELETE.RUN.*"', f'"$JS.API.CONSUMER.DELETE.RUN.{_MAIL}"'),
    # inference as itself, answered on its own reply subjects only (populace.core.replies)
    ('"llm.infer.agent-host"', '"llm.infer.{id}"'),
    ('"reply.gateway.agent-host.>"', '"reply.gateway.{id}.>"'),
)
_PASSWORD = re.compile(r"password: \$AGENT_HOST_PASSWORD")


class HostAuthError(ValueError):
    pass


def shared_block(conf: str) -> tuple[int, int]:
    """Where the `agent-host` user's block `{ … }` is in the deploy file's text."""
    at = conf.find("user: agent-host")
    if at < 0:
        raise HostAuthError("the NATS config has no `user: agent-host` block to derive a host's user from")
    start = conf.rfind("{", 0, at)
    depth, i = 0, start
    while i < len(conf):
        depth += {"{": 1, "}": -1}.get(conf[i], 0)
        if depth == 0:
            return start, i + 1
        i += 1
    raise HostAuthError("the `agent-host` user's block is not closed")


def host_user(conf: str, host_id: str, password: str) -> str:
    """The NATS user block of one agent-host, named by its host id."""
    if not valid_token(host_id) or not re.fullmatch(r"[A-Za-z0-9_-]+", host_id):
        raise HostAuthError(f"host id {host_id!r}: letters, digits, '-' and '_' only")
    if '"' in password or "\\" in password or not password:
        raise HostAuthError("the password must be non-empty, without quotes or backslashes")
    # a second user of that name; and a host named `environment` would write checkpoint chunks
    # under the environment's token
    if host_id in authfile.users(conf):
        raise HostAuthError(f"host id {host_id!r} is the name of a user of the NATS config")
    start, end = shared_block(conf)
    block = conf[start:end]
    for shared, own in NARROWINGS:
        if block.count(shared) != 1:
            raise HostAuthError(f"the agent-host block has {block.count(shared)} × {shared}, expected 1")
        block = block.replace(shared, own.format(id=host_id))
    if len(_PASSWORD.findall(block)) != 1:
        raise HostAuthError("the agent-host block's password is not `$AGENT_HOST_PASSWORD`")
    return _PASSWORD.sub(f'password: "{password}"', block)


def with_hosts(conf: str, passwords: dict[str, str]) -> str:
    """The deploy file's text with one user per host added after the shared `agent-host` user."""
    _, end = shared_block(conf)
    blocks = "".join(f"\n\n    {host_user(conf, h, pw)}" for h, pw in passwords.items())
    return conf[:end] + blocks + conf[end:]
