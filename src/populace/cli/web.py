"""`populace manager`: the web application, on the stack at --nats or a private one."""

# No `from __future__ import annotations` (typer evaluates string ones at each start: populace.cli.main)
from typing import Annotated

import typer

from populace.cli import checks, display
from populace.cli.common import NATS_ENV, fail
from populace.cli.playing import private_stack

app = typer.Typer(rich_markup_mode=None)  # its commands join the root's (populace.cli.main)


@app.command()
def manager(
    nats: Annotated[str | None, typer.Option("--nats", envvar=NATS_ENV, help="NATS URL of the stack to manage "
                                                "(default: start a private one)")] = None,
    port: Annotated[int, typer.Option(min=1, max=65535, help="HTTP port")] = 8080,
    host: Annotated[str, typer.Option(help="address to listen on (no token: loopback only)")] = "127.0.0.1",
    token: Annotated[str | None, typer.Option(envvar="POPULACE_MANAGER_TOKEN", show_default=False,
                                              help="access token every page and request asks for (the "
                                                   "variable is better: an option shows in `ps`)")] = None,
    hosts: Annotated[int, typer.Option(min=1, help="agent-host processes (private stack only)")] = 2,
    db: Annotated[str, typer.Option(help="DuckDB file (private stack only)")] = "populace.duckdb",
    jaeger: Annotated[str | None, typer.Option(envvar="POPULACE_JAEGER_URL", help="Jaeger's URL (e.g. "
                                               "http://localhost:16686): a run's page links its trace")] = None,
) -> None:
    """The web application: nodes and their processes, runs updating live, a run's rounds as
    they close, start a run from a scenario, cancel and resume. Serves until Ctrl-C."""
    from populace.manager import ManagerSettings, serve
    from populace.manager.access import bind_refusal

    token = (token or "").strip() or None
    if refusal := bind_refusal(host, token):
        fail(refusal)
    checks.free_port(port, "--host, --port", host)

    def serve_on(url: str) -> None:
        shown = f"[{host}]" if ":" in host else host
        access = "asks for its token" if token else "no token: loopback only"
        display.console.print(f"manager: http://{shown}:{port}/ ({access}; NATS {url}); Ctrl-C stops",
                              soft_wrap=True, markup=False, highlight=False)
        serve(ManagerSettings(nats_url=url, jaeger_url=jaeger, token=token), host=host, port=port)

    if nats is not None:
        serve_on(nats)
        return
    try:
        with private_stack({"dummy"}, 1, hosts, db) as url:
            serve_on(url)
    except KeyboardInterrupt:
        pass
