"""`populace bench llm`: the real path measured against its replicas' own peak.

The same replicas (SmolLM2 on vLLM's CPU build or on llama.cpp, started here; or any
OpenAI-compatible endpoint given by its URL) answer one workload in two ways:

- **directly**: the simulation's own agents play in this process (`populace.sdk.local.run_local`),
  and each agent's call goes straight to the replicas over HTTP, exactly as the gateway sends it:
  the same system prompt, user prompt, answer schema as structured output, max_tokens,
  temperature and seed, through the gateway's own request builder (`populace.gateway.openai_api.chat`),
  with the gateway's one corrective re-ask of an invalid answer. A fixed number of calls are in
  flight per replica (workers pulling from one queue, so no replica idles while another has
  work); a sweep over that number keeps the best;
- **through Populace**: a private stack (NATS, orchestrator, environment, agent-hosts, gateway,
  recorder, each its own process) plays a run of the same agents on the same replicas (a
  `models:` entry the replicas are registered for, or the endpoint at its URL), recorded in DuckDB.

Both are decisions per second over the rounds' own time: a round's open to its result on the
stack, a round's first turn to its decision in process; neither counts start-up. Several rounds
let the prefix cache work (each agent's persona leads its prompt every round); vLLM's caches
are emptied before every measured run, so each starts cold alike.

The pure parts (the sweep's choice, a run's figures, the summary) are unit-tested; the rest needs
real replicas.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.table import Table

SERVERS = ("vllm", "llamacpp")
MODEL_NAME = "bench"  # the run model's name (rows, the manifest)
# The education study's population (examples/population/education.yaml) for any number of
# agents: five levels in exact quotas, template personas (name, age, gender, education and two
# traits) leading each agent's prompt.
POPULATION = """name: bench-education
total: {agents}
seed: 0
attributes:
  education:
    weights: {{elementary school: 0.2, high school: 0.2, "bachelor's": 0.2, "master's": 0.2, Ph.D.: 0.2}}
  age:
    normal: {{mean: 40, std: 14, min: 18, max: 80}}
    integer: true
  gender:
    weights: {{female: 0.5, male: 0.5}}
"""
# Calls in flight per replica the direct path tries: vLLM batches its sequences (32 and 64 still
# gained a little on this machine's CPU build); llama-cpp-python's server answers one at a time.
DEFAULT_SWEEP = (1, 2, 4, 8, 16, 32)
SERIAL_SWEEP = (1, 2, 4)
MAX_IN_FLIGHT = 4096


class BenchFailed(RuntimeError):
    """The bench could not measure (a replica did not start or stopped answering, a run did not
    complete): the message says which and where the logs are."""


# -- pure pieces (unit-tested) -----------------------------------------------------------------
@dataclass
class PathRun:
    """One measured pass of the workload, direct or through Populace."""

    path: str  # "direct" | "populace"
    concurrency: int  # calls in flight per replica (direct), the gateway's cap per replica (populace)
    decisions: int  # agents' calls answered (a re-ask is part of its decision)
    valid: int  # of them, valid answers (after the one re-ask)
    calls: int  # HTTP calls made, re-asks included
    prompt_tokens: int
    cached_tokens: int  # of the prompt tokens, those the server reported served from its prefix cache
    completion_tokens: int
    round_s: list[float]  # each round's time
    prefix_cache_hits: float | None = None  # vLLM's counters over the run (tokens), where it has them
    prefix_cache_queries: float | None = None
    load_before: list[float] = field(default_factory=list)  # the machine's load averages at the start
    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU seconds by process over the run
    run_id: str | None = None

    @property
    def seconds(self) -> float:
        return sum(self.round_s)

    @property
    def decisions_per_s(self) -> float:
        return self.decisions / self.seconds if self.seconds > 0 else 0.0

    @property
    def uncached_prompt_tokens_per_decision(self) -> float:
        return (self.prompt_tokens - self.cached_tokens) / self.decisions if self.decisions else 0.0

    @property
    def prefix_hit_rate(self) -> float | None:
        """The server's own counters where it has them (vLLM's /metrics), else the cached tokens it
        reported per call; None where it reports neither (llama-cpp-python's server)."""
        if self.prefix_cache_queries:
            return (self.prefix_cache_hits or 0.0) / self.prefix_cache_queries
        if self.cached_tokens and self.prompt_tokens:
            return self.cached_tokens / self.prompt_tokens
        return None

    @property
    def valid_share(self) -> float:
        return self.valid / self.decisions if self.decisions else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "seconds": round(self.seconds, 3), "decisions_per_s": round(self.decisions_per_s, 3),
                "uncached_prompt_tokens_per_decision": round(self.uncached_prompt_tokens_per_decision, 2),
                "prefix_hit_rate": _round(self.prefix_hit_rate, 4), "valid_share": round(self.valid_share, 4)}


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


