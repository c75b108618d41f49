"""`populace bench gateway|vllm|llm|dummy`: the benchmarks, printed and optionally saved as JSON."""

# No `from __future__ import annotations` (typer evaluates string ones at each start: populace.cli.main)
import os
from pathlib import Path
from typing import Annotated, Literal

import typer

from populace.cli import checks, display
from populace.cli.choices import EndpointKind, LlmServer, Storage
from populace.cli.common import SET_HELP, checked, fail, scenario_overrides

app = typer.Typer(help="Benchmarks (results are printed and optionally saved as JSON).", no_args_is_help=True,
                  rich_markup_mode=None)

# `bench dummy --degree`: the graph's generator, and how its agents are numbered across hosts
GraphKind = Literal["homophily", "small-world", "scale-free"]
GraphPlacement = Literal["partition", "ids", "both"]


@app.command("gateway")
def bench_gateway(
    llm: Annotated[bool, typer.Option(help="also measure tokens per decision on SmolLM2 (llama.cpp)")] = True,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    out: Annotated[Path | None, typer.Option(help="also write the JSON result to this file")] = None,
) -> None:
    """Gateway overhead, routed throughput, prefix-affinity vs round-robin, share bound,
    tokens per decision (one structured call vs the paper's two calls)."""
    from populace.bench.gateway import run_gateway_bench

    if out:
        checks.output_file(out, "--out")
    result = run_gateway_bench(llm=llm, quiet=json_out)
    if out:
        checks.write_text(out, result.to_json(indent=2) + "\n")
    if json_out:
        print(result.to_json())
    else:
        display.out.print(result.table())


@app.command("vllm")
def bench_vllm(
    personas: Annotated[int, typer.Option(min=1, help="distinct persona prefixes in the routing workload")] = 64,
    persona_chars: Annotated[int, typer.Option(min=1, help="characters per persona prefix")] = 8000,
    requests: Annotated[int, typer.Option(min=1, help="requests in the routing workload (per router)")] = 384,
    concurrency: Annotated[int, typer.Option(min=1, help="requests in flight at once")] = 16,
    people: Annotated[int, typer.Option(min=1, help="ratio-game personas for one call vs two calls")] = 100,
    affinity: Annotated[bool, typer.Option(help="prefix-affinity vs round-robin, and the calibration")] = True,
    two_call: Annotated[bool, typer.Option(help="one structured call vs the paper's two calls")] = True,
    replica: Annotated[list[str] | None, typer.Option(help="use these vLLM replicas (started with "
                                                           "VLLM_SERVER_DEV_MODE=1) instead of starting two")] = None,
    out: Annotated[Path | None, typer.Option(help="also write the JSON result to this file")] = None,
) -> None:
    """On real vLLM (CPU build, two replicas started here): prefix-affinity vs round-robin by
    vLLM's own prefix-cache counters, the simulator calibrated against it, and one structured
    call vs the paper's two calls (populace.bench.vllm)."""
    from populace.bench.vllm import dumps, run_vllm_bench, table

    if out:
        checks.output_file(out, "--out")
    import httpx

    try:
        result = run_vllm_bench(personas_k=personas, chars=persona_chars, requests=requests, concurrency=concurrency,
                                people=people, affinity=affinity, two_call=two_call, replica_urls=replica)
    except httpx.TransportError as err:  # a replica (given by --replica, or started here) stopped answering
        fail(f"a vLLM replica did not answer{' (--replica ' + ', '.join(replica) + ')' if replica else ''}: "
             f"{type(err).__name__}: {err}", code=1)
    if out:
        checks.write_text(out, dumps(result) + "\n")
    display.out.print(table(result))


