"""`populace bench gateway`: what the inference gateway costs and what its routing buys.

1. Added latency: one prompt at a time, straight to a zero-latency simulated replica over
   HTTP vs. through NATS and the gateway process to the same replica (p50/p99 difference).
2. Routed requests per second of one gateway dispatcher against a zero-latency backend
   (a canned answer, no HTTP: the figure is the gateway's own cost), and the same through
   NATS, the gateway process and real HTTP to a zero-latency simulated replica in its own
   process, with the gateway's HTTP client (aiohttp) and the one before it (httpx) in turn.
3. Prefix-cache hit rate and throughput of prefix-affinity vs. round-robin on 4 simulated
   vLLM replicas: 128 long persona prefixes (~100 KV blocks each), requests interleaved across
   them; one replica's cache holds ~34 personas, the four together all of them. For scale, the
   same request sequence is also replayed offline through the simulated caches with every
   persona pinned to one replica (the best static partition): the ceiling of any router on
   this workload. It is below 3.5x: 128 of the 1,600 requests are a persona's first (a miss
   wherever it goes), the per-request tail is never cached, and round-robin itself hits ~34/128
   of personas plus the game prompt every persona starts with.
4. Max-replica share over the mean when 100% of requests share one prefix.
5. Tokens per decision: one structured call vs. the paper's two calls (answer, then
   "extract the number"), measured on SmolLM2 (llama.cpp) when `--llm`.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import httpx
from nats.errors import NoRespondersError
from rich.table import Table

from populace.bench.game import BenchGame
from populace.core import bus, replies, subjects
from populace.core.contracts import InferBatch, InferReply, ModelConfig, ReplicaInfo, ServiceInfo
from populace.core.natsserver import EmbeddedNats
from populace.core.settings import Settings
from populace.gateway.dispatcher import Dispatcher
from populace.gateway.openai_api import ChatClient
from populace.gateway.replica_pool import ReplicaPool
from populace.gateway.routing import make_router
from populace.replicas.launch import ReplicaSet, register_forever, start_local, start_sim, wait_healthy
from populace.replicas.sim import SimConfig, SimModel

GAME = BenchGame()  # the gateway is measured on the paper's game: its prompts and answer schema
SYSTEM = GAME.system
SCHEMA = GAME.schema
# A request that got no reply: counted (ReplyCount.add_lost), not raised
LOST = (TimeoutError, NoRespondersError)
CANNED = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": '{"guess": 33}'},
                                  "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": 90, "completion_tokens": 6, "total_tokens": 96}}).encode()


@dataclass
class ReplyCount:
    """What came back for one measured path's prompts, told apart: valid answers, the model's
    invalid answers, prompts no model answered (infrastructure: `failed`), and prompts of replies
    refused whole or unreadable (`refused`: the gateway's error, a reply that does not decode or
    carries the wrong number of answers). A bench under load reports these; it does not stop at
    the first one. `errors` keeps the first few distinct messages."""

    prompts: int = 0
    valid: int = 0
    invalid: int = 0
    failed: int = 0
    refused: int = 0
    errors: list[str] = field(default_factory=list)

    def _note(self, message: str) -> None:
        if len(self.errors) < 5 and message not in self.errors:
            self.errors.append(message)

    def add(self, reply: InferReply | bytes, prompts: int) -> bool:
        """Count one reply to `prompts` prompts (an InferReply, or its bytes off the wire); True
        when every prompt got a valid answer."""
        self.prompts += prompts
        if isinstance(reply, bytes):
            try:
                reply = InferReply.model_validate_json(reply)
            except ValueError as err:
                self.refused += prompts
                self._note(f"unreadable reply: {str(err).splitlines()[0]}")
                return False
        if reply.error is not None or len(reply.valid) != prompts:
            self.refused += prompts
            self._note(reply.error or f"reply carries {len(reply.valid)} answers for {prompts} prompts")
            return False
        failed = reply.failed or [None] * prompts
        for ok, why in zip(reply.valid, failed, strict=False):
            if ok:
                self.valid += 1
            elif why:
                self.failed += 1
                self._note(why)
            else:
                self.invalid += 1
        return all(reply.valid)

    def add_lost(self, prompts: int, err: BaseException) -> bool:
        """Count a request that got no reply at all (timed out, or nobody listening) as `failed`."""
        self.prompts += prompts
        self.failed += prompts
        self._note(f"no reply: {type(err).__name__} {err}".rstrip())
        return False

    def add_http(self, status: int) -> bool:
        """Count one direct HTTP call to a replica (no gateway): 200 is an answer, else a failure."""
        self.prompts += 1
        if status == 200:
            self.valid += 1
            return True
        self.failed += 1
        self._note(f"HTTP {status}")
        return False

    @property
    def not_valid(self) -> int:
        return self.invalid + self.failed + self.refused


@dataclass
class GatewayBenchResult:
    added_latency_p50_ms: float | None  # None: no call answered on both paths
    added_latency_p99_ms: float | None
    direct_p50_ms: float | None
    direct_p99_ms: float | None
    gateway_p50_ms: float | None
    gateway_p99_ms: float | None
    routed_rps: float  # one dispatcher, zero-latency mock transport, 4 replicas
    routed_rps_e2e: float  # NATS + gateway process + HTTP to a zero-latency simulated replica (median)
    routed_rps_e2e_httpx: float  # the same with the gateway's previous HTTP client, same run (median)
    e2e_speedup: float  # median of aiohttp / httpx, pair by pair
    prefix_hit_rate: float
    round_robin_hit_rate: float
    hit_rate_ratio: float
    prefix_rps: float
    round_robin_rps: float
    max_share_over_mean: float
    tokens_one_call: float | None
    tokens_two_calls: float | None
    valid_one_call: float | None
    valid_two_calls: float | None
    # per measured path (ReplyCount as a dict): prompts, valid, invalid, failed, refused, errors
    replies: dict = field(default_factory=dict)
    details: dict = field(default_factory=dict)
    machine: dict = field(default_factory=dict)

    def to_json(self, **kw) -> str:
        return json.dumps(asdict(self), **kw)

    def table(self) -> Table:
        t = Table(title="gateway benchmark")
        t.add_column("measure")
        t.add_column("value", justify="right")
        t.add_column("goal", justify="right")
        f = lambda x, u="": "—" if x is None else f"{x:,.2f}{u}"  # noqa: E731
        rows = [
            ("added latency p50 (gateway − direct)", f(self.added_latency_p50_ms, " ms"), "≤ 2 ms"),
            ("added latency p99", f(self.added_latency_p99_ms, " ms"), ""),
            ("routed requests/s, one dispatcher (mock backend)", f(self.routed_rps), "≥ 5,000"),
            ("routed requests/s, NATS + gateway + HTTP sim", f(self.routed_rps_e2e), "≥ 1,500"),
            ("  the same, previous HTTP client (httpx), same run", f(self.routed_rps_e2e_httpx), ""),
            ("  speed-up, pair by pair (median)", f(self.e2e_speedup, "×"), "≥ 2×"),
            ("prefix-cache hit rate, prefix-affinity", f(self.prefix_hit_rate), ""),
            ("prefix-cache hit rate, round-robin", f(self.round_robin_hit_rate), ""),
            ("hit-rate ratio", f(self.hit_rate_ratio, "×"), "≥ 3.5×"),
            ("  ceiling on this workload (best static partition)",
             f(self.details.get("ceiling", {}).get("ratio"), "×"), ""),
            ("  second half only (caches warm): prefix-affinity / round-robin",
             f"{f(self.details.get('prefix_affinity', {}).get('warm_hit_rate'))} / "
             f"{f(self.details.get('round_robin', {}).get('warm_hit_rate'))}", ""),
            ("throughput prefix-affinity / round-robin (req/s)",
             f"{self.prefix_rps:,.0f} / {self.round_robin_rps:,.0f}", ""),
            ("max replica share / mean, 100% shared prefix", f(self.max_share_over_mean), "≤ 1.25"),
            ("tokens per decision, one structured call", f(self.tokens_one_call), ""),
            ("tokens per decision, two calls (answer + extract)", f(self.tokens_two_calls), ""),
            ("valid answers, one call / two calls", f"{f(self.valid_one_call)} / {f(self.valid_two_calls)}", ""),
        ]
        for path, c in self.replies.items():  # what the figures above were measured on
            bad = c["invalid"] + c["failed"] + c["refused"]
            rows.append((f"prompts without a valid answer, {path}",
                         f"{bad:,} of {c['prompts']:,}" + (f" (invalid {c['invalid']:,}, no model {c['failed']:,}, "
                                                          f"refused {c['refused']:,})" if bad else ""), "0"))
        for r in rows:
            t.add_row(*r)
        return t


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def settings(**kw) -> Settings:
    return Settings(gateway_poll_s=3600, **kw)  # the benchmarks control health themselves


def batch(system: str, prompts: list[str], backend: str = "sim", batch_id: str = "b", keys=None,
          max_tokens: int = 16) -> InferBatch:
    return InferBatch(batch_id=batch_id, run_id="bench", round=1,
                      model=ModelConfig(backend=backend, max_tokens=max_tokens, temperature=0.7),
                      system=system, response_schema=SCHEMA,
                      keys=keys or list(range(len(prompts))), prompts=prompts)


def pool_of(http: httpx.AsyncClient, infos: list[ReplicaInfo]) -> ReplicaPool:
    pool = ReplicaPool(None, http)
    for info in infos:
        pool._add(info)
        pool.replicas[info.replica_id].load.healthy = True
    return pool


# -- 2. routed requests per second, mock transport -----------------------------------
class CannedPoster:
    """A replica that answers every call at once, with no HTTP at all: what is left is the
    gateway's own cost (routing, slots, the call's JSON both ways, checking the answer)."""

    async def post(self, url: str, body: bytes, headers: dict, timeout: float) -> tuple[int, bytes]:
        return 200, CANNED


async def routed_rps_mock(total: int = 20_000, batch_size: int = 1000) -> tuple[float, ReplyCount]:
    async with httpx.AsyncClient() as http:
        infos = [ReplicaInfo(replica_id=f"mock-{i}", url=f"http://mock-{i}", backend="sim", kind="sim",
                             model="mock", max_concurrency=10_000, heartbeat_at=time.time()) for i in range(4)]
        d = Dispatcher(pool_of(http, infos), make_router("prefix-affinity"), CannedPoster(), settings())
        prompts = [f"You are player {k}. Report your number." for k in range(batch_size)]
        await d.serve(batch(SYSTEM, prompts[:50]))  # warm-up
        t0 = time.perf_counter()
        replies = await asyncio.gather(*(d.serve(batch(SYSTEM, prompts, batch_id=f"b{i}"))
                                         for i in range(total // batch_size)))
        dt = time.perf_counter() - t0
    count = ReplyCount()
    for r, _ in replies:
        count.add(r, batch_size)
    return total / dt, count


# -- 3./4. routing on simulated replicas ---------------------------------------------
def personas(k: int, chars: int = 6000) -> list[str]:
    rng = random.Random(7)
    words = ["curious", "careful", "bold", "patient", "analytical", "playful", "stubborn", "generous", "cautious",
             "witty"]
    out = []
    for i in range(k):
        text = " ".join(rng.choice(words) for _ in range(chars // 8))
        out.append(f"{SYSTEM}\nYou are persona {i}. Background: {text}")
    return out


async def sim_metrics(http: httpx.AsyncClient, rs: ReplicaSet) -> tuple[float, float]:
    hits = queries = 0.0
    for r in rs.replicas:
        text = (await http.get(r.info.url + "/metrics")).text
        for line in text.splitlines():
            if line.startswith("vllm:prefix_cache_hits_total"):
                hits += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:prefix_cache_queries_total"):
                queries += float(line.rsplit(" ", 1)[1])
    return hits, queries


async def routing_run(router: str, sim_args: list[str], work: list[tuple[str, list[str]]],
                      log_dir: str, concurrency: int = 8) -> dict:
    """`work` in order, `concurrency` batches at a time, on 4 fresh simulated replicas. The work
    runs in two halves (the second starts when the first has drained) so the hit rate of the
    second half alone, with warm caches, is reported too (`warm_hit_rate`)."""
    rs = start_sim(4, extra_args=sim_args, max_concurrency=64, log_dir=log_dir, prefix=f"sim-{router}")
    try:
        await wait_healthy(rs)
        chat = ChatClient(512)
        async with httpx.AsyncClient() as http:
            d = Dispatcher(pool_of(http, [r.info for r in rs.replicas]), make_router(router), chat, settings())
            counts: Counter[str] = Counter()
            replies = ReplyCount()

            async def run(queue: list[tuple[int, tuple[str, list[str]]]]) -> None:
                async def worker() -> None:
                    while queue:
                        i, (system, prompts) = queue.pop(0)
                        reply, calls = await d.serve(batch(system, prompts, batch_id=f"{router}-{i}"))
                        replies.add(reply, len(prompts))
                        if calls is not None:  # None: refused whole (overloaded), counted above
                            counts.update(calls.replicas)

                await asyncio.gather(*(worker() for _ in range(concurrency)))

            half = len(work) // 2
            t0 = time.perf_counter()
            await run(list(enumerate(work))[:half])
            dt = time.perf_counter() - t0
            hits0, queries0 = await sim_metrics(http, rs)
            t0 = time.perf_counter()
            await run(list(enumerate(work))[half:])
            dt += time.perf_counter() - t0
            hits, queries = await sim_metrics(http, rs)
            await chat.aclose()
    finally:
        rs.stop()
    n = sum(len(p) for _, p in work)
    shares = [counts.get(r.info.replica_id, 0) for r in rs.replicas]
    stats = getattr(d.router, "stats", None)
    return {"router": router, "requests": n, "seconds": dt, "rps": n / dt,
            "hit_rate": hits / queries if queries else 0.0,
            "warm_hit_rate": (hits - hits0) / (queries - queries0) if queries > queries0 else 0.0,
            "per_replica": shares, "max_share_over_mean": max(shares) / (n / len(shares)), "replies": replies,
            **({"routing": asdict(stats)} if stats is not None else {})}


def sim_config(sim_args: list[str]) -> SimConfig:
    """The SimConfig the `populace.replicas.sim` command line `sim_args` gives a replica."""
    opts = dict(zip(sim_args[::2], sim_args[1::2]))
    return SimConfig(**{k.removeprefix("--").replace("-", "_"): v for k, v in opts.items()})


def cache_replay(work: list[tuple[str, list[str]]], sim_args: list[str], assign, replicas: int = 4) -> dict:
    """Replay `work` in order through `replicas` simulated prefix caches (pure SimModel: no
    servers, no timing), request j with prefix index p going to replica `assign(j, p)`, where
    p numbers the distinct prefixes by first appearance. Same token accounting as the servers;
    `warm_hit_rate` is that of the second half of `work`, as in `routing_run`."""
    cfg = sim_config(sim_args)
    models = [SimModel(cfg) for _ in range(replicas)]
    index: dict[str, int] = {}
    j = 0
    hits0 = queries0 = 0
    for k, (system, prompts) in enumerate(work):
        if k == len(work) // 2:
            hits0, queries0 = sum(m.prefix_cache_hits for m in models), sum(m.prefix_cache_queries for m in models)
        p = index.setdefault(system, len(index))
        for prompt in prompts:
            models[assign(j, p)].plan([{"role": "system", "content": system}, {"role": "user", "content": prompt}])
            j += 1
    hits, queries = sum(m.prefix_cache_hits for m in models), sum(m.prefix_cache_queries for m in models)
    return {"hit_rate": hits / queries if queries else 0.0,
            "warm_hit_rate": (hits - hits0) / (queries - queries0) if queries > queries0 else 0.0}


def routing_ceiling(work: list[tuple[str, list[str]]], sim_args: list[str], replicas: int = 4) -> dict:
    """What any router can reach on `work`: every prefix pinned to one replica (prefix i -> i mod
    `replicas`, so each cache holds an equal share; nothing ever moves or spills), against
    round-robin (request j -> j mod `replicas`, which is what the live round-robin run does)."""
    best = cache_replay(work, sim_args, lambda j, p: p % replicas, replicas)
    rr = cache_replay(work, sim_args, lambda j, p: j % replicas, replicas)
    ratio = lambda a, b: a / b if b else float("inf")  # noqa: E731
    return {"best_partition_hit_rate": best["hit_rate"], "round_robin_hit_rate": rr["hit_rate"],
            "ratio": ratio(best["hit_rate"], rr["hit_rate"]),
            "best_partition_warm_hit_rate": best["warm_hit_rate"], "round_robin_warm_hit_rate": rr["warm_hit_rate"],
            "warm_ratio": ratio(best["warm_hit_rate"], rr["warm_hit_rate"])}


# -- 1./2. through the gateway process ------------------------------------------------
async def gateway_latency(log_dir: str, n: int = 300, pairs: int = 3) -> dict:
    with EmbeddedNats() as ns:
        env = {**os.environ, "POPULACE_NATS_URL": ns.url, "POPULACE_STORAGE": "memory",
               "POPULACE_PARENT_PID": str(os.getpid()), "POPULACE_LOG_LEVEL": "WARNING"}
        gw = start_gateway(env, log_dir, "aiohttp")
        rs = start_sim(1, extra_args=["--time-scale", "0"], max_concurrency=256, log_dir=log_dir, prefix="lat")
        nc = await bus.connect(ns.url, "bench-gateway")
        try:
            await wait_healthy(rs)
            registrar = asyncio.create_task(register_forever(ns.url, rs, every_s=1.0))
            await wait_for_gateway(nc, gw.pid)
            url = rs.replicas[0].info.url
            body = {"model": "sim", "messages": [{"role": "system", "content": SYSTEM},
                                                 {"role": "user", "content": "You are player 1. Report your number."}],
                    "max_tokens": 16, "temperature": 0.7,
                    "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}}
            one = bus.encode(batch(SYSTEM, ["You are player 1. Report your number."]))
            direct, via = [], []
            counts = {"direct": ReplyCount(), "gateway": ReplyCount()}
            # Alternate direct and gateway calls, so the VM's drifting speed (run-to-run p50s
            # of one path vary 2x here) hits both samples alike.
            # The direct calls use the gateway's own HTTP client, so the difference is NATS and
            # the gateway's work, not one client against another.
            http = ChatClient(1)
            try:
                for i in range(n + 20):
                    t0 = time.perf_counter()
                    status = (await http.post(url + "/v1/chat/completions", json.dumps(body).encode(),
                                              {"Content-Type": "application/json"}, 30.0))[0]
                    t1 = time.perf_counter()
                    try:
                        msg = await infer(nc, one, timeout=30)
                    except LOST as err:
                        via_ok = counts["gateway"].add_lost(1, err)
                    else:
                        via_ok = counts["gateway"].add(msg.data, 1)
                    t2 = time.perf_counter()
                    # a pair is timed only when both paths answered (a failure's latency is no answer's)
                    if counts["direct"].add_http(status) and via_ok and i >= 20:
                        direct.append((t1 - t0) * 1000)
                        via.append((t2 - t1) * 1000)
            finally:
                await http.aclose()
            stop_gateway(gw)
            # Throughput through the process: 10 batches of 1,000 prompts at once, on a fresh
            # gateway with each HTTP client in turn (aiohttp, then httpx, the client before it),
            # `pairs` times, so the VM's drift hits both alike.
            e2e: dict[str, list[float]] = {"aiohttp": [], "httpx": []}
            for client in e2e:
                counts[f"e2e {client}"] = ReplyCount()
            for pair in range(pairs):
                for client in e2e:
                    gw = start_gateway(env, log_dir, client)
                    await wait_for_gateway(nc, gw.pid)
                    e2e[client].append(await e2e_throughput(nc, f"{client}{pair}", counts[f"e2e {client}"]))
                    stop_gateway(gw)
            registrar.cancel()
        finally:
            await nc.close()
            rs.stop()
            stop_gateway(gw)
    return {"direct": direct, "via": via, "e2e": e2e, "counts": counts,
            "e2e_ratios": [a / b for a, b in zip(e2e["aiohttp"], e2e["httpx"], strict=True)]}


async def infer(nc, data: bytes, timeout: float):
    """One llm.infer request as this connection's requester, answered on its own reply subject."""
    return await replies.request(nc, "gateway", subjects.llm_infer(replies.requester(nc)), data, timeout=timeout)


