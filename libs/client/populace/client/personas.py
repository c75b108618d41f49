"""`populace personas generate` as a library: a population config → a personas JSONL file.

Two ways to build a persona from a sampled profile:

* **template** — fixed rules, no LLM (:func:`populace.population.template_records`); 100,000
  personas take about two seconds.
* **LLM** (``local``: SmolLM2 on llama.cpp; ``sim`` / ``openai``: whatever replicas of that
  backend the stack at ``nats`` has) — through the inference gateway
  (:mod:`populace.population.over_nats`). Without ``nats`` a private stack (embedded NATS, the
  services, ``replicas`` llama.cpp or sim replicas; logs and DuckDB file in a temporary
  directory) is started and stopped around the run.

A persona whose :data:`~populace.population.generation.MAX_TRIES` tries all failed is marked
``provenance.mode = "template-fallback"`` with the ``reason`` of the last failure.

Output: one JSON object per line, ``{"profile", "persona", "provenance"}`` (see
:mod:`populace.population.personas`). LLM provenance: ``mode`` ("llm"), ``prompt_version``
(:data:`~populace.population.generation.PROMPT_VERSION`), ``model`` (the replicas' model
id), ``backend``, ``seed`` (the run seed), ``sampling_seed`` and ``temperature`` of the
accepted answer, ``attempts``, ``rejected`` (why earlier tries were not kept),
``config_hash``, ``population``, ``run_id``, ``index``; with ``--unique`` also ``unique``,
``persona_index``, ``persona_profile`` and ``same_categories``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from populace.population import (
    TEMPLATE_PROMPT_VERSION,
    PopulationConfig,
    PopulationError,
    config_hash,
    load_population,
    persona_record,
    sample_profiles,
    template_persona,
    template_records,
    write_jsonl,
)
from populace.population.generation import (
    PROMPT_VERSION,
    assign_unique,
    attribute_kinds,
    category_counts,
    fallback_persona,
    reason_kind,
)
from populace.population.over_nats import PersonaGenerationError, generate_over_nats

__all__ = [
    "LLM_MODELS",
    "MODELS",
    "GenerateResult",
    "PersonaGenerationError",
    "PopulationError",
    "generate",
]

MODELS = ("template", "local", "sim", "openai")
LLM_MODELS = ("local", "sim", "openai")


@dataclass
class GenerateResult:
    """What `populace personas generate` did, for the CLI to print."""

    count: int  # records written (agents)
    path: Path
    seconds: float
    model: str  # the --model asked for: template, local, sim or openai
    model_id: str | None = None  # replica model id(s) that answered (LLM modes)
    unique: int = 0  # personas actually generated (K with --unique, else count)
    category_attribute: str | None = None  # the first categorical attribute
    categories: dict[str, int] = field(default_factory=dict)  # its value -> agents
    llm: int = 0  # generated personas that came from the LLM (provenance.mode == "llm")
    llm_valid_first_try: int = 0  # accepted on the first try: valid, consistent, not a duplicate
    regenerated: int = 0  # regeneration requests sent (one per re-asked persona and try)
    fallbacks: int = 0  # personas built by the template after MAX_TRIES failed tries
    duplicates_removed: int = 0  # answers rejected as duplicates (and regenerated)
    fallback_reasons: dict[str, int] = field(default_factory=dict)  # reason kind -> personas

    @property
    def llm_share(self) -> float:
        """Share of generated personas that came from the LLM (0 for template mode)."""
        return self.llm / self.unique if self.unique else 0.0


def _stop_stack(stack) -> None:
    """Stop the private stack. The replica launcher gets SIGINT first: on SIGINT it
    deregisters its replicas and exits in well under a second, whereas on SIGTERM (what
    `Stack.stop` sends) its NATS client is torn down before the deregistration, which then
    waits out a 5 s request timeout per replica."""
    import signal
    import subprocess

    for key, proc in stack.procs.items():
        if key.startswith("replicas-") and proc.poll() is None and not _ignores_sigint(proc.pid):
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass  # Stack.stop() escalates
    stack.stop()


def _ignores_sigint(pid: int) -> bool:
    """True when the process ignores SIGINT (inherited from a parent started in the
    background by a shell). Linux only; elsewhere assume it does not."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) & (1 << 1))  # bit 1 = signal 2
    except (OSError, ValueError, IndexError):
        pass
    return False


