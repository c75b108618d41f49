"""Services start fast: a service process loads what it serves with, not the analysis library's
statistics and plots (scipy and plotly took the recorder seconds to import at every start, and
every private stack, `populace up` and each end-to-end test waited on it)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# loaded by reports and statistics only; a service that reads one imports it where it reads
HEAVY = ("scipy", "plotly")


def test_no_service_loads_the_analysis_libraries():
    # one interpreter builds every service in turn, noting what each build added
    probe = ("import sys, json\nfrom populace.core import serve\nloaded = {}\n"
             "for name in serve.names():\n"
             "    before = set(sys.modules)\n    serve.build(name)\n"
             "    loaded[name] = sorted(set(sys.modules) - before)\n"
             "print(json.dumps(loaded))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=180, check=True)
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(loaded) >= {"orchestrator", "environment", "gateway", "recorder", "agent-host"}
    heavy = {name: sorted({h for h in HEAVY for m in modules if m == h or m.startswith(f"{h}.")})
             for name, modules in loaded.items()}
    assert heavy == {name: [] for name in loaded}


def test_the_analysis_package_still_exports_every_name():
    import populace.analysis as analysis

    for name in analysis.__all__:
        assert getattr(analysis, name) is not None, name
    with pytest.raises(AttributeError):
        analysis.no_such_name  # noqa: B018