def start_gateway(env: dict, log_dir: str, client: str) -> subprocess.Popen:
    # started before a measurement: blocking here costs nothing measured
    with open(f"{log_dir}/gateway-{client}.log", "ab") as log:  # the child keeps its copy
        return subprocess.Popen([sys.executable, "-m", "populace.cli", "service", "gateway"],
                                env={**env, "POPULACE_GATEWAY_HTTP_CLIENT": client},
                                stdout=subprocess.DEVNULL, stderr=log)


def stop_gateway(gw: subprocess.Popen) -> None:
    gw.terminate()
    gw.wait(15)


async def e2e_throughput(nc, tag: str, count: ReplyCount, batches: int = 10, size: int = 1000) -> float:
    """Requests per second of `batches` batches of `size` prompts sent at once through NATS,
    the gateway process and HTTP to the replica (after a warm-up of 50 one-prompt batches);
    what came back is added to `count` (the warm-up's replies are not counted)."""
    one = bus.encode(batch(SYSTEM, ["You are player 1. Report your number."]))
    deadline = time.monotonic() + 30
    for _ in range(50):
        while True:
            try:
                await infer(nc, one, timeout=30)
                break
            except NoRespondersError:  # registered a moment before it subscribed
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)
    prompts = [f"You are player {k}. Report your number." for k in range(size)]
    t0 = time.perf_counter()
    msgs = await asyncio.gather(*(infer(nc, bus.encode(
        batch(SYSTEM, prompts, batch_id=f"t{tag}-{i}")), timeout=300) for i in range(batches)), return_exceptions=True)
    rps = batches * size / (time.perf_counter() - t0)
    for m in msgs:
        if isinstance(m, LOST):
            count.add_lost(size, m)
        elif isinstance(m, BaseException):
            raise m  # not a lost reply: the bench's own failure
        else:
            count.add(m.data, size)
    return rps


