"""Reading deploy/nats/auth.conf as data: its users and what each may publish, subscribe and call.

nats-server's config format (maps in braces, arrays in brackets, `key: value`, `key = value` or
`key value`, quoted or bare strings, `#` and `//` comments) is parsed here just far enough for
the `authorization { users = [...] }` block: tests compare it with deploy/AUTH.md's table
(populace.core.authconf renders it), and `populace auth host` refuses a host id that names another
user or a service's durable consumer (populace.core.hostauth, replicaauth). Variables
(`$X_PASSWORD`) stay as their bare text."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_TOKEN = re.compile(r'"((?:[^"\\]|\\.)*)"|([{}\[\]:=,;])|([^\s{}\[\]:=,;"]+)')


class AuthConfError(ValueError):
    pass


def _strip_comments(text: str) -> str:
    out, quoted = [], False
    i = 0
    while i < len(text):
        c = text[i]
        if c == '"' and (i == 0 or text[i - 1] != "\\"):
            quoted = not quoted
        elif not quoted and (c == "#" or text.startswith("//", i)):
            while i < len(text) and text[i] != "\n":
                i += 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _tokens(text: str) -> list[str]:
    toks: list[str] = []
    for m in _TOKEN.finditer(_strip_comments(text)):
        quoted, punct, bare = m.groups()
        toks.append(f'"{quoted}' if quoted is not None else punct if punct is not None else bare)
    return toks


def parse(text: str) -> dict:
    """The config as nested dicts and lists; strings keep no quotes."""
    toks = _tokens(text)
    pos = 0

    def value():
        nonlocal pos
        tok = toks[pos]
        pos += 1
        if tok == "{":
            return body("}")
        if tok == "[":
            items = []
            while toks[pos] != "]":
                items.append(value())
                if toks[pos] in (",", ";"):
                    pos += 1
            pos += 1
            return items
        return tok[1:] if tok.startswith('"') else tok

    def body(end: str | None) -> dict:
        nonlocal pos
        out: dict = {}
        while pos < len(toks) and toks[pos] != end:
            key = toks[pos]
            key = key[1:] if key.startswith('"') else key
            pos += 1
            if toks[pos] in (":", "="):
                pos += 1
            out[key] = value()
            if pos < len(toks) and toks[pos] in (",", ";"):
                pos += 1
        pos += 1
        return out

    try:
        return body(None)
    except IndexError:
        raise AuthConfError("the NATS config ends inside a block") from None


@dataclass(frozen=True)
class User:
    name: str
    publish: tuple[str, ...] = ()
    publish_deny: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = ()
    subscribe_deny: tuple[str, ...] = ()
    responses: dict = field(default_factory=dict)  # allow_responses ({} when not given)


def _lists(perm) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A publish/subscribe permission: a subject, a list, or {allow: [...], deny: [...]}."""
    if perm is None:
        return (), ()
    if isinstance(perm, str):
        return (perm,), ()
    if isinstance(perm, list):
        return tuple(perm), ()
    allow, deny = perm.get("allow", []), perm.get("deny", [])
    return (tuple([allow] if isinstance(allow, str) else allow),
            tuple([deny] if isinstance(deny, str) else deny))


def users(text: str) -> dict[str, User]:
    """Every user of the config's `authorization` block, by name."""
    conf = parse(text)
    out: dict[str, User] = {}
    for entry in conf.get("authorization", {}).get("users", []):
        perms = entry.get("permissions", {})
        pub, pub_deny = _lists(perms.get("publish"))
        sub, sub_deny = _lists(perms.get("subscribe"))
        responses = perms.get("allow_responses", {})
        out[entry["user"]] = User(entry["user"], pub, pub_deny, sub, sub_deny,
                                  responses if isinstance(responses, dict) else {"max": 1})
    return out


_DURABLE = re.compile(r"^\$JS\.API\.CONSUMER\.INFO\.[^.]+\.([^.*>]+)$")


def durables(text: str) -> set[str]:
    """The durable consumers some user may look up by name (`$JS.API.CONSUMER.INFO.<S>.<D>`)."""
    return {m.group(1) for u in users(text).values() for s in u.publish if (m := _DURABLE.match(s))}