def _default_replicas() -> int:
    """One single-threaded llama.cpp replica per core (at most 4): for a 135M model this beats
    fewer replicas with more threads (measured on 2 cores: 29 vs 19 tokens/s per call)."""
    return max(1, min(os.cpu_count() or 1, 4))


def generate(config_path: Path, out: Path, count: int | None, model: str, unique: int | None,
             seed: int | None, nats: str | None, concurrency: int, show_progress: bool,
             *, replicas: int | None = None) -> GenerateResult:
    """Build personas for the population at ``config_path`` and write them to ``out``.

    ``count`` overrides the config's total; ``model`` is one of :data:`MODELS`; ``unique``
    generates that many personas and shares them out (:func:`assign_unique`); ``seed``
    overrides the config's seed (profiles and LLM sampling); ``nats`` is the URL of a running
    stack (LLM modes; None starts a private stack with ``replicas`` llama.cpp/sim replicas,
    default one per core, at most 4); ``concurrency`` is the most prompts per InferBatch.

    Raises :class:`PopulationError` for a bad config (message names the field),
    :class:`ValueError` for a bad option (message names ``--count``/``--unique``/``--model``/
    ``--concurrency``) and :class:`PersonaGenerationError` when the LLM path cannot run.
    """
    t0 = time.perf_counter()
    if model not in MODELS:
        raise ValueError(f"--model must be one of {', '.join(MODELS)} (got {model!r})")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise ValueError(f"--count must be an integer >= 1 (got {count!r})")
    if unique is not None and (isinstance(unique, bool) or not isinstance(unique, int) or unique < 1):
        raise ValueError(f"--unique must be an integer >= 1 (got {unique!r})")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"--concurrency must be an integer >= 1 (got {concurrency!r})")
    cfg = load_population(config_path)
    n = cfg.total if count is None else count
    if unique is not None and unique > n:
        raise ValueError(f"--unique {unique} is more than the {n} agents (--count or the config's total)")
    if model == "openai" and nats is None:
        raise ValueError("--model openai needs --nats URL of a stack with registered openai replicas")
    s = cfg.seed if seed is None else seed
    cats, nums = attribute_kinds(cfg)
    first_cat = cats[0] if cats else None
    profiles = sample_profiles(cfg, n, seed=s)
    out = Path(out)

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)  # progress on stderr, as the CLI's: stdout stays the command's result

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console, disable=not show_progress)
    result = GenerateResult(count=n, path=out, seconds=0.0, model=model, unique=unique or n,
                            category_attribute=first_cat, categories=category_counts(profiles, first_cat))

    if model == "template" and unique is None:
        with progress:
            task = progress.add_task("personas (template)", total=n)

            def counted():
                for i, rec in enumerate(template_records(cfg, seed=s, profiles=profiles), 1):
                    if i % 5000 == 0:
                        progress.update(task, completed=i)
                    yield rec
                progress.update(task, completed=n)

            write_jsonl(out, counted())
        result.seconds = time.perf_counter() - t0
        return result

    assignment = assign_unique(profiles, unique, cats, nums) if unique is not None else None
    gen_profiles = [profiles[r] for r in assignment.reps] if assignment else profiles
    chash = config_hash(cfg)
    base = {"config_hash": chash, "population": cfg.name, "seed": s}

    if model == "template":
        personas = [template_persona(p, j, s) for j, p in enumerate(gen_profiles)]
        provs = [{"mode": "template", "prompt_version": TEMPLATE_PROMPT_VERSION, "model": None, **base}
                 for _ in gen_profiles]
    else:
        personas, provs = _llm_personas(cfg, model, gen_profiles, s, nats, concurrency, progress,
                                        result, base, unique, replicas)

    records = []
    for i, profile in enumerate(profiles):
        j = assignment.persona_of[i] if assignment else i
        prov = {**provs[j], "index": i}
        if assignment:
            prov.update(unique=unique, persona_index=j, persona_profile=gen_profiles[j],
                        same_categories=assignment.exact[i])
        records.append(persona_record(profile, personas[j], prov))
    write_jsonl(out, records)
    result.seconds = time.perf_counter() - t0
    return result


