"""The CLI starts fast: importing it, `populace --version` and `populace --help` load none of
the heavy libraries (their commands import them when they run), and the choices it spells out
for that (populace.cli.choices) are the ones the models validate."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import get_args

import pytest

# each takes tenths of a second to import (or pulls in what does); a command that needs one imports it
HEAVY = ("duckdb", "pyarrow", "nats", "faststream", "opentelemetry", "plotly", "scipy", "numpy", "networkx",
         "populace.core.contracts", "populace.core.settings", "populace.client", "populace.sdk",
         # and the lighter ones that still cost a start hundredths of a second: rich (and what
         # typer's rich help brings: markdown-it, pygments), asyncio, the replica launchers
         "rich", "markdown_it", "pygments", "asyncio", "populace.replicas", "populace.gateway")


def loaded_after(code: str) -> set[str]:
    """The heavy modules a fresh interpreter holds after running `code`."""
    probe = (f"import sys, json\ntry:\n    {code}\nexcept SystemExit:\n    pass\n"
             "print(json.dumps(sorted(sys.modules)), file=sys.__stderr__)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    modules = json.loads(done.stderr.strip().splitlines()[-1])
    return {h for h in HEAVY if any(m == h or m.startswith(f"{h}.") for m in modules)}


@pytest.mark.parametrize("code", [
    "import populace.cli.main",
    "from populace.cli.main import app; app(['--version'])",
    "from populace.cli.main import app; app(['--help'])",
    "from populace.cli.main import app; app(['nodes', '--help'])",
])
def test_the_cli_starts_without_the_heavy_libraries(code):
    assert loaded_after(code) == set()


def test_the_choices_are_the_ones_the_models_validate():
    from populace.cli import choices
    from populace.core.contracts import GatewaySpec, ModelConfig, ModelEndpoint, ReplicasSpec, RestartPolicy
    from populace.core.settings import Settings

    backends = get_args(ModelConfig.model_fields["backend"].annotation)
    assert get_args(choices.ModelBackend) == backends
    assert get_args(choices.DemoModel) == (*backends, "vllm")
    assert get_args(choices.PersonaModel) == ("template", *(b for b in backends if b != "dummy"))
    assert get_args(choices.Storage) == get_args(Settings.model_fields["storage"].annotation)
    assert get_args(choices.RestartMode) == get_args(RestartPolicy.model_fields["mode"].annotation)
    assert get_args(GatewaySpec.model_fields["router"].annotation) == (choices.Router, type(None))
    assert get_args(choices.ReplicaBackend) == get_args(ReplicasSpec.model_fields["backend"].annotation)
    assert set(get_args(choices.EndpointKind)) <= set(get_args(ModelEndpoint.model_fields["kind"].annotation))
    from populace.bench.llm import SERVERS

    assert get_args(choices.LlmServer) == SERVERS


# what an author's `import populace.sdk` must not pull in: the bus, its transport, tracing,
# metrics and Arrow are the fleet's (issue 40 wants pydantic and numpy only; structlog and
# pydantic-settings still come with the SDK's logger and settings)
FLEET = ("nats", "aiohttp", "faststream", "opentelemetry", "prometheus_client", "pyarrow", "duckdb")


def test_an_authors_sdk_import_loads_none_of_the_fleets_libraries():
    probe = ("import sys, json\nimport populace.sdk\n"
             "print(json.dumps(sorted(sys.modules)), file=sys.__stderr__)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    modules = json.loads(done.stderr.strip().splitlines()[-1])
    assert {h for h in FLEET if any(m == h or m.startswith(f"{h}.") for m in modules)} == set()