def parse_sweep(text: str, kind: str = "vllm") -> tuple[int, ...]:
    """`--sweep 1,2,4` → (1, 2, 4), sorted and without repeats; empty: the kind's default. Raises
    ValueError saying what is wrong."""
    if not text.strip():
        return SERIAL_SWEEP if kind == "llamacpp" else DEFAULT_SWEEP
    levels = set()
    for item in text.split(","):
        item = item.strip()
        if not item.isdigit() or not 1 <= int(item) <= MAX_IN_FLIGHT:
            raise ValueError(f"{item!r} is not a number of calls in flight (1..{MAX_IN_FLIGHT}); "
                             "give them comma-separated, e.g. 1,2,4,8,16")
        levels.add(int(item))
    return tuple(sorted(levels))


def best_concurrency(sweep: Sequence[PathRun]) -> int:
    """The concurrency of the sweep's fastest run; of runs within 2% of it, the lowest (more in
    flight than the replicas need only adds latency)."""
    if not sweep:
        raise ValueError("the sweep measured nothing")
    top = max(r.decisions_per_s for r in sweep)
    return min(r.concurrency for r in sweep if r.decisions_per_s >= 0.98 * top)


def median_run(runs: Sequence[PathRun]) -> PathRun:
    """The run with the median decisions per second (the lower middle of an even count)."""
    if not runs:
        raise ValueError("no runs")
    ordered = sorted(runs, key=lambda r: r.decisions_per_s)
    return ordered[(len(ordered) - 1) // 2]


@dataclass
class LlmBenchResult:
    server: str  # vllm | llamacpp | the endpoint's kind
    model: str  # the served model id
    replicas: int
    direct_concurrency: int  # the sweep's choice, per replica
    populace_concurrency: int  # the gateway's cap per replica
    sweep: list[PathRun]
    direct: list[PathRun]  # at direct_concurrency, alternating with `populace`
    populace: list[PathRun]
    workload: dict
    machine: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def decisions_per_s(self) -> float:
        return statistics.median(r.decisions_per_s for r in self.populace)

    @property
    def direct_decisions_per_s(self) -> float:
        return statistics.median(r.decisions_per_s for r in self.direct)

    @property
    def ratio(self) -> float:
        d = self.direct_decisions_per_s
        return self.decisions_per_s / d if d else 0.0

    def summary(self) -> dict:
        """The headline keys: medians over the runs through Populace (its tokens, hit rate and
        validity: those of its median run), the direct path's median, and their ratio."""
        mid = median_run(self.populace)
        direct = median_run(self.direct)
        return {
            "decisions_per_s": round(self.decisions_per_s, 3),
            "direct_decisions_per_s": round(self.direct_decisions_per_s, 3),
            "ratio": round(self.ratio, 3),
            "uncached_prompt_tokens_per_decision": round(mid.uncached_prompt_tokens_per_decision, 2),
            "prefix_hit_rate": _round(mid.prefix_hit_rate, 4),
            "valid_share": round(mid.valid_share, 4),
            "model": self.model,
            "replicas": self.replicas,
            "server": self.server,
            "direct_concurrency": self.direct_concurrency,
            "populace_concurrency": self.populace_concurrency,
            "direct_uncached_prompt_tokens_per_decision": round(direct.uncached_prompt_tokens_per_decision, 2),
            "direct_prefix_hit_rate": _round(direct.prefix_hit_rate, 4),
            "direct_valid_share": round(direct.valid_share, 4),
        }

    def to_dict(self) -> dict:
        return {**self.summary(), "workload": self.workload, "machine": self.machine, "notes": self.notes,
                "sweep": [r.to_dict() for r in self.sweep], "direct_runs": [r.to_dict() for r in self.direct],
                "populace_runs": [r.to_dict() for r in self.populace]}

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)

    def table(self) -> Table:
        s = self.summary()
        t = Table(title=f"real model: {self.model} on {self.replicas} {self.server} replica(s), "
                        f"{self.workload.get('agents')} agents × {self.workload.get('rounds')} rounds")
        t.add_column("measure")
        t.add_column("through Populace", justify="right")
        t.add_column("direct", justify="right")
        hit = "—" if s["prefix_hit_rate"] is None else f"{s['prefix_hit_rate']:.3f}"
        dhit = "—" if s["direct_prefix_hit_rate"] is None else f"{s['direct_prefix_hit_rate']:.3f}"
        for k, a, b in [
            ("decisions/s (median)", f"{s['decisions_per_s']:.2f}", f"{s['direct_decisions_per_s']:.2f}"),
            ("Populace / direct", f"{s['ratio']:.1%}", ""),
            ("calls in flight per replica", str(self.populace_concurrency), str(self.direct_concurrency)),
            ("uncached prompt tokens per decision", f"{s['uncached_prompt_tokens_per_decision']:.1f}",
             f"{s['direct_uncached_prompt_tokens_per_decision']:.1f}"),
            ("prefix-cache hit rate", hit, dhit),
            ("valid answers", f"{s['valid_share']:.1%}", f"{s['direct_valid_share']:.1%}"),
        ]:
            t.add_row(k, a, b)
        t.add_row("sweep (direct decisions/s by calls in flight)",
                  ", ".join(f"{r.concurrency}: {r.decisions_per_s:.2f}" for r in self.sweep), "")
        return t


