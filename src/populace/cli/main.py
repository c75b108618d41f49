"""`populace` — run populations of LLM agents on NATS JetStream.

The root command, its callback (--version) and the table of contents: each family of commands
lives in a room of its own, a typer module here, registered below in the order `populace --help`
lists them.

    stack      service, demo, up              services and whole stacks in the foreground
    runs       run, cancel, resume, follow,   a run's life on a stack
               fork, rerun
    web        manager                        the web application
    scenarios  simulations, validate, sweep   what can be played, and plans of runs
    reading    results, report, export        reading recorded runs
    bench, replicas, personas, auth, nodes    groups (`populace bench …`), one module each;
    nodes, interviews                         also `populace node` and `populace interview`

What several rooms share is in populace.cli.common (exits, --set, the DuckDB file) and
populace.cli.playing (private stacks, following a run, its rounds table). Imports point down:
rooms import those, never this module.
"""

# No `from __future__ import annotations`: typer reads every command's annotations at each start,
# and string ones cost it an eval (and a compile) each, most of building the command tree.
from typing import Annotated

import typer

# every room imports only typer and the CLI's own light modules at the top; the rest is imported
# where a command needs it, so `populace --version` and `--help` start fast (tests/unit/test_cli_imports.py)
from populace.cli import auth, bench, interviews, nodes, personas, reading, replicas, runs, scenarios, stack, web

# Help and usage errors in click's plain format (rich_markup_mode=None, on every sub-app too):
# typer's rich format imports rich, markdown-it and pygments and lays out panels, which doubled
# `populace --help`'s time. Options and texts are the same; the boxes and colours are gone, and the
# list of commands shows each one's first sentence, cut to fit the line.
app = typer.Typer(help="Populace: populations of LLM agents as event-driven microservices on NATS JetStream.",
                  no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None)
# `populace node` is the daemon (one per machine); `populace nodes …` asks nodes for things
app.command("node")(nodes.node)
app.command("interview")(interviews.interview)
for room in (stack, runs, web, scenarios, reading):  # nameless: their commands join the root's, in this order
    app.add_typer(room.app)
app.add_typer(bench.app, name="bench")
app.add_typer(replicas.app, name="replicas")
app.add_typer(personas.app, name="personas")
app.add_typer(auth.app, name="auth")
app.add_typer(nodes.nodes_app, name="nodes")


def _version(show: bool) -> None:
    if show:
        from importlib.metadata import version

        typer.echo(f"populace {version('populace')}")  # plain: rich is not imported for this
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="print the version and exit")] = False,
) -> None:
    """Populace: populations of LLM agents as event-driven microservices on NATS JetStream."""


if __name__ == "__main__":  # pragma: no cover
    app()
