"""Population configs: a YAML file that declares who the agents are.

A population config declares how many agents there are and the distribution of each
demographic attribute. :func:`load_population` reads one from YAML,
:func:`parse_population` validates already-parsed data; both return a
:class:`PopulationConfig` or raise :class:`PopulationError`, whose message starts with the
dotted path of the offending field (one line per problem)::

    attributes.education.weights: weights must sum to 1 (got 0.9)

Schema
------
::

    name: education-study        # required, free text
    description: ...             # optional, free text
    total: 50                    # required, integer >= 1 (the CLI's --count overrides it)
    seed: 0                      # optional, integer (default 0); same seed -> same profiles
    attributes:                  # required, ordered: name -> attribute (at least one)

      # categorical, exact quotas: counts >= 0 that sum to `total` exactly
      education:
        quotas: {elementary school: 10, high school: 10, bachelor's: 10, master's: 10, Ph.D.: 10}

      # categorical, weights: >= 0, summing to 1 (+-1e-6)
      gender:
        weights: {female: 0.5, male: 0.5}

      # numeric: exactly one of uniform / normal / bins, plus `integer` (default false)
      age:
        normal: {mean: 40, std: 12, min: 18, max: 80}   # bounds required, std > 0, min < max
        integer: true
      income:
        uniform: {min: 10000, max: 90000}
      height:
        bins:                                           # bin weights sum to 1
          - {min: 150, max: 170, weight: 0.5}
          - {min: 170, max: 190, weight: 0.5}

      # conditional (categorical given an earlier categorical or conditional attribute):
      # one weight mapping per parent category, every parent category covered, each
      # mapping summing to 1. Child categories left out of a mapping have weight 0.
      occupation:
        given: education
        weights_by:
          Ph.D.: {game theory professor: 0.5, economist: 0.5}
          ...

A mapping with `weights` or `quotas` is categorical, one with `uniform`, `normal` or
`bins` is numeric, one with `given`/`weights_by` is conditional; mixing the keys of two
kinds is an error, and so is any key not listed here. Duplicate keys anywhere in the file
(for instance the same category twice) are errors.

How each kind is sampled (see :mod:`populace.population.sampling`): categorical and
conditional counts are allocated *exactly* (largest remainder), numeric values are seeded
draws — the normal distribution is truncated to its bounds exactly (never clipped), and
``bins`` are allocated exactly per bin then drawn uniformly inside each bin.

Numeric bounds: ``uniform`` and ``normal`` values lie in ``[min, max]``; with
``integer: true`` they are whole numbers in ``[ceil(min), floor(max)]``. A bin covers
``[min, max]``; with ``integer: true`` its bounds must be whole numbers and the bin holds the
integers ``min..max`` inclusive (so ``18-29, 30-49`` do not overlap; ``min == max`` is a
one-value bin). Bins may not overlap.
"""

from __future__ import annotations

import hashlib
import json
import math
from itertools import pairwise
from pathlib import Path
from statistics import NormalDist
from typing import Annotated, Any, ClassVar

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    model_validator,
)

from populace.core.yamlload import YamlLimitError, read_text, short_repr
from populace.population.errors import PopulationError
from populace.population.yamlio import DuplicateKeyError, load_strict

__all__ = [
    "WEIGHT_TOLERANCE",
    "BinSpec",
    "CategoricalAttribute",
    "ConditionalAttribute",
    "NormalSpec",
    "NumericAttribute",
    "PopulationConfig",
    "PopulationError",
    "UniformSpec",
    "config_hash",
    "load_population",
    "parse_population",
    "parse_population_yaml",
]

WEIGHT_TOLERANCE = 1e-6
"""How far a set of weights may be from summing to 1."""

# A normal whose bounds keep less than this share of its mass is rejected as a config error.
_MIN_NORMAL_MASS = 1e-9


# --------------------------------------------------------------------------- field types

def _check_weight_sum(weights: dict[str, float]) -> dict[str, float]:
    if not weights:
        raise ValueError("list at least one category")
    s = math.fsum(weights.values())
    if abs(s - 1.0) > WEIGHT_TOLERANCE:
        raise ValueError(f"weights must sum to 1 (got {s:.10g})")
    return weights


def _check_nonempty(counts: dict[str, int]) -> dict[str, int]:
    if not counts:
        raise ValueError("list at least one category")
    return counts


