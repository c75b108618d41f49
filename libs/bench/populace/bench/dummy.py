"""`populace bench dummy`: the paper's dummy benchmark through every service, measured."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import duckdb
import httpx
from rich.console import Console
from rich.table import Table

from populace.client.prepare import checked
from populace.client.progress import RunProgress
from populace.client.run import play
from populace.client.stack import Stack
from populace.core import bus
from populace.core.contracts import RunConfig
from populace.core.natsserver import free_port
from populace.core.scenario import merged

# progress and notes go to stderr, like the CLI's: stdout stays the bench's table or JSON
console = Console(stderr=True)

FLOOR_SCRIPT = """
import asyncio, sys, time
n, latency = int(sys.argv[1]), float(sys.argv[2])
async def main():
    t = time.perf_counter()
    await asyncio.gather(*(asyncio.sleep(latency) for _ in range(n)))
    return time.perf_counter() - t
print(asyncio.run(main()))
"""


@dataclass
class DummyBenchResult:
    simulation: str
    agents: int
    rounds: int
    latency_s: float
    hosts: int
    storage: str  # JetStream storage of the run
    setup_s: float  # run start → every host has created its agents
    round_s: float  # round open → round result (mean over rounds)
    record_lag_s: float  # last result → every guess committed in DuckDB
    total_s: float  # run start → recorded
    recorded: int  # outcomes found in DuckDB (the simulation's outcome table)
    acted: int  # agents that acted, summed over rounds (the rounds table's n): what must be recorded
    peak_rss_bytes: int  # all processes of the stack, sampled every 0.2 s
    baseline_rss_bytes: int  # the stack before the run
    bytes_per_agent: float  # (peak - baseline) / agents
    asyncio_floor_s: float | None  # plain asyncio: gather(N × sleep(latency)), one process
    messages_per_round: float  # messages nats-server received during the run, per round
    # bytes nats-server received from clients and delivered to them during the run, per round
    bus_bytes_in_per_round: float | None = None
    bus_bytes_out_per_round: float | None = None
    round_times_s: list[float] = field(default_factory=list)
    machine: dict = field(default_factory=dict)
    # a run with a graph: the manifest's graph (generator, edges, numbering, edge cuts) and
    # what crossed hosts per round (mail messages, posts, bytes, from the hosts' logs) and what
    # agents heard per round (posts delivered into inboxes, from DuckDB)
    graph: dict | None = None
    mail_messages_per_round: float | None = None
    mail_posts_per_round: float | None = None
    mail_bytes_per_round: float | None = None
    posts_heard_per_round: float | None = None
    heard_per_s: float | None = None
    # what the agent-hosts' checkpoints wrote, summed over hosts, per round (their round_played lines)
    checkpoint_bytes_by_round: list[int] = field(default_factory=list)
    # a simulation with scenes: acts found in DuckDB (its acts table), and the acts its rounds
    # played (the hosts' LLM calls: one per act on the dummy model)
    acts_recorded: int | None = None
    # prompts the hosts sent again because no model answered them (the rounds tables' infra_retries)
    infra_retries: int = 0
    # CPU seconds each process used from the run's start to its end (where a round's time goes)
    cpu_by_process: dict[str, float] = field(default_factory=dict)
    # each process's own peak resident bytes over the run (not at the same instant): whose memory it is
    peak_rss_by_process: dict[str, int] = field(default_factory=dict)
    # the scenario keys set for this run (--set, --compare-set), so two runs of one simulation are told apart
    params: dict = field(default_factory=dict)
    # who saw what: rows of table `shown` (a simulation that declares shown_items), to equal `acted`
    shown_recorded: int | None = None
    # where a round went (table round_profile), per round: the hosts' seconds summed (views, turns,
    # folds) and the recorder's
    profile_s: dict[str, float] = field(default_factory=dict)
    # a population that changes (--turnover): the share of the living that left after each round, as
    # many newcomers arriving, and what table `population` recorded of them
    turnover: float | None = None
    departures_recorded: int | None = None
    arrivals_recorded: int | None = None

    def to_json(self, **kw) -> str:
        return json.dumps(asdict(self), **kw)

    def table(self) -> Table:
        t = Table(title=f"dummy benchmark ({self.simulation}): {self.agents:,} agents × {self.rounds} round(s), "
                        f"latency {self.latency_s}s")
        t.add_column("measure")
        t.add_column("value", justify="right")
        gib = 1024**3
        for k, v in [
            ("setup (spawn agents)", f"{self.setup_s:.2f} s"),
            ("round (open → result)", f"{self.round_s:.2f} s"),
            ("record lag (result → in DuckDB)", f"{self.record_lag_s:.2f} s"),
            ("total (start → recorded)", f"{self.total_s:.2f} s"),
            ("agents that acted (all rounds)", f"{self.acted:,}"),
            ("outcomes recorded", f"{self.recorded:,}"),
            *((("acts recorded", f"{self.acts_recorded:,}"),) if self.acts_recorded is not None else ()),
            *((("shown rows recorded", f"{self.shown_recorded:,}"),) if self.shown_recorded is not None else ()),
            *((f"{k.removesuffix('_s')} per round (round_profile)", f"{v:.2f} s") for k, v in self.profile_s.items()),
            ("infra retries", f"{self.infra_retries:,}"),
            *((("turnover after each round", f"{self.turnover:.2%} left, as many arrived"),
               ("departures, arrivals recorded", f"{self.departures_recorded:,}, {self.arrivals_recorded:,}"))
              if self.turnover is not None else ()),
            ("messages per round", f"{self.messages_per_round:,.0f}"),
            *((("bus bytes per round, in / out", f"{self.bus_bytes_in_per_round / 2**20:,.1f} / "
                                                  f"{self.bus_bytes_out_per_round / 2**20:,.1f} MiB"),)
              if self.bus_bytes_in_per_round is not None and self.bus_bytes_out_per_round is not None else ()),
            ("peak RSS, all processes", f"{self.peak_rss_bytes / gib:.2f} GiB"),
            ("bytes per agent", f"{self.bytes_per_agent:,.0f}"),
            ("plain asyncio floor", "—" if self.asyncio_floor_s is None else f"{self.asyncio_floor_s:.2f} s"),
        ]:
            t.add_row(k, v)
        if self.graph is not None:
            g = self.graph
            cut = (g.get("edge_cut") or {}).get(str(self.hosts))
            ids = (g.get("edge_cut_ids") or {}).get(str(self.hosts))
            for k, v in [
                ("graph", f"{g.get('generator')}, {g.get('edges', 0):,} edges, agents numbered by "
                          f"{g.get('placement')}"),
                ("edges cut across hosts", "—" if cut is None else f"{cut:.1%}"
                 + ("" if ids is None or g.get("placement") != "partition" else f" (generator's ids: {ids:.1%})")),
                ("posts heard per round", f"{self.posts_heard_per_round or 0:,.0f}"),
                ("posts heard per second of round", f"{self.heard_per_s or 0:,.0f}"),
                ("cross-host mail per round", f"{self.mail_messages_per_round or 0:,.0f} messages, "
                                              f"{self.mail_posts_per_round or 0:,.0f} posts, "
                                              f"{(self.mail_bytes_per_round or 0) / 1024**2:,.1f} MiB"),
            ]:
                t.add_row(k, v)
        return t


def cpu_seconds(stack: Stack) -> dict[str, float]:
    """CPU seconds (user + system) each process of the stack used so far, NATS as "nats"."""
    import psutil

    named = {key: p.pid for key, p in stack.procs.items() if p.poll() is None}
    if stack.nats and stack.nats.pid:
        named["nats"] = stack.nats.pid
    out = {}
    for key, pid in named.items():
        try:
            t = psutil.Process(pid).cpu_times()
            out[str(key)] = t.user + t.system
        except psutil.Error:
            pass
    return out


class RssSampler:
    """Peak memory while the run plays (sampled), and each process's CPU seconds over it."""

    def __init__(self, stack: Stack, every_s: float = 0.2) -> None:
        self.stack, self.every = stack, every_s
        self.peak = 0
        self.peak_by_process: dict[str, int] = {}  # each process's own peak (not at the same instant)
        self.cpu_by_process: dict[str, float] = {}  # CPU seconds over the run, by service key
        self._cpu_start: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        each = self.stack.rss_by_process()
        self.peak = max(self.peak, sum(each.values()))
        for key, rss in each.items():
            self.peak_by_process[key] = max(self.peak_by_process.get(key, 0), rss)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.every)

    def __enter__(self) -> RssSampler:
        self._cpu_start = cpu_seconds(self.stack)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        self.cpu_by_process = {k: round(v - self._cpu_start.get(k, 0.0), 2) for k, v in cpu_seconds(self.stack).items()}


