"""Two gateways against one simulated provider (issue 38: "Two gateways against one simulated
provider limited to N requests/min never exceed N together over a measured window, and no call is
counted as an infra failure for a 429").

Real processes: a nats-server with deploy/nats/auth.conf's users, two gateway processes (each as
the `gateway` user, its own metrics port), and two simulated providers in processes of their own:
- provider A requires a key and allows N = 600 requests a minute; the run's model declares that
  limit. 240 prompts in 24 batches go to both gateways at once (NATS spreads them over the queue
  group). A 60 s window is longer than this test, so the provider's own arrival times are checked
  over every window from 5 s to the whole run: the two gateways together never sent faster than
  one limit allows (alone, each would have sent at the full rate: twice that), and never more than
  N in any minute;
- provider B allows 4 requests per 2 s "minute" and its model declares no limit: the gateways meet
  its 429s, wait out its Retry-After (sharing the pause), and every prompt is answered, with no
  retry and no failure counted; the gateways' `populace_rate_limited_total` counts exactly the
  429s the provider sent.

Mostly waits (on the paced provider): about 25 s of pacing after ~5 s of start-up, light on CPU."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import nats
import pytest
from nats.js.api import DeliverPolicy
from prometheus_client.parser import text_string_to_metric_families

from populace.core import bus, replies, subjects
from populace.core.contracts import (
    InferBatch,
    InferReply,
    LlmCallBatch,
    ModelConfig,
    ModelEndpoint,
    ModelLimits,
    ServiceInfo,
)
from populace.core.natsserver import EmbeddedNats, free_port
from populace.core.processes import stop_all
from populace.gateway.pacing import BURST_S
from populace.gateway.shared_pacing import LEASE_S
from populace.replicas.launch import start_sim

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
AUTH_CONF = ROOT / "deploy" / "nats" / "auth.conf"
USERS = ("orchestrator", "environment", "gateway", "recorder", "agent-host", "replicas", "node", "cli", "manager",
         "admin")
N = 600  # provider A's requests per minute, declared and enforced
PROMPTS_A, BATCH = 240, 10
PROMPTS_B, BATCH_B = 16, 4
KEY_VARIABLE, KEY = "E2E_PROVIDER_KEY", "sk-e2e-shared-limits-0123456789"
SCHEMA = {"type": "object", "properties": {"guess": {"type": "integer", "minimum": 0, "maximum": 100}},
          "required": ["guess"]}
RUN_ID = "limits"


def password(user: str) -> str:
    return f"e2e-limits-{user}-{os.getpid()}"


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def total(series: dict, name: str, **labels: str) -> float:
    return sum(v for have, v in series.get(name, []) if labels.items() <= have.items())


def most_in_window(times: list[float], window: float) -> int:
    best, left = 0, 0
    for right, t in enumerate(times):
        while times[left] <= t - window:
            left += 1
        best = max(best, right - left + 1)
    return best


def batches(endpoint: ModelEndpoint, prompts: int, size: int, first_key: int) -> list[InferBatch]:
    return [InferBatch(batch_id=f"{endpoint.name}-{i}", run_id=RUN_ID, round=1,
                       model=ModelConfig(backend="sim", max_tokens=16, temperature=0.7, seed=5),
                       system="You are one of many players of a number-guessing game. Answer in JSON.",
                       keys=list(range(first_key + i, first_key + i + size)),
                       prompts=[f"Player {k}: guess a number from 0 to 100." for k in range(first_key + i,
                                                                                           first_key + i + size)],
                       response_schema=SCHEMA, endpoint=endpoint)
            for i in range(0, prompts, size)]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shared-limits")
    conf = tmp / "auth.conf"
    conf.write_text("".join(f'{u.upper().replace("-", "_")}_PASSWORD: "{password(u)}"\n' for u in USERS)
                    + AUTH_CONF.read_text())
    nats_server = EmbeddedNats(extra_args=["-c", str(conf)], log_file=str(tmp / "nats-server.log")).start()
    sims = start_sim(1, extra_args=["--requests-per-min", str(N), "--api-key", KEY, "--network-latency-s", "0.05",
                                    "--latency-jitter-s", "0.05", "--decode-tokens-per-s", "400",
                                    "--max-num-seqs", "64"], log_dir=str(tmp), prefix="provider-a")
    sims_b = start_sim(1, extra_args=["--requests-per-min", "4", "--minute-s", "2", "--time-scale", "0"],
                       log_dir=str(tmp), prefix="provider-b")
    url_a, url_b = sims.replicas[0].info.url, sims_b.replicas[0].info.url
    port_a = url_a.rsplit(":", 1)[1]
    gateways: dict[str, subprocess.Popen] = {}
    ports = {}
    try:
        for gw in ("gw-a", "gw-b"):
            ports[gw] = free_port()
            env = {**os.environ, "POPULACE_NATS_URL": nats_server.url, "POPULACE_NATS_USER": "gateway",
                   "POPULACE_NATS_PASSWORD": password("gateway"), "POPULACE_GATEWAY_ID": gw,
                   "POPULACE_METRICS_PORT": str(ports[gw]), "POPULACE_STORAGE": "memory",
                   "POPULACE_LOG_FORMAT": "json", "POPULACE_PARENT_PID": str(os.getpid()),
                   "POPULACE_GATEWAY_MODEL_HOSTS": "127.0.0.1",
                   "POPULACE_GATEWAY_KEYS": f"env:{KEY_VARIABLE}@127.0.0.1:{port_a}", KEY_VARIABLE: KEY}
            with open(tmp / f"{gw}.log", "ab") as log:
                gateways[gw] = subprocess.Popen([sys.executable, "-m", "populace.core.serve", "gateway"], env=env,
                                                stdout=log, stderr=subprocess.STDOUT)
        asyncio.run(wait_for_gateways(nats_server.url, len(gateways), gateways, tmp))
        yield {"nats": nats_server.url, "a": url_a, "b": url_b, "metrics": ports, "logs": tmp}
    finally:
        stop_all(gateways)
        sims.stop()
        sims_b.stop()
        nats_server.stop()
    for gw in gateways:
        text = (tmp / f"{gw}.log").read_text(errors="replace")
        assert "task_exception_unobserved" not in text and "Task exception was never retrieved" not in text, gw
        assert "pacing_not_shared" not in text, gw  # the gateway's user may use KV `pacing`
        assert KEY not in text, gw


async def wait_for_gateways(url: str, count: int, procs: dict[str, subprocess.Popen], logs: Path) -> None:
    nc = await nats.connect(url, user="admin", password=password("admin"))
    try:
        js = nc.jetstream()
        deadline = time.monotonic() + 90
        while True:
            for name, p in procs.items():
                assert p.poll() is None, f"{name} exited: {(logs / f'{name}.log').read_text()[-2000:]}"
            try:
                ready = [s for s in await bus.registry_entries(js, subjects.SERVICES_BUCKET, ServiceInfo)
                         if s.service == "gateway" and s.pid in {p.pid for p in procs.values()}]
            except Exception:
                ready = []
            if len(ready) >= count:
                return
            assert time.monotonic() < deadline, "the gateways did not register"
            await asyncio.sleep(0.1)
    finally:
        await nc.close()


async def burst(url: str, work_a: list[InferBatch], work_b: list[InferBatch]
                ) -> tuple[list[InferReply], list[InferReply] | None, list[tuple[str, LlmCallBatch]]]:
    """Every batch at once as `cli`: provider A's replies, provider B's (None: not all answered in
    time), and the call records the gateways wrote to RUN (read as admin), each with the gateway
    that wrote it."""
    nc = await nats.connect(url, user="cli", password=password("cli"), inbox_prefix=bus.inbox_prefix("cli"))
    admin = await nats.connect(url, user="admin", password=password("admin"))

    def ask(work: list[InferBatch], timeout: float):
        return asyncio.gather(*(replies.request(nc, "gateway", subjects.llm_infer("cli"), b.model_dump_json().encode(),
                                                timeout=timeout) for b in work))

    try:
        to_b = asyncio.ensure_future(ask(work_b, 60))
        got_a = [InferReply.model_validate_json(m.data) for m in await ask(work_a, 150)]
        try:
            got_b = [InferReply.model_validate_json(m.data) for m in await to_b]
        except nats.errors.TimeoutError:
            got_b = None
        records: list[tuple[str, LlmCallBatch]] = []
        done = asyncio.Event()
        prompts = sum(len(b.keys) for b in (work_a + work_b if got_b is not None else work_a))

        async def on_record(msg) -> None:
            records.append((msg.subject.rsplit(".", 1)[1], LlmCallBatch.model_validate_json(msg.data)))
            if sum(len(r.agent_ids) for _, r in records) >= prompts:
                done.set()

        sub = await admin.jetstream().subscribe(f"run.{RUN_ID}.calls.>", cb=on_record, ordered_consumer=True,
                                                deliver_policy=DeliverPolicy.ALL)
        await asyncio.wait_for(done.wait(), 30)
        await sub.unsubscribe()
        return got_a, got_b, records
    finally:
        await nc.close()
        await admin.close()


def test_two_gateways_share_one_providers_limit_and_wait_out_its_429s(stack):
    a = ModelEndpoint(name="provider-a", kind="sim", base_url=stack["a"], model="sim", api_key_env=KEY_VARIABLE,
                      limits=ModelLimits(requests_per_min=N, concurrency=64))
    b = ModelEndpoint(name="provider-b", kind="sim", base_url=stack["b"], model="sim")
    work_a, work_b = batches(a, PROMPTS_A, BATCH, 0), batches(b, PROMPTS_B, BATCH_B, 10_000)
    answers_a, answers_b, records = asyncio.run(burst(stack["nats"], work_a, work_b))
    by_model: dict[str, list[tuple[str, LlmCallBatch]]] = {}
    for gw, rec in records:
        by_model.setdefault(rec.model, []).append((gw, rec))

    # provider A: every prompt answered once, validly, in one attempt, by both gateways
    check_answered(answers_a, work_a, [r for _, r in by_model["provider-a"]])
    assert {gw for gw, _ in by_model["provider-a"]} == {"gw-a", "gw-b"}  # both gateways called provider A

    stats_a = httpx.get(f"{stack['a']}/sim/stats", timeout=5).json()
    stats_b = httpx.get(f"{stack['b']}/sim/stats", timeout=5).json()
    metrics = [scrape(port) for port in stack["metrics"].values()]
    # what provider A received, by its own clock
    assert stats_a["requests_received"] == PROMPTS_A and stats_a["rate_limited"] == 0
    assert stats_a["unauthorized"] == 0  # the gateways sent its key
    arrivals = sorted(stats_a["arrivals_s"])
    assert most_in_window(arrivals, 60.0) <= N and stats_a["max_requests_in_minute"] <= N
    for window in (5.0, 10.0, 15.0, arrivals[-1] - arrivals[0]):
        # one limit's bucket and refill (plus a lease spent after its window began); two gateways
        # pacing alone would each send that much
        allowed = N / 60 * (window + BURST_S + LEASE_S) + 1
        assert most_in_window(arrivals, window) <= allowed, (window, most_in_window(arrivals, window), allowed)

    # provider B: its 429s were met, counted as rate limiting, waited out together, never retries
    # (gateways that wait out its Retry-After each alone keep meeting each other's refused requests,
    # which the provider counts: with the pause not shared, none got through in 150 s)
    assert answers_b is not None, "provider B's prompts were not all answered within 60 s"
    check_answered(answers_b, work_b, [r for _, r in by_model["provider-b"]])
    assert stats_b["rate_limited"] > 0
    assert stats_b["requests_received"] == PROMPTS_B + stats_b["rate_limited"]
    assert sum(total(m, "populace_rate_limited_total", model="provider-b") for m in metrics) == stats_b["rate_limited"]
    assert sum(total(m, "populace_rate_limited_total", model="provider-a") for m in metrics) == 0
    assert [total(m, "populace_retries_total", service="gateway") for m in metrics] == [0, 0]
    assert sum(total(m, "populace_llm_calls_total") for m in metrics) == PROMPTS_A + PROMPTS_B


def check_answered(answers: list[InferReply], work: list[InferBatch], records: list[LlmCallBatch]) -> None:
    """Every prompt answered once, validly, in one attempt (a 429 waited out is no attempt and no
    failure), and recorded so (`llm_calls.attempts`)."""
    assert all(r.error is None and r.refused is None for r in answers), [r.error or r.refused for r in answers]
    assert [len(r.texts) for r in answers] == [len(w.keys) for w in work]
    assert all(all(r.valid) and r.attempts == [1] * len(r.texts) and r.failed == [] for r in answers)
    assert sorted(k for r in records for k in r.agent_ids) == sorted(k for w in work for k in w.keys)
    assert all(set(r.attempts) == {1} for r in records)
