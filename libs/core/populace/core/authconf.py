"""deploy/AUTH.md's table of grants, rendered from deploy/nats/auth.conf: every user's grants once,
and the rows of a host's and a replica set's own users (tests/unit/test_auth_table.py keeps the
document and the config equal). Above the parser (populace.core.authfile) and the users it
narrows (hostauth, replicaauth); the parser's names stay importable from here.

    uv run python -m populace.core.authconf deploy/nats/auth.conf
"""

from __future__ import annotations

from populace.core.authfile import AuthConfError, User, durables, parse, users
from populace.core.hostauth import host_user
from populace.core.replicaauth import set_user

__all__ = ["TABLE_BEGIN", "TABLE_END", "AuthConfError", "User", "durables", "parse", "row", "table", "users"]

TABLE_BEGIN = "<!-- grants table: generated from deploy/nats/auth.conf by populace.core.authconf; do not edit -->"
TABLE_END = "<!-- end of grants table -->"
_API_OPS = ("STREAM.MSG.GET", "STREAM.INFO", "STREAM.CREATE", "STREAM.PURGE", "DIRECT.GET", "CONSUMER.MSG.NEXT",
            "CONSUMER.INFO", "CONSUMER.CREATE", "CONSUMER.DELETE")


def _code(items: list[str]) -> str:
    return " ".join(f"`{i}`" for i in items)


def _grouped(groups: dict[str, list[str]]) -> str:
    return "<br>".join(f"**{name}**: {_code(items)}" for name, items in groups.items())


def _api(subject: str) -> tuple[str, str]:
    """(stream, what) of a JetStream API grant: `$JS.API.CONSUMER.INFO.RUN.x` → ("RUN", "CONSUMER.INFO.x")."""
    if subject.startswith(("$JS.ACK.", "$JS.FC.")):
        _, _, kind, stream, *rest = subject.split(".")
        return stream, ".".join([kind, *rest])
    tail = subject.removeprefix("$JS.API.")
    for op in _API_OPS:
        if tail == op or tail.startswith(op + "."):
            stream, _, rest = tail.removeprefix(op).lstrip(".").partition(".")
            return stream or "(no stream)", f"{op}.{rest}" if rest else op
    return "(other)", tail


def row(user: User, label: str | None = None) -> str:
    events, api, stores = [], {}, {}
    for subject in user.publish:
        if subject.startswith(("$JS.API.", "$JS.ACK.", "$JS.FC.")):
            stream, what = _api(subject)
            api.setdefault(stream, []).append(what)
        elif subject.startswith(("$KV.", "$O.")):
            kind, bucket, key = subject.split(".", 2)
            stores.setdefault(f"{'KV' if kind == '$KV' else 'object store'} {bucket}", []).append(key)
        else:
            events.append(subject)
    replies = (f"max {user.responses.get('max', '')}, expires {user.responses.get('expires', '')}"
               if user.responses else "")
    cells = [label or f"`{user.name}`", _code(events), _code(list(user.subscribe)), _grouped(api), _grouped(stores),
             _code([*user.publish_deny, *(f"sub {s}" for s in user.subscribe_deny)]), replies]
    return "| " + " | ".join(c or "—" for c in cells) + " |"


def table(text: str) -> str:
    """deploy/AUTH.md's table of what each user may publish, subscribe and call, every grant of
    the config once; and the row of a host's own user (`populace auth host <id>`)."""
    lines = [TABLE_BEGIN,
             "| User | Publishes | Subscribes | JetStream API, by stream | Writes (KV, object stores) | Denied "
             "| Replies to requests |",
             "|---|---|---|---|---|---|---|"]
    for u in users(text).values():
        lines.append(row(u))
        if u.name == "agent-host":
            block = host_user(text, "HOSTID", "-").replace("HOSTID", "<id>")
            lines.append(row(users(f"authorization {{ users = [ {block} ] }}")["<id>"],
                             "a host's own user, `<id>` (`populace auth host <id>`)"))
        if u.name == "replicas":
            block = set_user(text, "SET", "-").replace("replicas-SET", "replicas-<set>")
            lines.append(row(users(f"authorization {{ users = [ {block} ] }}")["replicas-<set>"],
                             "a replica set's own user, `replicas-<set>` (`populace auth replicas <set>`)"))
    lines.append(TABLE_END)
    return "\n".join(lines)


if __name__ == "__main__":  # print the table: python -m populace.core.authconf deploy/nats/auth.conf
    import sys
    from pathlib import Path

    print(table(Path(sys.argv[1]).read_text()))
