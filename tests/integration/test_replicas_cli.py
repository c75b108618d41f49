"""`populace replicas …` keeps what its servers write: a server that exits while it starts is
reported with the end of its output (here the simulated replica refusing an option), and the
output stays in a file per replica, in `--log-dir` or a temporary directory the command names."""

from __future__ import annotations

import re
import shutil
import signal
from pathlib import Path


def test_a_server_that_exits_at_start_is_reported_with_its_own_words(cli, tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    res = cli("replicas", "sim", "--count", "1", "--nats", "nats://127.0.0.1:9", "--log-dir", tmp_path,
              "--", "--no-such-option")
    said = res.stdout + (res.stderr or "")
    assert res.returncode == 1, said
    assert f"servers' output in {tmp_path}" in said
    assert re.search(r"replica \S+ exited \(2\)", said), said
    assert "unrecognized arguments: --no-such-option" in said  # the server's own error, not just its code
    logs = list(tmp_path.glob("*.log"))
    assert len(logs) == 1 and "unrecognized arguments: --no-such-option" in logs[0].read_text()
    assert signal.getsignal(signal.SIGTERM) is before  # the command's SIGTERM handler is undone when it ends


def test_without_a_log_dir_the_output_goes_to_a_temporary_directory_it_names(cli):
    res = cli("replicas", "sim", "--count", "1", "--nats", "nats://127.0.0.1:9", "--", "--no-such-option")
    said = res.stdout + (res.stderr or "")
    named = re.search(r"servers' output in (\S+)", said)
    assert res.returncode == 1 and named, said
    logs = Path(named.group(1))
    try:
        assert logs.name.startswith("populace-replicas-")
        assert "unrecognized arguments: --no-such-option" in next(logs.glob("*.log")).read_text()
    finally:
        shutil.rmtree(logs, ignore_errors=True)
