"""`populace bench dummy`'s table and the ratios between its runs carry the measured numbers:
rendered from hand-made results and read back cell by cell."""

from __future__ import annotations

from rich.console import Console

from populace.bench.dummy import DummyBenchResult, series_summary


def result(**kw) -> DummyBenchResult:
    base = {"simulation": "ratio-game", "agents": 100_000, "rounds": 2, "latency_s": 1.0, "hosts": 2,
            "storage": "memory", "setup_s": 3.456, "round_s": 4.5, "record_lag_s": 0.25, "total_s": 14.0,
            "recorded": 200_000, "acted": 200_000, "peak_rss_bytes": 3 * 1024**3 // 2, "baseline_rss_bytes": 0,
            "bytes_per_agent": 2890.4, "asyncio_floor_s": 1.87, "messages_per_round": 1234.6}
    return DummyBenchResult(**{**base, **kw})


def rows(r: DummyBenchResult) -> dict[str, str]:
    console = Console(width=200, record=True)
    console.print(r.table())
    return {cells[0]: cells[1] for line in console.export_text().splitlines() if line.startswith("│")
            for cells in [[c.strip() for c in line.strip("│").split("│")]]}


def test_the_table_shows_each_measure():
    assert rows(result()) == {
        "setup (spawn agents)": "3.46 s", "round (open → result)": "4.50 s", "record lag (result → in DuckDB)": "0.25 s",
        "total (start → recorded)": "14.00 s", "agents that acted (all rounds)": "200,000",
        "outcomes recorded": "200,000", "messages per round": "1,235", "peak RSS, all processes": "1.50 GiB",
        "bytes per agent": "2,890", "plain asyncio floor": "1.87 s", "infra retries": "0"}
    assert rows(result(asyncio_floor_s=None))["plain asyncio floor"] == "—"
    scene = rows(result(acts_recorded=400_000, infra_retries=12))
    assert (scene["acts recorded"], scene["infra retries"]) == ("400,000", "12")
    feed = rows(result(shown_recorded=20_000, profile_s={"view_s": 1.234, "record_s": 0.5}))
    assert (feed["shown rows recorded"], feed["view per round (round_profile)"],
            feed["record per round (round_profile)"]) == ("20,000", "1.23 s", "0.50 s")


def test_a_graph_run_adds_its_cut_and_mail():
    g = {"generator": "homophily", "edges": 400_000, "placement": "partition", "edge_cut": {"2": 0.134},
         "edge_cut_ids": {"2": 0.514}}
    shown = rows(result(graph=g, posts_heard_per_round=612_345, heard_per_s=136_076.7, mail_messages_per_round=40,
                        mail_posts_per_round=20_000, mail_bytes_per_round=3 * 1024**2))
    assert shown["graph"] == "homophily, 400,000 edges, agents numbered by partition"
    assert shown["edges cut across hosts"] == "13.4% (generator's ids: 51.4%)"
    assert (shown["posts heard per round"], shown["posts heard per second of round"]) == ("612,345", "136,077")
    assert shown["cross-host mail per round"] == "40 messages, 20,000 posts, 3.0 MiB"


def test_the_series_ratios():
    graph, compared = result(round_s=9.0, mail_bytes_per_round=1000, mail_posts_per_round=10), result(round_s=4.0)
    ids = result(mail_bytes_per_round=2500, mail_posts_per_round=35)
    assert series_summary([graph, compared], both=False, compared=True) == {"round_time_over_compared": 2.25}
    assert series_summary([graph, ids], both=True, compared=False) == {
        "cross_host_bytes_ids_over_partition": 2.5, "cross_host_posts_ids_over_partition": 3.5}
