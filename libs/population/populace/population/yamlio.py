"""A strict YAML loader for config files: duplicate mapping keys are errors.

PyYAML's ``safe_load`` silently keeps the last of two equal keys, so a config listing the
same category twice would lose one of them without a word. :class:`StrictLoader` checks
the whole node tree before building Python objects and raises :class:`DuplicateKeyError`
with the dotted path of the mapping that holds the duplicate.

It also keeps every scalar mapping *key* as the text the user wrote: ``1: 0.5`` gives the
key ``"1"`` and ``yes: 0.5`` gives ``"yes"`` (plain PyYAML would give ``1`` and ``True``).
Every key in Populace config files is a name, so this removes a class of surprises.
Values are resolved as usual (numbers, booleans, null …). It keeps the limits of
:class:`populace.core.yamlload.BoundedLoader` (size, depth, aliases and what they expand to).
"""

from __future__ import annotations

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from populace.core.yamlload import BoundedLoader

_MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKeyError(yaml.YAMLError):
    """The same key appears twice in one mapping."""

    def __init__(self, path: tuple[str, ...], key: str, first_line: int, second_line: int):
        self.path = path
        self.key = key
        self.first_line = first_line
        self.second_line = second_line
        where = ".".join(path) if path else "(top level)"
        super().__init__(
            f"{where}: duplicate key {key!r} (lines {first_line} and {second_line})"
        )


# Kept on PyYAML, not ruamel.yaml: ruamel's duplicate-key error names neither the mapping's path nor the first
# key's line, and its safe loader makes `1:` an int key, so this node walk and constructor would stay as they are.
class StrictLoader(BoundedLoader):
    """The bounded ``yaml.SafeLoader``, rejecting duplicate keys and keeping scalar keys as text."""

    def get_single_data(self):
        node = self.get_single_node()
        if node is None:
            return None
        _check_duplicates(node, (), set())
        return self.construct_document(node)

    def construct_mapping(self, node, deep=False):
        if isinstance(node, MappingNode):
            self.flatten_mapping(node)  # resolves `<<: *anchor` merge keys
        mapping = {}
        for key_node, value_node in node.value:
            if isinstance(key_node, ScalarNode):
                key = key_node.value
            else:
                key = self.construct_object(key_node, deep=deep)
                try:
                    hash(key)
                except TypeError:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        "found unhashable key", key_node.start_mark,
                    ) from None
            mapping[key] = self.construct_object(value_node, deep=deep)
        return mapping


# SafeLoader registers its map constructor as a plain function; point it at ours.
StrictLoader.add_constructor(
    "tag:yaml.org,2002:map",
    lambda loader, node: loader.construct_mapping(node, deep=True),
)


def _check_duplicates(node: Node, path: tuple[str, ...], seen: set[int]) -> None:
    if id(node) in seen:  # an alias to a node already checked
        return
    seen.add(id(node))
    if isinstance(node, MappingNode):
        first: dict[str, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                _check_duplicates(value_node, path, seen)
                continue
            if isinstance(key_node, ScalarNode):
                key = key_node.value
                line = key_node.start_mark.line + 1
                if key in first:
                    raise DuplicateKeyError(path, key, first[key], line)
                first[key] = line
                _check_duplicates(value_node, path + (key,), seen)
            else:
                _check_duplicates(value_node, path + ("?",), seen)
    elif isinstance(node, SequenceNode):
        for i, item in enumerate(node.value):
            _check_duplicates(item, path + (str(i),), seen)


def load_strict(text: str):
    """Parse one YAML document with :class:`StrictLoader`."""
    return yaml.load(text, Loader=StrictLoader)