# -- where the calls go ---------------------------------------------------------------------------
@dataclass
class Endpoint:
    """The replicas both paths call: started here (`rs`, registered for the run model), or one
    OpenAI-compatible endpoint at its URL."""

    kind: str  # vllm | llamacpp | openai: the request's dialect (and whether /metrics has vLLM's counters)
    infos: list  # ReplicaInfo of each replica
    served: str  # the model id in requests
    rs: object | None = None  # the ReplicaSet started here
    base_url: str | None = None
    api_key_env: str | None = None
    resettable: bool = False  # vLLM started here in dev mode: its prefix caches can be emptied

    def model_entry(self, concurrency: int | None) -> dict:
        """The run's `models:` entry for these replicas."""
        entry: dict = {"name": MODEL_NAME, "kind": self.kind}
        if self.base_url is not None:
            entry.update(base_url=self.base_url, model=self.served)
            if self.api_key_env:
                entry["api_key_env"] = self.api_key_env
            if concurrency is not None:
                entry["limits"] = {"concurrency": concurrency}
        return entry


def chat_url(endpoint: Endpoint) -> str | None:
    if endpoint.base_url is None:
        return None
    from populace.core.contracts import ModelEndpoint

    return f"{ModelEndpoint(name=MODEL_NAME, kind='openai', base_url=endpoint.base_url).api_base}/chat/completions"


def auth_header(endpoint: Endpoint) -> dict[str, str]:
    key = os.environ.get(endpoint.api_key_env, "") if endpoint.api_key_env else ""
    return {"Authorization": f"Bearer {key}"} if key else {}