async def wait_for_gateway(nc, pid: int, timeout: float = 60.0) -> None:
    js = nc.jetstream()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            services = await bus.registry_entries(js, subjects.SERVICES_BUCKET, ServiceInfo)
            if any(s.service == "gateway" and s.pid == pid for s in services):
                return
        except Exception:
            pass
        await asyncio.sleep(0.1)
    raise TimeoutError("the gateway did not start")


# -- 5. tokens per decision on SmolLM2 -------------------------------------------------
async def tokens_per_decision(log_dir: str, n: int = 12) -> dict:
    rs = start_local(1, max_concurrency=1, log_dir=log_dir, prefix="tok")
    try:
        await wait_healthy(rs, timeout=180)
        url, model = rs.replicas[0].info.url, rs.replicas[0].info.model
        one, two, valid_one, valid_two = [], [], 0, 0
        async with httpx.AsyncClient(timeout=120) as http:
            async def call(messages, **extra):
                r = await http.post(url + "/v1/chat/completions",
                                    json={"model": model, "messages": messages, "temperature": 0.7, **extra})
                d = r.json()
                return d["choices"][0]["message"]["content"] or "", d["usage"]["total_tokens"]

            basic_system = GAME.free_system
            for k in range(n):
                user = f"You are player {k}. Report your number."
                text, tok = await call([{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
                                       max_tokens=24, response_format={"type": "json_object", "schema": SCHEMA})
                one.append(tok)
                valid_one += GAME.valid(text)
                # the paper's way: a free answer, then a second call to extract the number
                answer, tok1 = await call([{"role": "system", "content": basic_system},
                                           {"role": "user", "content": user}], max_tokens=128)
                extracted, tok2 = await call([{"role": "user", "content":
                                               f"Extract the number this player reported from the text below. "
                                               f"Reply with the number only.\n\n{answer}"}], max_tokens=8)
                two.append(tok1 + tok2)
                # lenient, as the paper's extraction was: the first number in the reply
                found = re.search(r"-?[0-9]+(?:\.[0-9]+)?", extracted)
                valid_two += found is not None and GAME.valid(found.group())
    finally:
        rs.stop()
    return {"one": statistics.mean(one), "two": statistics.mean(two),
            "valid_one": valid_one / n, "valid_two": valid_two / n}


def run_gateway_bench(llm: bool = True, quiet: bool = False) -> GatewayBenchResult:
    log = (lambda *a: None) if quiet else (lambda m: print(m, file=sys.stderr))
    log_dir = tempfile.mkdtemp(prefix="populace-bench-gw-")
    log("1/5 added latency and end-to-end throughput through the gateway process …")
    lat = asyncio.run(gateway_latency(log_dir))
    log("2/5 routed requests per second of one dispatcher …")
    rps, mock_count = asyncio.run(routed_rps_mock())
    log("3/5 prefix-affinity vs round-robin on 4 simulated replicas …")
    # Every agent carries one of K=128 personas (a population generated with --unique K);
    # requests arrive interleaved across personas. One replica's cache holds about 36
    # personas, the four together all of them: only routing decides whether they hit.
    people = personas(128)
    rng = random.Random(3)
    work = [(people[rng.randrange(len(people))], [f"You are player {i}. Report your number."])
            for i in range(1600)]
    # Time scale 1: simulated GPU time is real time. At 0.2 the four sims' own Python work
    # (HTTP, hashing 6,000-character prompts) outweighed it on 2 shared cores, and throughput
    # compared CPU scheduling (round-robin spreads CPU evenly), not prefill saved by cache hits.
    sim_args = ["--cache-blocks", "3400", "--prefill-tokens-per-s", "5000", "--decode-tokens-per-s", "50",
                "--max-num-seqs", "32", "--time-scale", "1.0"]
    pa = asyncio.run(routing_run("prefix-affinity", sim_args, work, log_dir, concurrency=32))
    rr = asyncio.run(routing_run("round-robin", sim_args, work, log_dir, concurrency=32))
    ceiling = routing_ceiling(work, sim_args)
    log("4/5 share bound with one shared prefix …")
    shared = [(SYSTEM, ["You are a player. Report your number."] * 10) for _ in range(400)]
    share = asyncio.run(routing_run("prefix-affinity", ["--time-scale", "0.05", "--max-num-seqs", "64"],
                                    shared, log_dir, concurrency=16))
    tokens = None
    if llm:
        log("5/5 tokens per decision on SmolLM2: one structured call vs answer + extract …")
        tokens = asyncio.run(tokens_per_decision(log_dir))
    replies = {**lat["counts"], "mock dispatcher": mock_count, "prefix-affinity": pa.pop("replies"),
               "round-robin": rr.pop("replies"), "shared prefix": share.pop("replies")}
    d50, d99, v50, v99 = pct(lat["direct"], .5), pct(lat["direct"], .99), pct(lat["via"], .5), pct(lat["via"], .99)
    minus = lambda a, b: None if a is None or b is None else a - b  # noqa: E731  (None: no pair answered)
    return GatewayBenchResult(
        added_latency_p50_ms=minus(v50, d50), added_latency_p99_ms=minus(v99, d99), direct_p50_ms=d50,
        direct_p99_ms=d99,
        gateway_p50_ms=v50, gateway_p99_ms=v99, routed_rps=rps, routed_rps_e2e=statistics.median(lat["e2e"]["aiohttp"]),
        routed_rps_e2e_httpx=statistics.median(lat["e2e"]["httpx"]), e2e_speedup=statistics.median(lat["e2e_ratios"]),
        prefix_hit_rate=pa["hit_rate"], round_robin_hit_rate=rr["hit_rate"],
        hit_rate_ratio=pa["hit_rate"] / rr["hit_rate"] if rr["hit_rate"] else float("inf"),
        prefix_rps=pa["rps"], round_robin_rps=rr["rps"], max_share_over_mean=share["max_share_over_mean"],
        tokens_one_call=tokens and tokens["one"], tokens_two_calls=tokens and tokens["two"],
        valid_one_call=tokens and tokens["valid_one"], valid_two_calls=tokens and tokens["valid_two"],
        replies={path: asdict(c) for path, c in replies.items()},
        details={"e2e_rps": lat["e2e"], "e2e_ratios": lat["e2e_ratios"],
                 "prefix_affinity": pa, "round_robin": rr, "ceiling": ceiling, "shared_prefix": share,
                 "logs": log_dir},
        machine={"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
    )