def _llm_personas(cfg: PopulationConfig, backend: str, gen_profiles: list[dict], seed: int,
                  nats: str | None, concurrency: int, progress, result: GenerateResult,
                  base: dict, unique: int | None, replicas: int | None) -> tuple[list[dict], list[dict]]:
    run_key = json.dumps([base["config_hash"], len(gen_profiles), seed, unique, backend, PROMPT_VERSION])
    run_id = "personas-" + hashlib.sha256(run_key.encode()).hexdigest()[:12]
    stack = None
    tmp = None
    url = nats
    if url is None:
        from populace.client.stack import Stack, StackError

        if backend == "local":  # before the stack: its replicas would wait on a build for minutes
            from populace.replicas import llamacpp

            try:
                llamacpp.ensure()
            except llamacpp.LlamaCppUnavailable as err:
                raise PersonaGenerationError(str(err)) from None
        count = replicas or _default_replicas()
        tmp = tempfile.mkdtemp(prefix="populace-personas-")
        stack = Stack(hosts=0, db=str(Path(tmp) / "personas.duckdb"), env={"POPULACE_STORAGE": "memory"},
                      log_dir=str(Path(tmp) / "logs"),
                      extra={f"replicas-{backend}": ["replicas", backend, "--count", str(count)]},
                      replicas=count)
    ok = False
    try:
        with progress:
            if stack is not None:
                starting = progress.add_task(f"starting NATS, gateway and {stack.replicas} {backend} replica(s)",
                                             total=None)
                try:
                    stack.start()
                    asyncio.run(stack.wait_ready(timeout=180))
                except StackError as err:
                    raise PersonaGenerationError(f"could not start the local stack: {err}") from None
                progress.update(starting, total=1, completed=1)
                url = stack.url
            outcomes, gen, model_id = asyncio.run(
                generate_over_nats(url, gen_profiles, backend, seed, run_id, concurrency, progress))  # type: ignore[arg-type]
        ok = True
    finally:
        if stack is not None:
            _stop_stack(stack)
        if tmp is not None and ok:  # on failure the service logs stay for the error message
            shutil.rmtree(tmp, ignore_errors=True)

    personas, provs = [], []
    reasons: Counter[str] = Counter()
    for j, (profile, o) in enumerate(zip(gen_profiles, outcomes)):
        common = {"backend": backend, **base, "attempts": o.attempts, "run_id": run_id}
        if o.rejected:
            common["rejected"] = o.rejected
        if o.persona is not None:
            personas.append(o.persona)
            provs.append({"mode": "llm", "prompt_version": PROMPT_VERSION, "model": model_id, **common,
                          "sampling_seed": o.sampling_seed, "temperature": o.temperature})
            result.llm += 1
            result.llm_valid_first_try += o.first_try
        else:
            personas.append(fallback_persona(profile, j, seed))
            provs.append({"mode": "template-fallback", "prompt_version": TEMPLATE_PROMPT_VERSION,
                          "model": None, "llm_model": model_id, "llm_prompt_version": PROMPT_VERSION, **common,
                          "reason": o.reason or "no answer"})
            result.fallbacks += 1
            reasons[reason_kind(o.reason or "no answer")] += 1
    result.model_id = model_id
    result.regenerated = gen.regenerated
    result.duplicates_removed = gen.duplicates_removed
    result.fallback_reasons = dict(reasons)
    return personas, provs