# -- the direct path -----------------------------------------------------------------------------
class DirectClient:
    """Calls sent straight to the replicas, `concurrency` in flight per replica: workers per
    replica take calls from one queue in order. Each call is the gateway's (the same body, seed
    and re-ask); its tokens and validity are counted."""

    def __init__(self, endpoint: Endpoint, model, concurrency: int, reasks: int = 1, timeout_s: float = 120.0) -> None:
        from populace.gateway.openai_api import ChatClient

        self.endpoint, self.model, self.concurrency = endpoint, model, concurrency
        self.reasks, self.timeout_s = reasks, timeout_s
        self.http = ChatClient(max(16, concurrency * len(endpoint.infos) * 2))
        self.url, self.auth = chat_url(endpoint), auth_header(endpoint)
        self.decisions = self.valid = self.calls = 0
        self.errors: list[str] = []  # calls no replica answered (the run's turns got them as failures)
        self.prompt_tokens = self.cached_tokens = self.completion_tokens = 0
        self._queue: asyncio.Queue | None = None
        self._workers: list[asyncio.Task] = []

    async def start(self) -> None:
        self._queue = asyncio.Queue()
        self._workers = [asyncio.create_task(self._work(info)) for info in self.endpoint.infos
                         for _ in range(self.concurrency)]

    async def stop(self) -> None:
        for w in self._workers:
            w.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        await self.http.aclose()

    def ask(self, system: str, schema: dict | None, prompt: str, key: int, seq: int) -> asyncio.Future:
        assert self._queue is not None, "start() first"
        fut = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((system, schema, prompt, key, seq, fut))
        return fut

    async def _work(self, info) -> None:
        assert self._queue is not None
        while True:
            system, schema, prompt, key, seq, fut = await self._queue.get()
            try:
                text = await self._decide(info, system, schema, prompt, key, seq)
            except Exception as err:  # the replica failed: the bench says so (never a made-up answer)
                self.errors.append(f"{type(err).__name__}: {err}")
                if not fut.done():
                    fut.set_exception(err)
                continue
            if not fut.done():
                fut.set_result(text)

    async def _decide(self, info, system: str, schema: dict | None, prompt: str, key: int, seq: int) -> str:
        from populace.gateway import schema_check
        from populace.gateway.dispatcher import call_seed
        from populace.gateway.openai_api import chat

        messages = [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
        seed = call_seed(self.model.seed, key, seq)
        text, valid = "", False
        for _ in range(1 + self.reasks):
            res = await chat(self.http, info, messages, schema=schema, max_tokens=self.model.max_tokens,
                             temperature=self.model.temperature, seed=seed, model=self.endpoint.served,
                             timeout=self.timeout_s, auth=self.auth, url=self.url)
            self.calls += 1
            self.prompt_tokens += res.prompt_tokens
            self.cached_tokens += res.cached_tokens
            self.completion_tokens += res.completion_tokens
            text = res.text
            valid = schema_check.check(text, schema)
            if valid or schema is None:
                break
            messages = [*messages, {"role": "assistant", "content": text},
                        {"role": "user", "content": schema_check.reask_message(schema)}]
        self.decisions += 1
        self.valid += valid
        return text


class DirectPort:
    """The LLM port of one round of the in-process run: each ask is a call of the DirectClient."""

    def __init__(self, client: DirectClient, system: str, schema: dict | None) -> None:
        self.client, self.system, self.schema = client, system, schema
        self.calls = 0
        self._seqs: dict = {}

    def ask(self, prompt: str, *, key: int, prefix_chars: int = 0, system: str | None = None,
            schema: dict | None = None) -> asyncio.Future:
        from populace.sdk.llm import call_tag

        self.calls += 1
        return self.client.ask(self.system if system is None else system, self.schema if schema is None else schema,
                               prompt, key, call_tag(self._seqs, key))

    def flush(self) -> None:
        pass


async def warm_up(prepared, endpoint: Endpoint, calls: int = 4) -> None:
    """A few calls with the run's system prompt and answer schema, not measured: what a fresh server
    does once (vLLM compiles the schema's grammar and caches it, llama.cpp faults its weights in)
    is not the first measured run's."""
    sim = prepared.resolved.instance("bench-warm-up", prepared.cast)
    client = DirectClient(endpoint, prepared.resolved.config.model, min(calls, 4))
    await client.start()
    try:
        system, schema = sim.request_system_prompt(), sim.request_schema()
        await asyncio.gather(*(client.ask(system, schema, "Report your number.", key, 0) for key in range(calls)))
    finally:
        await client.stop()


async def direct_run(prepared, endpoint: Endpoint, concurrency: int, reasks: int = 1) -> PathRun:
    """The run's agents in this process, their calls straight to the replicas."""
    from populace.sdk.local import run_local

    config = prepared.resolved.config
    client = DirectClient(endpoint, config.model, concurrency, reasks)
    starts: dict[int, float] = {}
    ends: dict[int, float] = {}

    def port(run, n: int) -> DirectPort:
        starts.setdefault(n, time.perf_counter())
        return DirectPort(client, run.sim.request_system_prompt(), run.sim.request_schema())

    await client.start()
    try:
        before = await vllm_counters(endpoint)
        load = list(os.getloadavg())
        cpu0 = replica_cpu(endpoint)
        await run_local(prepared.resolved, run_id="bench-direct", cast=prepared.cast, llm=port, keep_states=False,
                        on_round=lambda n, row: ends.__setitem__(n, time.perf_counter()))
        cpu = _delta(replica_cpu(endpoint), cpu0)
        after = await vllm_counters(endpoint)
    finally:
        await client.stop()
    if client.errors:
        raise RuntimeError(f"direct, {concurrency} in flight per replica: {len(client.errors)} call(s) failed, "
                           f"the first: {client.errors[0]}")
    rounds = sorted(ends)
    hits, queries = _counter_delta(before, after)
    return PathRun("direct", concurrency, client.decisions, client.valid, client.calls, client.prompt_tokens,
                   client.cached_tokens, client.completion_tokens, [ends[n] - starts[n] for n in rounds],
                   hits, queries, load, cpu)


# -- the server's counters and CPU ----------------------------------------------------------------
async def vllm_counters(endpoint: Endpoint):
    """vLLM's prefix-cache counters summed over the replicas (None: not a vLLM, or no /metrics)."""
    if endpoint.kind != "vllm":
        return None
    import httpx

    from populace.bench.vllm import counters

    try:
        async with httpx.AsyncClient(timeout=10, headers=auth_header(endpoint)) as http:
            return await counters(http, [i.url for i in endpoint.infos])
    except (httpx.HTTPError, ValueError, IndexError):
        return None


def _counter_delta(before, after) -> tuple[float | None, float | None]:
    if before is None or after is None:
        return None, None
    d = after - before
    return d.hits, d.queries


async def reset_caches(endpoint: Endpoint) -> None:
    if endpoint.resettable:
        import httpx

        from populace.bench.vllm import reset_prefix_caches

        async with httpx.AsyncClient(timeout=30) as http:
            await reset_prefix_caches(http, [i.url for i in endpoint.infos])


def replica_cpu(endpoint: Endpoint) -> dict[str, float]:
    """CPU seconds each replica started here (its whole process tree) has used so far."""
    import psutil

    out: dict[str, float] = {}
    for r in getattr(endpoint.rs, "replicas", []):
        total = 0.0
        try:
            root = psutil.Process(r.proc.pid)
            for p in [root, *root.children(recursive=True)]:
                try:
                    t = p.cpu_times()
                    total += t.user + t.system
                except psutil.Error:
                    pass
        except psutil.Error:
            continue
        out[r.info.replica_id] = total
    return out


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: round(v - before.get(k, 0.0), 2) for k, v in after.items()}


