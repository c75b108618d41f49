"""Replays a test run's junit times through the test command's scheduling rules
(tests/xdist_groups.py): three workers, each taking a group whole, longest first, a group only
where `may_take` allows it; no contention (each test takes the time it took in that run).
Prints the replayed wall time and how many workers were busy, per 30 s.

    uv run python bench/suite_replay.py run.xml [GROUP=FACTOR ...]

GROUP=FACTOR scales a group's time (0.5 halves it) to ask what a cut would save. Within 35 s
of the measured pytest time once a worker left on its last test was offered work again
(2026-12-04: 854 s replayed, 888 s measured); the difference is collection and the workers'
start."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import xdist_groups as rules  # tests/ is not a package: on the path above

WORKERS = 3


def group_times(junit: str) -> dict[str, float]:
    times: dict[str, float] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")
        module = "/".join(p for p in parts if not p[:1].isupper()) + ".py"  # a class's tests go with their module
        group = rules.group_of(module)
        times[group] = times.get(group, 0.0) + float(case.get("time", 0))
    return times


def replay(times: dict[str, float]) -> tuple[float, list[tuple[float, int, str, float]]]:
    queue, now = list(times), 0.0
    busy: list[str | None] = [None] * WORKERS
    ends = [0.0] * WORKERS
    log: list[tuple[float, int, str, float]] = []
    while queue or any(busy):
        for w in range(WORKERS):
            if busy[w] is None and queue:
                others = [{busy[o]} if busy[o] else set() for o in range(WORKERS) if o != w]
                allowed = [g for g in queue if rules.may_take(g, others)]
                if allowed:
                    group = min(allowed, key=lambda g: (rules.rank(g), queue.index(g)))
                    queue.remove(group)
                    busy[w], ends[w] = group, now + times[group]
                    log.append((now, w, group, times[group]))
        running = [ends[w] for w in range(WORKERS) if busy[w]]
        if not running:
            break
        now = min(running)
        for w in range(WORKERS):
            if busy[w] and ends[w] <= now:
                busy[w] = None
    return now, log


def main() -> None:
    times = group_times(sys.argv[1])
    for arg in sys.argv[2:]:
        group, factor = arg.rsplit("=", 1)
        times[group] = times.get(group, 0.0) * float(factor)
    wall, log = replay(times)
    print(f"replayed: {wall:.0f} s on {WORKERS} workers; {sum(times.values()):.0f} worker-seconds")
    buckets = [0.0] * (int(wall // 30) + 1)
    for start, _, _, seconds in log:
        t = start
        while t < start + seconds - 1e-9:
            i = int(t // 30)
            end = min((i + 1) * 30, start + seconds)
            buckets[i] += end - t
            t = end
    print("busy workers per 30 s:", " ".join(f"{b / 30:.1f}" for b in buckets))
    for start, w, group, seconds in log:
        if seconds >= 15:
            print(f"{start:6.0f} s  worker {w}  {seconds:6.1f} s  {group}")


if __name__ == "__main__":
    main()
