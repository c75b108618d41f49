"""A copy of an example scenario with some keys changed, written under a test's own directory,
never into the tree (a copy written beside the original was once committed by a `git add -A`
made while the suite ran). Its population file is named by its absolute path, so the copy
resolves it as the original does."""

from __future__ import annotations

import itertools
from pathlib import Path

import yaml

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
_copies = itertools.count()


def example_copy(directory: Path, name: str, **changes) -> Path:
    data = {**yaml.safe_load((EXAMPLES / name).read_text()), **changes}
    population = data.get("population")
    if isinstance(population, dict) and isinstance(population.get("config"), str):
        data["population"] = {**population, "config": str(EXAMPLES / population["config"])}
    path = directory / f"{Path(name).stem}-copy-{next(_copies)}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path
