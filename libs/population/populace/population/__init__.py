"""Populace populations: declare demographics in YAML, sample exact profiles, build personas.

Typical use::

    from populace.population import load_population, sample_profiles, template_records, write_jsonl

    cfg = load_population("examples/population/education.yaml")
    profiles = sample_profiles(cfg, count=100_000)          # quotas met exactly
    write_jsonl("personas.jsonl", template_records(cfg, profiles=profiles))
"""

from populace.population.allocation import largest_remainder
from populace.population.config import (
    BinSpec,
    CategoricalAttribute,
    ConditionalAttribute,
    NormalSpec,
    NumericAttribute,
    PopulationConfig,
    UniformSpec,
    config_hash,
    load_population,
    parse_population,
    parse_population_yaml,
)
from populace.population.errors import PopulationError
from populace.population.generation import (
    Assignment,
    assign_unique,
    consistency_problem,
    dedupe_key,
    persona_schema,
)
from populace.population.jsonl import parse_personas, read_jsonl, write_jsonl
from populace.population.personas import (
    TEMPLATE_PROMPT_VERSION,
    persona_record,
    template_persona,
    template_provenance,
    template_records,
)
from populace.population.sampling import sample_profiles

__all__ = [
    "TEMPLATE_PROMPT_VERSION",
    "Assignment",
    "BinSpec",
    "CategoricalAttribute",
    "ConditionalAttribute",
    "NormalSpec",
    "NumericAttribute",
    "PopulationConfig",
    "PopulationError",
    "UniformSpec",
    "assign_unique",
    "config_hash",
    "consistency_problem",
    "dedupe_key",
    "largest_remainder",
    "load_population",
    "parse_personas",
    "parse_population",
    "parse_population_yaml",
    "persona_record",
    "persona_schema",
    "read_jsonl",
    "sample_profiles",
    "template_persona",
    "template_provenance",
    "template_records",
    "write_jsonl",
]