Weight = Annotated[float, Field(ge=0, strict=True, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, strict=True)]
Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Name = Annotated[str, Field(min_length=1)]
WeightMap = Annotated[dict[str, Weight], AfterValidator(_check_weight_sum)]
CountMap = Annotated[dict[str, Count], AfterValidator(_check_nonempty)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------- attributes

class CategoricalAttribute(_Strict):
    """A categorical attribute: exactly one of ``weights`` or ``quotas``."""

    kind: ClassVar[str] = "categorical"

    weights: WeightMap | None = None
    quotas: CountMap | None = None

    @model_validator(mode="after")
    def _one_of(self) -> CategoricalAttribute:
        if (self.weights is None) == (self.quotas is None):
            got = "both" if self.weights is not None else "neither"
            raise ValueError(f"give exactly one of weights or quotas (got {got})")
        return self

    def categories(self) -> list[str]:
        return list(self.weights if self.weights is not None else self.quotas)  # type: ignore[arg-type]


class UniformSpec(_Strict):
    min: Number
    max: Number

    @model_validator(mode="after")
    def _order(self) -> UniformSpec:
        if not self.min < self.max:
            raise ValueError(f"min must be below max (got min={self.min:g}, max={self.max:g})")
        return self


class NormalSpec(_Strict):
    mean: Number
    std: Annotated[float, Field(gt=0, strict=True, allow_inf_nan=False)]
    min: Number
    max: Number

    @model_validator(mode="after")
    def _bounds(self) -> NormalSpec:
        if not self.min < self.max:
            raise ValueError(f"min must be below max (got min={self.min:g}, max={self.max:g})")
        nd = NormalDist(self.mean, self.std)
        if nd.cdf(self.max) - nd.cdf(self.min) < _MIN_NORMAL_MASS:
            raise ValueError(
                f"bounds [{self.min:g}, {self.max:g}] keep almost none of the mass of "
                f"normal(mean={self.mean:g}, std={self.std:g})"
            )
        return self


class BinSpec(_Strict):
    min: Number
    max: Number
    weight: Weight

    @model_validator(mode="after")
    def _order(self) -> BinSpec:
        if self.min > self.max:
            raise ValueError(f"min must not exceed max (got min={self.min:g}, max={self.max:g})")
        return self


def _check_bins(bins: list[BinSpec]) -> list[BinSpec]:
    if not bins:
        raise ValueError("list at least one bin")
    s = math.fsum(b.weight for b in bins)
    if abs(s - 1.0) > WEIGHT_TOLERANCE:
        raise ValueError(f"bin weights must sum to 1 (got {s:.10g})")
    return bins


class NumericAttribute(_Strict):
    """A numeric attribute: exactly one of ``uniform``, ``normal`` or ``bins``."""

    kind: ClassVar[str] = "numeric"

    uniform: UniformSpec | None = None
    normal: NormalSpec | None = None
    bins: Annotated[list[BinSpec], AfterValidator(_check_bins)] | None = None
    integer: Annotated[bool, Field(strict=True)] = False

    @model_validator(mode="after")
    def _one_of(self) -> NumericAttribute:
        given = [k for k in ("uniform", "normal", "bins") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one of uniform, normal or bins (got {', '.join(given) or 'none'})"
            )
        if self.bins is not None:
            self._check_bin_layout()
        elif self.integer:
            spec = self.uniform or self.normal
            if math.ceil(spec.min) > math.floor(spec.max):  # type: ignore[union-attr]
                raise ValueError(
                    f"{given[0]}: no whole number lies in [{spec.min:g}, {spec.max:g}]"  # type: ignore[union-attr]
                )
        return self

    def _check_bin_layout(self) -> None:
        bins = self.bins or []
        for i, b in enumerate(bins):
            if self.integer and not (b.min.is_integer() and b.max.is_integer()):
                raise ValueError(f"bins.{i}: with integer: true, min and max must be whole numbers")
            if not self.integer and not b.min < b.max:
                raise ValueError(f"bins.{i}: min must be below max (got min={b.min:g}, max={b.max:g})")
        order = sorted(range(len(bins)), key=lambda i: bins[i].min)
        for prev, cur in pairwise(order):
            a, b = bins[prev], bins[cur]
            if b.min < a.max or (self.integer and b.min <= a.max):
                raise ValueError(f"bins.{cur}: overlaps bins.{prev}")

    @property
    def distribution(self) -> str:
        return "uniform" if self.uniform else "normal" if self.normal else "bins"


class ConditionalAttribute(_Strict):
    """A categorical attribute whose weights depend on an earlier categorical attribute."""

    kind: ClassVar[str] = "conditional"

    given: Name
    weights_by: Annotated[dict[str, WeightMap], Field(min_length=1)]

    def categories(self) -> list[str]:
        seen: dict[str, None] = {}
        for inner in self.weights_by.values():
            for c in inner:
                seen.setdefault(c, None)
        return list(seen)


_KIND_KEYS = {
    "categorical": ("weights", "quotas"),
    "numeric": ("uniform", "normal", "bins"),
    "conditional": ("given", "weights_by"),
}


def _attribute_kind(value: Any) -> str:
    if isinstance(value, BaseModel):
        return {"categorical": "categorical", "numeric": "numeric",
                "conditional": "conditional"}.get(getattr(value, "kind", ""), "invalid")
    if not isinstance(value, dict):
        return "invalid"
    kinds = [k for k, keys in _KIND_KEYS.items() if any(key in value for key in keys)]
    return kinds[0] if len(kinds) == 1 else "invalid"


class _InvalidAttribute(_Strict):
    """Never valid: explains why a value is none of the attribute kinds."""

    @model_validator(mode="before")
    @classmethod
    def _explain(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            raise ValueError(f"an attribute must be a mapping (got {value!r})")
        found = {k: [key for key in keys if key in value] for k, keys in _KIND_KEYS.items()}
        found = {k: v for k, v in found.items() if v}
        if not found:
            raise ValueError(
                "an attribute needs weights or quotas (categorical), uniform, normal or bins "
                f"(numeric), or given with weights_by (conditional); got keys {sorted(value)}"
            )
        mix = " and ".join(f"{k} ({', '.join(v)})" for k, v in found.items())
        raise ValueError(f"mixes keys of {mix} attributes; use one kind")


Attribute = Annotated[
    (
        Annotated[CategoricalAttribute, Tag("categorical")]
        | Annotated[NumericAttribute, Tag("numeric")]
        | Annotated[ConditionalAttribute, Tag("conditional")]
        | Annotated[_InvalidAttribute, Tag("invalid")]
    ),
    Discriminator(_attribute_kind),
]
_TAGS = {"categorical", "numeric", "conditional", "invalid"}


# --------------------------------------------------------------------------- the config

class PopulationConfig(_Strict):
    """A validated population config (see the module docstring for the YAML schema)."""

    name: Name
    description: str = ""
    total: Annotated[int, Field(ge=1, strict=True)]
    seed: Annotated[int, Field(strict=True)] = 0
    attributes: dict[Name, Attribute]

    @model_validator(mode="after")
    def _cross_field(self) -> PopulationConfig:
        problems: list[str] = []
        if not self.attributes:
            problems.append("attributes: declare at least one attribute")
        names = list(self.attributes)
        for pos, (name, attr) in enumerate(self.attributes.items()):
            where = f"attributes.{name}"
            if isinstance(attr, CategoricalAttribute) and attr.quotas is not None:
                s = sum(attr.quotas.values())
                if s != self.total:
                    problems.append(
                        f"{where}.quotas: quotas must sum to total ({self.total}) (got {s})"
                    )
            elif isinstance(attr, ConditionalAttribute):
                problems.extend(self._check_condition(where, name, pos, attr, names))
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def _check_condition(self, where: str, name: str, pos: int,
                         attr: ConditionalAttribute, names: list[str]) -> list[str]:
        parent_name = attr.given
        if parent_name == name:
            return [f"{where}.given: an attribute cannot depend on itself"]
        if parent_name not in self.attributes:
            return [(f"{where}.given: unknown attribute {parent_name!r} "
                     f"(declared: {', '.join(names)})")]
        if names.index(parent_name) > pos:
            return [(f"{where}.given: {parent_name!r} is declared after {name!r}; "
                     "declare the parent attribute first")]
        parent = self.attributes[parent_name]
        if isinstance(parent, NumericAttribute):
            return [(f"{where}.given: {parent_name!r} is numeric; "
                     "a condition needs a categorical attribute")]
        parent_cats = parent.categories()  # type: ignore[union-attr]
        problems = []
        for key in attr.weights_by:
            if key not in parent_cats:
                problems.append(f"{where}.weights_by.{key}: {key!r} is not a category of "
                                f"{parent_name!r} (categories: {', '.join(parent_cats)})")
        missing = [c for c in parent_cats if c not in attr.weights_by]
        if missing:
            problems.append(f"{where}.weights_by: no weights for {parent_name} "
                            f"{'category' if len(missing) == 1 else 'categories'} "
                            f"{', '.join(repr(c) for c in missing)}")
        return problems

    def canonical_json(self) -> str:
        """The config as compact JSON: defaults left out, declaration order kept.

        Order is kept (not sorted) because it is meaningful: attributes are sampled in
        declaration order and ties in the exact allocation go to the earlier category.
        """
        data = self.model_dump(mode="json", exclude_defaults=True)
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def config_hash(cfg: PopulationConfig) -> str:
    """sha256 (hex) of :meth:`PopulationConfig.canonical_json`."""
    return hashlib.sha256(cfg.canonical_json().encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------- loading

def _dotted(loc: tuple[Any, ...]) -> str:
    parts = list(loc)
    # drop the tagged-union tag after attributes.<name>
    if len(parts) >= 3 and parts[0] == "attributes" and parts[2] in _TAGS:
        del parts[2]
    return ".".join(str(p) for p in parts)


_ALLOWED_KEYS: dict[str, tuple[str, ...]] = {
    "root": tuple(PopulationConfig.model_fields),
    "categorical": tuple(CategoricalAttribute.model_fields),
    "numeric": tuple(NumericAttribute.model_fields),
    "conditional": tuple(ConditionalAttribute.model_fields),
    "uniform": tuple(UniformSpec.model_fields),
    "normal": tuple(NormalSpec.model_fields),
    "bins": tuple(BinSpec.model_fields),
}


def _allowed_keys(loc: tuple[Any, ...]) -> tuple[str, ...] | None:
    """The keys allowed in the mapping that holds the unknown key at ``loc``."""
    n = len(loc)
    if n == 1:
        return _ALLOWED_KEYS["root"]
    if loc[0] != "attributes" or n < 4:
        return None
    tag = loc[2]
    if n == 4:
        return _ALLOWED_KEYS.get(tag)
    if tag == "numeric" and loc[3] in ("uniform", "normal") and n == 5:
        return _ALLOWED_KEYS[loc[3]]
    if tag == "numeric" and loc[3] == "bins" and n == 6:
        return _ALLOWED_KEYS["bins"]
    return None


def _short(value: Any, limit: int = 80) -> str:
    return short_repr(value, limit)  # bounded: never the whole of an alias bomb's expansion


def format_validation_error(err: ValidationError) -> str:
    """One line per problem, each starting with the dotted field path."""
    lines: list[str] = []
    for e in err.errors():
        msg = e["msg"].removeprefix("Value error, ")
        field = _dotted(e["loc"])
        if e["type"] == "value_error":
            # our own messages carry what they saw; some start with a sub-path ("bins.1: ...")
            for line in msg.splitlines():
                if not field:
                    lines.append(line)
                elif line.startswith(("bins.", "uniform:", "normal:")):
                    lines.append(f"{field}.{line}")
                else:
                    lines.append(f"{field}: {line}")
            continue
        field = field or "(population)"
        if e["type"] == "extra_forbidden":
            allowed = _allowed_keys(e["loc"])
            hint = f" (allowed: {', '.join(allowed)})" if allowed else ""
            lines.append(f"{field}: unknown key{hint}")
        elif e["type"] == "missing":
            lines.append(f"{field}: required key is missing")
        else:
            msg = msg.replace("Input should be", "must be")
            lines.append(f"{field}: {msg} (got {_short(e.get('input'))})")
    return "\n".join(dict.fromkeys(lines))  # de-duplicated, order kept


def parse_population(data: object) -> PopulationConfig:
    """Validate already-parsed data (a mapping) into a :class:`PopulationConfig`."""
    if isinstance(data, PopulationConfig):
        return data
    if not isinstance(data, dict):
        raise PopulationError(
            f"(population): the config must be a mapping of keys to values (got {_short(data)})"
        )
    try:
        return PopulationConfig.model_validate(data)
    except ValidationError as err:
        raise PopulationError(format_validation_error(err)) from None


def parse_population_yaml(text: str, source: str = "<string>") -> PopulationConfig:
    """Parse YAML text (duplicate keys rejected) into a :class:`PopulationConfig`."""
    try:
        data = load_strict(text)
    except DuplicateKeyError as err:
        raise PopulationError(str(err)) from None
    except YamlLimitError as err:
        raise PopulationError(f"{source}: {err}") from None
    except yaml.YAMLError as err:
        raise PopulationError(f"{source}: not valid YAML: {err}") from None
    return parse_population(data)


def load_population(path: str | Path) -> PopulationConfig:
    """Read and validate a population config file."""
    p = Path(path)
    try:
        text = read_text(p)
    except OSError as err:
        raise PopulationError(f"{p}: cannot read ({err.strerror or err})") from None
    except UnicodeDecodeError as err:
        raise PopulationError(f"{p}: not UTF-8 text (byte {err.start})") from None
    except YamlLimitError as err:
        raise PopulationError(f"{p}: {err}") from None
    return parse_population_yaml(text, source=str(p))