# -- the path through Populace ------------------------------------------------------------------------
def populace_run(prepared, endpoint: Endpoint, *, hosts: int, workdir: str, index: int) -> PathRun:
    """A private stack (each service its own process) plays the run on the same replicas."""
    return populace_runs(prepared, endpoint, hosts=hosts, workdir=workdir, index=index, runs=1)[0]


def populace_runs(prepared, endpoint: Endpoint, *, hosts: int, workdir: str, index: int, runs: int) -> list[PathRun]:
    """`runs` runs, one after the other, on one private stack."""
    import duckdb

    from populace.bench.dummy import RssSampler
    from populace.client.run import play
    from populace.client.stack import Stack
    from populace.core import bus
    from populace.core.contracts import gateway_bindings
    from populace.replicas.launch import register_forever

    config = prepared.config
    db = str(Path(workdir) / f"populace-{index}.duckdb")
    keys, model_hosts = gateway_bindings(list(config.models))
    registered = len(endpoint.infos) if endpoint.rs is not None else 0
    stack = Stack(hosts=hosts, db=db, log_dir=str(Path(workdir) / f"logs-{index}"), replicas=registered,
                  env={"POPULACE_GATEWAY_KEYS": keys, "POPULACE_GATEWAY_MODEL_HOSTS": model_hosts,
                       "POPULACE_LOG_LEVEL": "INFO"},
                  secrets=(endpoint.api_key_env,) if endpoint.api_key_env else ())

    async def go():
        registering = (asyncio.create_task(register_forever(stack.url, endpoint.rs))
                       if endpoint.rs is not None else None)
        try:
            await stack.wait_ready(timeout=180)
            await asyncio.sleep(1.0)  # the gateway's first poll of the replicas' health
            await reset_caches(endpoint)
            nc = await bus.connect(stack.url, "populace-bench")
            out = []
            try:
                for k in range(runs):
                    if k:
                        await reset_caches(endpoint)
                    before = await vllm_counters(endpoint)
                    load = list(os.getloadavg())
                    cpu0 = replica_cpu(endpoint)
                    with RssSampler(stack) as sampler:
                        outcome = await play(nc, config, personas=prepared.personas, manifest=prepared.manifest,
                                             stall_s=900)
                    cpu = {**sampler.cpu_by_process, **_delta(replica_cpu(endpoint), cpu0)}
                    after = await vllm_counters(endpoint)
                    out.append((outcome, before, after, load, cpu))
            finally:
                await nc.close()
            return out
        finally:
            if registering is not None:
                registering.cancel()
                await asyncio.gather(registering, return_exceptions=True)

    try:
        stack.start()
        played = asyncio.run(go())
    finally:
        stack.stop()
    results = []
    for outcome, before, after, load, cpu in played:
        if outcome.status != "completed":
            raise RuntimeError(f"the run through Populace {outcome.status}: {outcome.reason} "
                               f"(logs in {stack.log_dir})")
        with duckdb.connect(db, read_only=True) as con:
            row = con.execute(
                "SELECT count(*), count(*) FILTER (WHERE valid), coalesce(sum(attempts), 0), "
                "coalesce(sum(prompt_tokens), 0), coalesce(sum(cached_tokens), 0), "
                "coalesce(sum(completion_tokens), 0) FROM llm_calls WHERE run_id = ? AND replica <> ''",
                [outcome.run_id]).fetchone()
        m = outcome.marks
        round_s = [m[f"result.{n}"] - m[f"open.{n}"] for n in range(1, config.rounds + 1)]
        hits, queries = _counter_delta(before, after)
        results.append(PathRun("populace", 0, int(row[0]), int(row[1]), int(row[2]), int(row[3]), int(row[4]),
                               int(row[5]), round_s, hits, queries, load, cpu, outcome.run_id))
    return results


