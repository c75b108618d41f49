"""How a checkpoint stores one range of agents' state, as pure functions (no bus): the rows of
the agents that have their own state, the offsets of those that have none (marks: one that
departed before its round, GONE; a newcomer that has not acted yet and is made as its class makes
one, FRESH), stored as offset lists or runs beside the rows, not as a row each; and how a chain of
a full checkpoint and its deltas resolves to every agent's fields.

Apart from populace.core.checkpoints (which stores and reads these values on JetStream) so that
what reads a population or a frozen state (the SDK's interviews included) imports no bus."""

from __future__ import annotations

from collections.abc import Iterable


class CheckpointError(RuntimeError):
    """A checkpoint object is missing, unreadable or unusable."""


# a resolved chain gives the marks as columns (True for the marked agents, None otherwise)
GONE = "__gone__"
FRESH = "__fresh__"
MARKS = {"gone": GONE, "fresh": FRESH}


def compacted(fields: dict[str, list], count: int, changed: list[int] | None
              ) -> tuple[dict[str, list], list[int] | None, dict[str, list[int]]]:
    """`fields` (a row per agent of the range, or per offset of `changed`, with GONE and FRESH
    columns for the marked ones) as a checkpoint stores them: the rows of the unmarked agents
    only, the offsets those rows are at (a delta's `changed`; for a full checkpoint, None when
    every agent has its row), and the marked agents' offsets ({"gone": […], "fresh": […]})."""
    marks = {key: fields.get(name) for key, name in MARKS.items()}
    if all(m is None for m in marks.values()):
        return fields, changed, {}
    offsets = changed if changed is not None else range(count)
    marked: dict[str, list[int]] = {}
    skip: set[int] = set()
    for key, column in marks.items():
        if column is not None:
            at = [i for i, v in enumerate(column) if v is True]
            if at:
                marked[key] = [offsets[i] for i in at]
                skip.update(at)
    keep = [i for i in range(len(offsets)) if i not in skip]
    rows = {name: [values[i] for i in keep] for name, values in fields.items() if name not in MARKS.values()}
    return rows, [offsets[i] for i in keep] if changed is not None or skip else None, marked


def changed_offsets(first: int, count: int, changed_ids: Iterable[int]) -> list[int]:
    """The offsets in range (first, count) of the agents whose state may have changed (sorted):
    what a delta of that range holds."""
    return sorted({aid - first for aid in changed_ids if first <= aid < first + count})


def _overlay(columns: dict[str, list], offsets: list[int], fields: dict[str, list], first: int, count: int) -> None:
    for name, values in fields.items():
        column = columns.setdefault(name, [None] * count)
        if len(values) != len(offsets):
            raise CheckpointError(f"a checkpoint of agents {first}..{first + count - 1} has {len(values)} "
                                  f"values of {name!r} for {len(offsets)} agents")
        for offset, value in zip(offsets, values):
            column[offset] = value


def as_runs(offsets: list[int]) -> list[int] | dict[str, list[list[int]]]:
    """Marked offsets as stored: a list, or {"runs": [[first, count], …]} when they come in runs
    (a range of newcomers none of which acted: one run)."""
    runs: list[list[int]] = []
    for o in offsets:
        if runs and runs[-1][0] + runs[-1][1] == o:
            runs[-1][1] += 1
        else:
            runs.append([o, 1])
    return {"runs": runs} if 2 * len(runs) < len(offsets) else offsets


def offsets_of(value: object) -> list[int] | None:
    """The offsets a stored mark holds (None: not offsets)."""
    if isinstance(value, dict):
        runs = value.get("runs")
        if not isinstance(runs, list) or not all(isinstance(r, list) and len(r) == 2 and all(
                isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in r) for r in runs):
            return None
        return [o for start, n in runs for o in range(start, start + n)]
    return value if isinstance(value, list) else None


def _mark(columns: dict[str, list], link: dict, count: int) -> None:
    """A link's marked agents: every field of theirs None, their mark True (and no other)."""
    for key, name in MARKS.items():
        for offset in offsets_of(link.get(key)) or ():
            for column in columns.values():
                column[offset] = None
            columns.setdefault(name, [None] * count)[offset] = True


def resolve_chain(links: list[dict], first: int, count: int) -> dict[str, list]:
    """Every agent's fields (columnar) from a chain of one range's checkpoint values, the head
    first and its full base last: the base, then each delta's agents over it in order; a field
    the head names in `round_fields` only from the head (an agent the head lacks has None). A
    link may hold fewer agents than the head (the range grew by newcomers since): the agents it
    does not hold have None until a later link gives theirs."""
    base = links[-1]
    held = base.get("held")
    if held is None:
        pad = [None] * (count - base["count"])
        columns = {name: [*values, *pad] for name, values in base["fields"].items()}
    else:  # its marked agents have no rows
        columns = {}
        _overlay(columns, held, base["fields"], first, count)
    _mark(columns, base, count)
    for link in reversed(links[:-1]):
        changed = link["changed"]
        _overlay(columns, changed, link["fields"], first, count)
        for name, column in columns.items():  # a field a link does not hold is none of its agents'
            if name not in link["fields"]:
                for offset in changed:
                    column[offset] = None
        _mark(columns, link, count)
    head = links[0]
    for name in head.get("round_fields") or ():
        if "changed" not in head:
            continue  # a full head holds every agent's
        column = [None] * count
        for offset, value in zip(head["changed"], head["fields"].get(name, ())):
            column[offset] = value
        columns[name] = column
    return columns


def valid_offsets(value: object, count: int) -> bool:
    """Whether `value` is absent or a list of offsets into a range of `count` agents."""
    return value is None or (isinstance(value, list) and all(isinstance(o, int) and not isinstance(o, bool)
                                                             and 0 <= o < count for o in value))
