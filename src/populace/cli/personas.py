"""`populace personas generate`: populations and their personas."""

# No `from __future__ import annotations` (typer evaluates string ones at each start: populace.cli.main)
from pathlib import Path
from typing import Annotated

import typer

from populace.cli import checks, display
from populace.cli.choices import PersonaModel
from populace.cli.common import fail

app = typer.Typer(help="Populations and personas.", no_args_is_help=True, rich_markup_mode=None)


@app.command("generate")
def personas_generate(
    config: Annotated[Path, typer.Argument(help="population config (YAML), e.g. examples/population/education.yaml")],
    out: Annotated[Path, typer.Option(help="JSONL file to write: one {profile, persona, provenance} per line")],
    count: Annotated[int | None, typer.Option(help="agents (overrides the config's total)")] = None,
    model: Annotated[PersonaModel, typer.Option(
                                       help="template (no LLM), local (SmolLM2), sim or openai")] = "template",
    unique: Annotated[int | None, typer.Option(help="generate K personas and assign them to the agents by "
                                                    "profile")] = None,
    seed: Annotated[int | None, typer.Option(help="overrides the config's seed")] = None,
    nats: Annotated[str | None, typer.Option("--nats", help="use a running stack (default: start one)")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="prompts per gateway request")] = 16,
) -> None:
    """Sample profiles with exact quotas and turn each into a persona (an LLM meta-prompt
    through the gateway, or templates for very large N)."""
    from populace.client.personas import PersonaGenerationError, PopulationError, generate

    checks.output_file(out, "--out")
    try:
        res = generate(config, out, count, model, unique, seed, nats, concurrency, show_progress=True)
    except PopulationError as err:
        fail(str(err))
    except ValueError as err:
        fail(str(err))
    except PersonaGenerationError as err:
        fail(str(err), code=1)
    display.out.print(f"wrote {res.count:,} personas to {res.path} in {res.seconds:.1f}s "
                      f"({res.category_attribute}: {dict(res.categories)})")
    if model != "template":
        display.out.print(f"{res.llm}/{res.unique} from {res.model_id} ({res.llm_valid_first_try} on the first try, "
                          f"{res.regenerated} regenerated, {res.fallbacks} template fallbacks, "
                          f"{res.duplicates_removed} duplicates regenerated)")