# -- the whole bench ----------------------------------------------------------------------------------
def workload(*, agents: int, rounds: int, simulation: str, params: dict, personas: str | None, endpoint: Endpoint,
             concurrency: int | None, workdir: str, seed: int = 1):
    """The run both paths play (prepared as `populace run` prepares it)."""
    from populace.client.prepare import parse_config, prepare

    base = Path(workdir)
    if personas is not None:
        population = {"personas": str(Path(personas).resolve())}
    else:
        (base / "population.yaml").write_text(POPULATION.format(agents=agents))
        population = {"config": "population.yaml"}
    data = {"name": "bench-llm", "simulation": simulation, "agents": agents, "rounds": rounds, "seed": seed,
            "population": population, **params,
            "model": {"temperature": 0.7, "seed": 1, **params.get("model", {})},
            "models": [endpoint.model_entry(concurrency)]}
    return prepare(parse_config(data), base=base, agents_given=personas is None)


def start_endpoint(server: str, count: int, concurrency: int | None, log_dir: str, log) -> Endpoint:
    """Replicas of SmolLM2 started here, registered (by the Populace path) for the run model."""
    from populace.replicas.launch import start_local, start_vllm_cpu, wait_healthy

    if server == "vllm":
        from populace.client.live import VLLM_START_TIMEOUT_S

        os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # /reset_prefix_cache before every measured run
        rs = start_vllm_cpu(count, serves=MODEL_NAME, log_dir=log_dir, prefix="bench-vllm",
                            **({"max_concurrency": concurrency} if concurrency else {}))
        timeout = VLLM_START_TIMEOUT_S
    elif server == "llamacpp":
        rs = start_local(count, serves=MODEL_NAME, log_dir=log_dir, prefix="bench-llama",
                         **({"max_concurrency": concurrency} if concurrency else {}))
        timeout = 300.0
    else:
        raise ValueError(f"--server: {server!r} is not one of {', '.join(SERVERS)}")
    t0 = time.monotonic()
    log(f"starting {count} {server} replica(s) of SmolLM2 …")
    try:
        asyncio.run(wait_healthy(rs, timeout=timeout))
    except BaseException:
        rs.stop()
        raise
    log(f"  ready in {time.monotonic() - t0:.0f} s")
    infos = [r.info for r in rs.replicas]
    return Endpoint(server, infos, infos[0].model, rs=rs, resettable=server == "vllm")