def asyncio_floor(agents: int, latency: float) -> float:
    res = subprocess.run([sys.executable, "-c", FLOOR_SCRIPT, str(agents), str(latency)],
                         capture_output=True, text=True, check=True)
    return float(res.stdout.strip())


def received(monitor_port: int) -> tuple[int, int, int]:
    """What nats-server has received from clients so far, and delivered to them (its /varz
    `in_msgs`, `in_bytes`, `out_bytes`): the bus's traffic, payloads and headers."""
    varz = httpx.get(f"http://127.0.0.1:{monitor_port}/varz", timeout=5).json()
    return varz["in_msgs"], varz["in_bytes"], varz["out_bytes"]


# A population made for the graph benchmark: one attribute with five equally likely values (the
# homophily graph links agents that share it) and short template personas.
BENCH_POPULATION = """name: bench-groups
total: {agents}
seed: 0
attributes:
  group:
    weights: {{a: 0.2, b: 0.2, c: 0.2, d: 0.2, e: 0.2}}
"""


def graph_section(generator: str, degree: int) -> dict:
    """The bench's `graph:` for a generator at a mean degree."""
    if generator == "homophily":
        return {"generator": "homophily", "attribute": "group", "degree": degree, "strength": 0.8}
    if generator == "scale-free":
        return {"generator": "scale-free", "m": max(1, degree // 2)}
    return {"generator": "small-world", "degree": degree + degree % 2, "rewire": 0.1}


def played_lines(log_dir: str, run_id: str, hosts: int) -> list[dict]:
    """The agent-hosts' round_played log lines of a run."""
    out = []
    for i in range(hosts):
        path = Path(log_dir) / f"agent-host-{i}.log"
        for line in path.read_text().splitlines() if path.exists() else ():
            if '"round_played"' in line and run_id in line:
                out.append(json.loads(line))
    return out


def mail_per_round(log_dir: str, run_id: str, hosts: int) -> tuple[float, float, float]:
    """(messages, posts, bytes) the agent-hosts sent each other per round (their round_played
    log lines)."""
    totals, rounds = [0, 0, 0], set()
    for i in range(hosts):
        path = Path(log_dir) / f"agent-host-{i}.log"
        for line in path.read_text().splitlines() if path.exists() else ():
            if '"round_played"' not in line or run_id not in line:
                continue
            rec = json.loads(line)
            rounds.add(rec["round"])
            for j, key in enumerate(("mail_messages", "mail_posts", "mail_bytes")):
                totals[j] += rec.get(key, 0)
    n = max(1, len(rounds))
    return totals[0] / n, totals[1] / n, totals[2] / n


def run_dummy_bench(agents: int, latency: float, hosts: int, rounds: int = 1, floor: bool = True,
                    quiet: bool = False, storage: str = "memory", simulation: str = "ratio-game",
                    params: dict | None = None, graph: dict | None = None,
                    placement: str = "partition", turnover: float | None = None) -> DummyBenchResult:
    """`graph`: a `graph:` section (the run is prepared like `populace run` does: the graph built,
    numbered by `placement`, uploaded; a homophily graph gets a synthetic population). `turnover`:
    after every round this share of the living leaves and as many newcomers (that share of
    `agents`) arrive (a scheduled `population: changes:`)."""
    workdir = tempfile.mkdtemp(prefix="populace-bench-")
    data = {"name": f"bench-{simulation}", "simulation": simulation, "agents": agents, "rounds": rounds,
            "model": {"backend": "dummy", "latency_s": latency}, **(params or {})}
    if turnover:
        data["population"] = turnover_section(agents, turnover)
    personas = blobs = manifest = None
    if graph is None:
        resolved = checked(RunConfig.model_validate(data))
    else:
        from populace.client.prepare import prepare

        data["graph"] = {**graph, "placement": placement}
        if graph.get("generator") == "homophily":
            (Path(workdir) / "population.yaml").write_text(BENCH_POPULATION.format(agents=agents))
            data["population"] = {"config": "population.yaml"}
        t = time.perf_counter()
        prepared = prepare(RunConfig.model_validate(data), base=Path(workdir), agents_given=True)
        resolved, personas, blobs, manifest = (prepared.resolved, prepared.personas, prepared.graph_blobs,
                                               prepared.manifest)
        if not quiet:
            console.print(f"graph built and numbered in {time.perf_counter() - t:.1f} s: "
                                  f"{prepared.manifest['graph']}", highlight=False)
    config, tables = resolved.config, resolved.simulation.tables()
    table = tables.outcomes
    db = str(Path(workdir) / "bench.duckdb")
    monitor = free_port()
    # Memory storage (the default) keeps the benchmark about the pipeline, not this disk.
    stack = Stack(hosts=hosts, db=db, log_dir=str(Path(workdir) / "logs"), nats_args=["-m", str(monitor)],
                  env={"POPULACE_STORAGE": storage, "POPULACE_LOG_LEVEL": "INFO"})
    log = console.print if not quiet else (lambda *a, **k: None)
    try:
        stack.start()
        asyncio.run(stack.wait_ready(timeout=120))
        time.sleep(1.0)
        baseline = stack.rss_bytes()
        log(f"stack ready ({hosts} agent-hosts); running {agents:,} agents × {rounds} round(s)")

        async def go():
            nc = await bus.connect(stack.url, "populace-bench")
            try:
                with RunProgress(config, enabled=not quiet) as progress:
                    return await play(nc, config, on_event=progress.on_event, stall_s=600, personas=personas,
                                      graph=blobs, manifest=manifest)
            finally:
                await nc.close()

        before = received(monitor)
        with RssSampler(stack) as sampler:
            outcome = asyncio.run(go())
        messages, bytes_in, bytes_out = (b - a for a, b in zip(before, received(monitor), strict=True))
        mail = mail_per_round(stack.log_dir, outcome.run_id, hosts) if graph is not None else None
        saved = [0] * rounds
        for rec in played_lines(stack.log_dir, outcome.run_id, hosts):
            saved[rec["round"] - 1] += rec.get("checkpoint_bytes", 0)
    finally:
        stack.stop()
    if outcome.status != "completed":
        raise RuntimeError(f"benchmark run {outcome.status}: {outcome.reason}")
    with duckdb.connect(db, read_only=True) as con:
        recorded = con.execute(f'SELECT count(*) FROM "{table}" WHERE run_id = ?', [outcome.run_id]).fetchone()[0]
        # the agents that acted (all of them, unless the simulation selects who acts)
        acted, retries = con.execute(f'SELECT sum(n), sum(infra_retries) FROM "{tables.rounds}" WHERE run_id = ?',
                                     [outcome.run_id]).fetchone()
        acts = (con.execute(f'SELECT count(*) FROM "{tables.acts}" WHERE run_id = ?', [outcome.run_id]).fetchone()[0]
                if tables.acts else None)
        # rounds after the first: the first has nothing to hear
        heard_by_round = dict(con.execute("SELECT round, sum(heard) FROM posts WHERE run_id = ? AND round > 1 "
                                          "GROUP BY round", [outcome.run_id]).fetchall()) if graph is not None else {}
        shown = (con.execute("SELECT count(*) FROM shown WHERE run_id = ?", [outcome.run_id]).fetchone()[0]
                 if tables.shown_items else None)
        spent = con.execute("SELECT sum(view_s), sum(turn_s), sum(merge_s), sum(record_s) FROM round_profile "
                            "WHERE run_id = ?", [outcome.run_id]).fetchone()
        profile = {k: round((v or 0.0) / rounds, 3) for k, v in zip(("view_s", "turn_s", "merge_s", "record_s"), spent)}
        changes = dict(con.execute("SELECT event, count(*) FROM population WHERE run_id = ? GROUP BY event",
                                   [outcome.run_id]).fetchall()) if turnover else {}
    m = outcome.marks
    round_times = [m[f"result.{n}"] - m[f"open.{n}"] for n in range(1, rounds + 1)]
    heard = sum(heard_by_round.values()) / len(heard_by_round) if heard_by_round else None
    heard_rate = (sum(heard_by_round[n] / round_times[n - 1] for n in heard_by_round) / len(heard_by_round)
                  if heard_by_round else None)
    floor_s = None
    if floor:
        log("measuring the plain-asyncio floor …")
        floor_s = asyncio_floor(agents, latency)
    return DummyBenchResult(
        simulation=simulation, agents=agents, rounds=rounds, latency_s=latency, hosts=hosts, storage=storage,
        setup_s=m["spawned"] - m["submitted"],
        round_s=sum(round_times) / len(round_times),
        record_lag_s=m["recorded"] - m[f"result.{rounds}"],
        total_s=m["recorded"] - m["submitted"],
        recorded=recorded, acted=int(acted or 0), peak_rss_bytes=sampler.peak, baseline_rss_bytes=baseline,
        bytes_per_agent=max(0, sampler.peak - baseline) / agents,
        asyncio_floor_s=floor_s, messages_per_round=messages / rounds,
        bus_bytes_in_per_round=bytes_in / rounds, bus_bytes_out_per_round=bytes_out / rounds, round_times_s=round_times,
        machine={"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        graph=(manifest or {}).get("graph"),
        mail_messages_per_round=mail[0] if mail else None, mail_posts_per_round=mail[1] if mail else None,
        mail_bytes_per_round=mail[2] if mail else None, posts_heard_per_round=heard, heard_per_s=heard_rate,
        checkpoint_bytes_by_round=saved, acts_recorded=acts, infra_retries=int(retries or 0),
        cpu_by_process=sampler.cpu_by_process,
        peak_rss_by_process=dict(sampler.peak_by_process), params=params or {}, shown_recorded=shown, profile_s=profile,
        turnover=turnover or None,
        departures_recorded=changes.get("left", 0) if turnover else None,
        arrivals_recorded=changes.get("arrived", 0) if turnover else None,
    )


def turnover_section(agents: int, share: float) -> dict:
    """A `population:` section in which, after every round, `share` of the living leave and as
    many newcomers arrive as `share` of the first agents."""
    return {"changes": [{"after": "every", "left": share, "arrived": max(1, round(share * agents)),
                         "reason": "turnover"}]}


@dataclass
class DummyBenchSeries:
    """A `populace bench dummy` invocation: its runs (a graph's numbering and the generator's ids
    when both placements are compared, then the compared simulation) and the ratios between them."""

    runs: list[DummyBenchResult]
    summary: dict

    def document(self) -> str:
        """The JSON written to --out and printed with --json: one run's result, or all of them."""
        if len(self.runs) == 1:
            return self.runs[0].to_json(indent=2)
        return json.dumps({"runs": [json.loads(r.to_json()) for r in self.runs], **self.summary}, indent=2)

    def short(self) -> DummyBenchResult | None:
        """The first run that recorded fewer outcomes than its agents played (None: all complete)."""
        return next((r for r in self.runs if r.recorded != r.acted), None)


def run_dummy_series(*, agents: int, latency: float, hosts: int, rounds: int, floor: bool, quiet: bool, storage: str,
                     simulation: str, params: dict, graph: dict | None, placement: str, compare: str | None,
                     compare_params: dict | None = None, on_result=None,
                     turnover: float | None = None) -> DummyBenchSeries:
    """Every run a `populace bench dummy` asks for, in order; `on_result(result)` after each. The
    compared run plays `compare` on its defaults; with `compare_params`, it plays `compare` (default:
    the same simulation) with them — on top of `params` when it is the same simulation (the same
    study with one thing changed)."""
    common = {"agents": agents, "latency": latency, "hosts": hosts, "rounds": rounds, "floor": floor,
              "quiet": quiet, "storage": storage, "turnover": turnover}
    runs: list[DummyBenchResult] = []
    placements = (("partition", "ids") if placement == "both" else (placement,)) if graph else ("partition",)
    for how in placements:
        runs.append(run_dummy_bench(**common, simulation=simulation, params=params, graph=graph, placement=how))
        if on_result:
            on_result(runs[-1])
    same = compare_params is not None and (compare or simulation) == simulation  # the study, one key changed
    if compare_params is not None:
        compare = compare or simulation
    if compare:
        runs.append(run_dummy_bench(**common, simulation=compare, params=merged(params if same else {},
                                                                                compare_params or {}),
                                    graph=graph if same else None))
        if on_result:
            on_result(runs[-1])
    return DummyBenchSeries(runs, series_summary(runs, placement == "both" and graph is not None, compare is not None))


def series_summary(runs: list[DummyBenchResult], both: bool, compared: bool) -> dict:
    """Ratios between a bench's runs: cross-host mail with the generator's ids over the graph's
    numbering, and the graph run's round time over the compared simulation's."""
    out: dict = {}
    if both:
        part, ids = runs[0], runs[1]
        out["cross_host_bytes_ids_over_partition"] = round((ids.mail_bytes_per_round or 0)
                                                           / max(1.0, part.mail_bytes_per_round or 0), 2)
        out["cross_host_posts_ids_over_partition"] = round((ids.mail_posts_per_round or 0)
                                                           / max(1.0, part.mail_posts_per_round or 0), 2)
    if compared:
        out["round_time_over_compared"] = round(runs[0].round_s / max(1e-9, runs[-1].round_s), 2)
    return out
