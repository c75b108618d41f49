"""`populace auth host|replicas`: NATS users narrowed to one agent-host or one replica set."""

# No `from __future__ import annotations` (typer evaluates string ones at each start: populace.cli.main)
from pathlib import Path
from typing import Annotated

import typer

from populace.cli import display
from populace.cli.common import fail

app = typer.Typer(help="NATS users (deploy/nats/auth.conf).", no_args_is_help=True, rich_markup_mode=None)


@app.command("host")
def auth_host(
    host_id: Annotated[str, typer.Argument(help="the agent-host's id (POPULACE_HOST_ID); its NATS user's name")],
    conf: Annotated[Path, typer.Option(help="the NATS authorization file whose agent-host user is narrowed")] = Path(
        "deploy/nats/auth.conf"),
    password: Annotated[str | None, typer.Option(help="default: a new random one")] = None,
) -> None:
    """Print a NATS user for one agent-host, allowed to publish only its own outcomes, partials
    and reports and to read only its own inboxes, then the settings the host runs with. Add
    the block to the file's `users` and reload the server (`nats-server --signal reload`)."""
    import secrets

    from populace.core.hostauth import HostAuthError, host_user

    if not conf.is_file():
        fail(f"--conf: {conf} is not a file")
    pw = password or secrets.token_urlsafe(24)
    try:
        block = host_user(conf.read_text(), host_id, pw)
    except HostAuthError as err:
        fail(str(err))
    print(block)
    display.console.print(f"# on the host: POPULACE_HOST_ID={host_id} POPULACE_NATS_USER={host_id} "
                          f"POPULACE_NATS_PASSWORD={pw}", markup=False, highlight=False)


@app.command("replicas")
def auth_replicas(
    set_name: Annotated[str, typer.Argument(metavar="SET", help="the replica set's name; its NATS user is "
                                                                "replicas-SET")],
    conf: Annotated[Path, typer.Option(help="the NATS authorization file whose replicas user is narrowed")] = Path(
        "deploy/nats/auth.conf"),
    password: Annotated[str | None, typer.Option(help="default: a new random one")] = None,
) -> None:
    """Print a NATS user for one replica set, `replicas-SET`, allowed to write only its own keys
    in KV `replicas` (which no other user may write, overwrite or delete), then the settings
    `populace replicas …` runs with. Add the block to the file's `users` and reload the server."""
    import secrets

    from populace.core.replicaauth import ReplicaAuthError, set_user, user_of

    if not conf.is_file():
        fail(f"--conf: {conf} is not a file")
    pw = password or secrets.token_urlsafe(24)
    try:
        block = set_user(conf.read_text(), set_name, pw)
    except ReplicaAuthError as err:
        fail(str(err))
    print(block)
    display.console.print(f"# for `populace replicas …`: POPULACE_NATS_USER={user_of(set_name)} "
                          f"POPULACE_NATS_PASSWORD={pw}", markup=False, highlight=False)