def url_endpoint(url: str, model: str | None, kind: str, api_key_env: str | None) -> Endpoint:
    from populace.core.contracts import ModelEndpoint, ReplicaInfo

    m = ModelEndpoint(name=MODEL_NAME, kind=kind, base_url=url, model=model or "default", api_key_env=api_key_env)
    assert m.base_url is not None
    info = ReplicaInfo(replica_id="endpoint", url=m.base_url.removesuffix("/v1"), backend="openai", kind=kind,
                       model=m.model or "default", max_concurrency=m.limits.concurrency, heartbeat_at=time.time())
    return Endpoint(kind, [info], info.model, base_url=m.base_url, api_key_env=api_key_env)


def machine() -> dict:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu": cpu, "python": platform.python_version(), "platform": platform.platform()}


def check(*, server: str = "vllm", count: int = 1, url: str | None = None, model: str | None = None,
          kind: str = "openai", api_key_env: str | None = None, agents: int = 100, rounds: int = 3,
          simulation: str = "ratio-game", params: dict | None = None, personas: str | None = None,
          concurrency: int | None = None) -> None:
    """The bench's run prepared as it will be, before anything starts: raises ScenarioError (or
    pydantic's ValidationError) naming the option or the scenario key that is wrong."""
    from pydantic import ValidationError

    from populace.core.scenario import ScenarioError

    if url is not None:
        try:
            endpoint = url_endpoint(url, model, kind, api_key_env)
        except ValidationError as err:
            raise ScenarioError(f"--url: {err.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    else:
        if server not in SERVERS:
            raise ScenarioError(f"--server: {server!r} is not one of {', '.join(SERVERS)}")
        endpoint = Endpoint(server, [], "SmolLM2-135M-Instruct")
    with tempfile.TemporaryDirectory(prefix="populace-bench-llm-check-") as workdir:
        workload(agents=agents, rounds=rounds, simulation=simulation, params=params or {}, personas=personas,
                 endpoint=endpoint, concurrency=concurrency, workdir=workdir)


def run_llm_bench(*, server: str = "vllm", count: int = 1, url: str | None = None, model: str | None = None,
                  kind: str = "openai", api_key_env: str | None = None, agents: int = 100, rounds: int = 3,
                  simulation: str = "ratio-game", params: dict | None = None, personas: str | None = None,
                  sweep: Sequence[int] = DEFAULT_SWEEP, concurrency: int | None = None, repeat: int = 3,
                  hosts: int = 2, quiet: bool = False,
                  log: Callable[[str], None] | None = None) -> LlmBenchResult:
    """The sweep (direct, each concurrency once), then `repeat` pairs of (direct at the sweep's
    best, through Populace), alternated so that the machine's load falls on both alike. Raises
    BenchFailed when something could not be measured."""
    from populace.client.stack import StackError
    from populace.replicas.launch import LaunchError

    log = log or ((lambda m: None) if quiet else (lambda m: print(m, file=sys.stderr, flush=True)))
    workdir = tempfile.mkdtemp(prefix="populace-bench-llm-")
    try:
        endpoint = (url_endpoint(url, model, kind, api_key_env) if url is not None
                    else start_endpoint(server, count, concurrency, str(Path(workdir) / "replicas"), log))
    except LaunchError as err:
        raise BenchFailed(f"the replicas did not start: {err}") from None
    try:
        return _measure(endpoint, workdir=workdir, agents=agents, rounds=rounds, simulation=simulation,
                        params=params or {}, personas=personas, sweep=sweep, concurrency=concurrency,
                        repeat=repeat, hosts=hosts, log=log)
    except (RuntimeError, StackError, OSError) as err:
        if isinstance(err, BenchFailed):
            raise
        raise BenchFailed(f"{type(err).__name__}: {err} (logs under {workdir})") from err
    finally:
        if endpoint.rs is not None:
            endpoint.rs.stop()


def _measure(endpoint: Endpoint, *, workdir: str, agents: int, rounds: int, simulation: str, params: dict,
             personas: str | None, sweep: Sequence[int], concurrency: int | None, repeat: int, hosts: int,
             log: Callable[[str], None]) -> LlmBenchResult:
    prepared = workload(agents=agents, rounds=rounds, simulation=simulation, params=params,
                        personas=personas, endpoint=endpoint, concurrency=concurrency, workdir=workdir)
    cap = (endpoint.infos[0].max_concurrency if endpoint.rs is not None
           else prepared.config.models[0].limits.concurrency)
    c = prepared.config
    log(f"workload: {c.agents} agents × {c.rounds} rounds of {c.simulation}, max_tokens {c.model.max_tokens}, "
        f"{len(endpoint.infos)} replica(s) of {endpoint.served} ({endpoint.kind})")
    asyncio.run(warm_up(prepared, endpoint))
    swept: list[PathRun] = []
    for n in sweep:
        asyncio.run(reset_caches(endpoint))
        swept.append(asyncio.run(direct_run(prepared, endpoint, n)))
        log(f"  direct, {n} in flight per replica: {swept[-1].decisions_per_s:.2f} decisions/s")
    best = best_concurrency(swept)
    log(f"  best: {best} in flight per replica")
    direct: list[PathRun] = []
    through: list[PathRun] = []
    for i in range(repeat):
        asyncio.run(reset_caches(endpoint))
        direct.append(asyncio.run(direct_run(prepared, endpoint, best)))
        log(f"run {i + 1}/{repeat}: direct {direct[-1].decisions_per_s:.2f} decisions/s "
            f"(load {direct[-1].load_before[0]:.2f})")
        run = populace_run(prepared, endpoint, hosts=hosts, workdir=workdir, index=i)
        run.concurrency = cap
        through.append(run)
        log(f"run {i + 1}/{repeat}: through Populace {run.decisions_per_s:.2f} decisions/s "
            f"(load {run.load_before[0]:.2f}); ratio {run.decisions_per_s / direct[-1].decisions_per_s:.1%}")
    notes = []
    if not endpoint.resettable:
        notes.append("the server's prefix cache could not be emptied between runs (not a vLLM started here)")
    return LlmBenchResult(
        server=endpoint.kind, model=endpoint.served, replicas=len(endpoint.infos), direct_concurrency=best,
        populace_concurrency=cap, sweep=swept, direct=direct, populace=through,
        workload={"simulation": c.simulation, "agents": c.agents, "rounds": c.rounds,
                  "personas": personas or "template personas of the education population",
                  "params": params, "max_tokens": c.model.max_tokens, "temperature": c.model.temperature,
                  "seed": c.model.seed, "hosts": hosts, "repeat": repeat, "logs": workdir},
        machine=machine(), notes=notes)