@app.command("llm")
def bench_llm(
    server: Annotated[LlmServer, typer.Option(help="the replicas of SmolLM2 the bench starts: vLLM's CPU build or "
                                                    "llama.cpp")] = "vllm",
    count: Annotated[int, typer.Option(min=1, help="replicas to start")] = 1,
    url: Annotated[str | None, typer.Option(help="an OpenAI-compatible endpoint to measure instead "
                                                 "(e.g. http://host:8000/v1); nothing is started")] = None,
    model: Annotated[str | None, typer.Option(help="with --url: the served model id")] = None,
    kind: Annotated[EndpointKind, typer.Option(help="with --url: its dialect (openai: json_schema answers, as vLLM; "
                                                    "llamacpp: json_object + schema)")] = "openai",
    api_key_env: Annotated[str | None, typer.Option(help="with --url: the environment variable holding its "
                                                         "key")] = None,
    agents: Annotated[int, typer.Option(min=1, help="agents (template personas of the education population)")] = 100,
    rounds: Annotated[int, typer.Option(min=1, help="rounds (from the second on, each persona is in the prefix "
                                                    "cache)")] = 3,
    personas: Annotated[Path | None, typer.Option(help="a personas JSONL instead (one agent a line), e.g. "
                                                       "examples/personas/education-50.jsonl")] = None,
    simulation: Annotated[str, typer.Option(help="simulation to play (any installed one)")] = "ratio-game",
    set_: Annotated[list[str] | None, typer.Option("--set", help=SET_HELP)] = None,
    sweep: Annotated[str, typer.Option(help="calls in flight per replica the direct path tries (comma-separated); "
                                            "default: 1,2,4,8,16,32 (llama.cpp: 1,2,4)")] = "",
    concurrency: Annotated[int | None, typer.Option(min=1, help="the gateway's cap of calls in flight per replica "
                                                               "(default: what `populace replicas` registers: 32 "
                                                               "vLLM CPU, 2 llama.cpp; a URL's limits.concurrency, "
                                                               "16)")] = None,
    repeat: Annotated[int, typer.Option(min=1, help="pairs of runs (direct, through Populace), alternated; the "
                                                    "medians are reported")] = 3,
    hosts: Annotated[int, typer.Option(min=1, help="agent-host processes of the Populace stack")] = 2,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    out: Annotated[Path | None, typer.Option(help="also write the JSON result to this file")] = None,
) -> None:
    """The real path against its replicas' own peak: the same replicas answer the same agents'
    calls directly (at the best of a sweep of calls in flight) and through a private Populace
    stack; decisions per second of each, their ratio, uncached prompt tokens per decision, the
    prefix-cache hit rate and the valid share (populace.bench.llm)."""
    from populace.bench import llm

    if url is None and (model or api_key_env or kind != "openai"):
        fail("--model, --kind, --api-key-env: only with --url (the replicas the bench starts are SmolLM2's)")
    if api_key_env and not os.environ.get(api_key_env):
        fail(f"--api-key-env: {api_key_env} is not set")
    if personas is not None and not personas.is_file():
        fail(f"--personas: {personas} is not a file")
    try:
        levels = llm.parse_sweep(sweep, server if url is None else kind)
    except ValueError as err:
        fail(f"--sweep: {err}")
    params = scenario_overrides(set_)
    options = {"server": server, "count": count, "url": url, "model": model, "kind": kind, "api_key_env": api_key_env,
               "agents": agents, "rounds": rounds, "simulation": simulation, "params": params,
               "personas": str(personas) if personas is not None else None, "concurrency": concurrency}
    checked(lambda: llm.check(**options))
    if out:
        checks.output_file(out, "--out")
    try:
        result = llm.run_llm_bench(**options, sweep=levels, repeat=repeat, hosts=hosts, quiet=json_out)
    except llm.BenchFailed as err:
        fail(str(err), code=1)
    if out:
        checks.write_text(out, result.to_json(indent=1) + "\n")
    if json_out:
        print(result.to_json())
    else:
        display.out.print(result.table())


