"""`populace validate` on hostile files, as a real process: an alias bomb, 100,000-deep nesting
and a personas file whose first line is 1 GiB each end with exit 2 and one line naming the key
and the limit — no traceback — and the process never holds 600 MB (measured while it runs,
and killed past it, so a regression fails here instead of taking the machine's memory)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.e2e

CAP = 600 * 1024 * 1024


def alias_bomb() -> str:
    """About 330 bytes: nine anchors, each a list of nine aliases to the one before (9**9 values)."""
    levels = ["&a [" + ",".join(['"lol"'] * 9) + "]"]
    for prev, name in zip("abcdefgh", "bcdefghi"):
        levels.append(f"&{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "[" + ", ".join(levels) + "]"


def validate(path: Path, tmp_path: Path) -> tuple[int, str, int]:
    """(exit code, output, peak resident bytes) of `populace validate PATH`."""
    out = tmp_path / "out.txt"
    with out.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "populace.cli", "validate", str(path)], stdout=sink,
                                stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "400"})
    ps, peak, status, usage = psutil.Process(proc.pid), 0, None, None
    while status is None:
        pid, raw, rusage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            status, usage = os.waitstatus_to_exitcode(raw), rusage
            break
        try:
            peak = max(peak, ps.memory_info().rss)
        except psutil.Error:
            continue
        if peak > CAP:
            proc.kill()
        time.sleep(0.05)
    proc.returncode = status  # reaped by wait4 above
    peak = max(peak, usage.ru_maxrss * 1024)
    return status, out.read_text(errors="replace"), peak


def check_one_line(code: int, output: str, peak: int, *needles: str) -> None:
    assert peak <= CAP, f"peak RSS {peak / 2**20:.0f} MB; output: {output[:300]}"
    assert code == 2, output[:2000]
    assert "Traceback" not in output and len(output.strip().splitlines()) == 1, output[:2000]
    for needle in needles:
        assert needle in output, output


@pytest.mark.parametrize("name,text,needles", [
    ("bomb", "name: " + alias_bomb() + "\n", ("name.", "more than 100,000 values", "(the limit)")),
    ("deep", "name: " + "[" * 100_000 + "]" * 100_000 + "\n", ("name.0.0.0", "nested deeper than 64 levels")),
])
def test_validate_refuses_a_hostile_scenario_in_one_line_within_the_memory_cap(tmp_path, name, text, needles):
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    check_one_line(*validate(path, tmp_path), *needles)


def test_validate_refuses_a_personas_file_with_a_1_gib_line_without_reading_it(tmp_path):
    personas = tmp_path / "p.jsonl"
    with personas.open("wb") as f:  # sparse: the line is 1 GiB long and takes no disk
        f.write(b'{"profile": {"education": "phd"}, "persona": {"description": "')
        f.truncate(1 << 30)
    scenario = tmp_path / "s.yaml"
    scenario.write_text("simulation: ratio-game\npopulation: {personas: p.jsonl}\n")
    check_one_line(*validate(scenario, tmp_path), "p.jsonl:1: a persona of more than 65,536 bytes",
                   "POPULACE_PERSONA_MAX_BYTES")
