"""The fleet's libraries are an extra. `populace-sdk` alone installs what an author's simulation
needs (pydantic, numpy, structlog, pyyaml); NATS, FastStream, nats-server, OpenTelemetry,
Prometheus and Arrow come with `populace-core[fleet]` / `populace-sdk[fleet]`, which every
service, the client and the `populace` command request. A module that runs only on the fleet
says which extra to install when they are missing, instead of a bare "No module named 'nats'"."""

from __future__ import annotations

# what the `fleet` extras install (libs/core, libs/graph and libs/sdk's pyproject.toml), by import name
FLEET_LIBRARIES = frozenset({"nats", "faststream", "opentelemetry", "prometheus_client", "tenacity", "uvloop",
                             "pyarrow", "pymetis"})


def is_fleet_library(error: ModuleNotFoundError) -> bool:
    """Whether `error` is one of the fleet's libraries missing (not a bug's misspelt import)."""
    return (error.name or "").split(".")[0] in FLEET_LIBRARIES


def fleet_missing(what: str, error: ModuleNotFoundError, extra: str = "populace-sdk[fleet]") -> ModuleNotFoundError:
    """The error to raise when `what` (a module, or what a function does) needs a fleet library
    that is not installed: it names the library and the extra that installs it. Any other
    missing module is returned as it was."""
    if not is_fleet_library(error):
        return error
    return ModuleNotFoundError(
        f"{what} needs {error.name}, one of the fleet's libraries, which populace-sdk alone does not install: "
        f"pip install '{extra}' (or install the whole platform, `populace`)", name=error.name)