@app.command("dummy")
def bench_dummy(
    agents: Annotated[int, typer.Option(min=1, help="agents")] = 10_000,
    latency: Annotated[float, typer.Option(min=0, help="seconds each agent's answer takes")] = 1.0,
    hosts: Annotated[int, typer.Option(min=0, help="agent-host processes (0 = CPU count)")] = 0,
    rounds: Annotated[int, typer.Option(min=1, help="rounds")] = 1,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    out: Annotated[Path | None, typer.Option(help="also write the JSON result to this file")] = None,
    floor: Annotated[bool, typer.Option(help="measure the plain-asyncio floor too")] = True,
    storage: Annotated[Storage, typer.Option(
                                         help="JetStream storage")] = "memory",
    simulation: Annotated[str, typer.Option(help="simulation to play (any installed one)")] = "ratio-game",
    set_: Annotated[list[str] | None, typer.Option("--set", help=SET_HELP)] = None,
    degree: Annotated[int | None, typer.Option(min=1, help="give the agents a social graph of this mean degree "
                                                          "(they hear their in-neighbours' posts)")] = None,
    graph: Annotated[GraphKind, typer.Option(
        help="the graph's generator (with --degree; homophily: on a synthetic population of 5 equal groups, "
             "strength 0.8)")] = "homophily",
    placement: Annotated[GraphPlacement, typer.Option(
        help="number agents along the graph (partition), keep the generator's ids, or play both and compare "
             "what crosses hosts")] = "partition",
    compare: Annotated[str | None, typer.Option(help="also play this simulation at the same size (e.g. ratio-game) "
                                                     "and report the round-time ratio")] = None,
    compare_set: Annotated[list[str] | None, typer.Option(
        "--compare-set", help="also play the same study (or --compare's) with this scenario key changed, e.g. "
                              "--compare-set recommender.record_shown=false, and report the round-time ratio "
                              "(repeatable)")] = None,
    turnover: Annotated[float | None, typer.Option(
        min=0, max=1, help="a population that changes: after every round this share of the living leaves and as "
                           "many newcomers arrive (e.g. 0.01)")] = None,
) -> None:
    """The paper's dummy benchmark through the whole pipeline: every agent's turn waits
    `latency` seconds for its answer; every outcome ends up in DuckDB. With --degree, agents talk
    on a graph: posts heard per second, cross-host mail and the edge cut are measured too."""
    from populace.bench.dummy import graph_section, run_dummy_series, turnover_section
    from populace.client.prepare import parse_config, prepare

    params = scenario_overrides(set_)
    changing = {"population": turnover_section(agents, turnover)} if turnover else {}
    checked(lambda: prepare(parse_config({"simulation": simulation, "agents": agents, **params, **changing})))
    compare_params = scenario_overrides(compare_set) if compare_set else None
    if compare is not None or compare_params is not None:  # played after the first bench: checked before it
        from populace.core.scenario import ScenarioError, merged

        other = compare or simulation
        same = compare_params is not None and other == simulation  # the same study with one key changed
        try:
            prepare(parse_config({"simulation": other, "agents": agents,
                                  **merged(params if same else {}, compare_params or {})}))
        except ScenarioError as err:
            fail(f"--compare{'-set' if compare_params is not None else ''}: {err}")
    if out:
        checks.output_file(out, "--out")
    section = graph_section(graph, degree) if degree is not None else None
    if section is not None:
        from populace.graph.config import parse_graph

        checked(lambda: parse_graph(section, agents))
    series = run_dummy_series(agents=agents, latency=latency, hosts=hosts or os.cpu_count() or 1, rounds=rounds,
                              floor=floor, quiet=json_out, storage=storage, simulation=simulation, params=params,
                              graph=section, placement=placement, compare=compare, compare_params=compare_params,
                              turnover=turnover or None,
                              on_result=None if json_out else lambda r: display.out.print(r.table()))
    if out:
        checks.write_text(out, series.document() + "\n")
    if json_out:
        print(series.document())
    else:
        for key, value in series.summary.items():
            display.out.print(f"{key.replace('_', ' ')}: {value}")
    short = series.short()
    if short:
        fail(f"{short.recorded} outcomes were recorded, but {short.acted} agents acted", code=1)
