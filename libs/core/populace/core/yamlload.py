"""The one bounded YAML loader for files a user hands us (scenarios, sweeps, populations,
`--set` values, the manager's upload): document size, nesting depth, aliases and what the
aliases expand to are limited while loading, so a hostile file fails at once with one
line naming the key and the limit — never a RecursionError, never gigabytes.

A 345-byte alias bomb (nine anchors, each a list of nine aliases to the one before) loads into
a few hundred nodes, but anything that walks the values (validation, an error that formats
them) sees 9**9 of them. Composition is counted as if every alias were a copy, and stops at
MAX_VALUES; anchored nodes remember their expanded size, so counting stays linear."""

from __future__ import annotations

import reprlib
import sys
from pathlib import Path

import yaml
from yaml.events import AliasEvent
from yaml.nodes import ScalarNode

# 256 KiB: scenario and population files here are a few KB, and a scenario's text travels in
# its run's manifest, which must stay well under NATS' 1 MB max_payload
MAX_BYTES = 256 << 10
MAX_DEPTH = 64  # nesting levels; configs use fewer than ten
MAX_ALIASES = 1000  # alias uses (`*name`) in one document
MAX_VALUES = 100_000  # scalars, lists and mappings, every alias counted as a copy of what it names


class YamlLimitError(yaml.YAMLError):
    """A document past one of the limits; the message names where (a dotted key path, shortened
    when deep) and the limit."""

    def __init__(self, path: list[str], message: str) -> None:
        shown = path if len(path) <= 6 else [*path[:4], "…", path[-1]]
        self.path = ".".join(shown) or "(top level)"
        super().__init__(f"{self.path}: {message}")


class BoundedLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` with the limits above, checked while the document is composed."""

    def __init__(self, stream) -> None:
        if isinstance(stream, str | bytes) and len(stream) > MAX_BYTES:
            raise YamlLimitError([], f"more than the {MAX_BYTES:,}-byte limit for a YAML document")
        super().__init__(stream)
        self._path: list[str] = []  # the keys and positions down to the node being composed
        self._depth = 0
        self._values = 0
        self._aliases = 0
        self._expanded: dict[int, int] = {}  # id(anchored node) -> how many values it stands for
        self._open: set[str] = set()  # anchors whose node is still being composed

    def compose_node(self, parent, index):
        # index: a mapping value's key node, a list item's position, None for a key or the root
        labelled = index is not None
        if labelled:
            self._path.append(index.value if isinstance(index, ScalarNode) else str(index))
        self._depth += parent is not None
        try:
            if self._depth > MAX_DEPTH:
                raise YamlLimitError(self._path, f"nested deeper than {MAX_DEPTH} levels (the limit)")
            event = self.peek_event()
            if isinstance(event, AliasEvent):
                self._aliases += 1
                if self._aliases > MAX_ALIASES:
                    raise YamlLimitError(self._path, f"more than {MAX_ALIASES:,} aliases (the limit)")
                if event.anchor in self._open:
                    raise YamlLimitError(self._path,
                                         f"alias *{event.anchor} names a value that contains it (no cycles)")
                node = super().compose_node(parent, index)
                self._count(self._expanded.get(id(node), 1))
                return node
            anchor = getattr(event, "anchor", None)
            before = self._values
            if anchor is not None:
                self._open.add(anchor)
            try:
                node = super().compose_node(parent, index)
            finally:
                self._open.discard(anchor)
            self._count(1)
            if anchor is not None:
                self._expanded[id(node)] = self._values - before
            return node
        finally:
            self._depth -= parent is not None
            if labelled:
                self._path.pop()

    def construct_yaml_int(self, node):
        try:
            return super().construct_yaml_int(node)
        except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
            raise YamlLimitError([f"line {node.start_mark.line + 1}"],
                                 f"an integer of {len(node.value):,} digits, more than the "
                                 f"{sys.get_int_max_str_digits():,} Python reads (the limit)") from None

    def _count(self, n: int) -> None:
        self._values += n
        if self._values > MAX_VALUES:
            raise YamlLimitError(self._path, f"more than {MAX_VALUES:,} values once its aliases are expanded "
                                             f"(the limit)")


BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)


def load(text: str, loader: type[BoundedLoader] = BoundedLoader):
    """One YAML document, within the limits (YamlLimitError past one, yaml.YAMLError if invalid)."""
    return yaml.load(text, Loader=loader)


def read_text(path: str | Path) -> str:
    """A YAML file's text, read no further than the size limit (OSError if unreadable,
    YamlLimitError if larger, UnicodeDecodeError if not text)."""
    with open(path, "rb") as f:
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise YamlLimitError([], f"more than the {MAX_BYTES:,}-byte limit for a YAML document")
    return data.decode("utf-8")


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxtuple, _SHORT.maxdict, _SHORT.maxset = 3, 6, 6, 6, 6
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 60, 60, 40


def short_repr(value: object, limit: int = 80) -> str:
    """repr() for an error message: bounded whatever the value (an alias bomb's list, a huge
    string), never walking more of it than it shows."""
    text = _SHORT.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
