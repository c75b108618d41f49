"""`populace nodes`' tables carry each node's and each process's numbers, not only their headings:
rendered from hand-made registry entries and read back cell by cell."""

from __future__ import annotations

from rich.console import Console

from populace.cli.nodes import nodes_table, processes_table
from populace.core.contracts import NodeInfo, ProcessInfo
from populace.core.contracts.node_messages import AgentHostSpec, GatewaySpec, GpuInfo, RestartPolicy

NOW = 1_800_000_000.0


def cells(table) -> list[list[str]]:
    console = Console(width=250, record=True)
    console.print(table)
    return [[c.strip() for c in line.strip("│").split("│")] for line in console.export_text().splitlines()
            if line.startswith("│")]


PROCESSES = [
    ProcessInfo(proc_id="agent-host-1", spec=AgentHostSpec(max_in_flight=5000),
                restart=RestartPolicy(mode="on-failure", max_restarts=3), state="running", pid=4321, restarts=1,
                started_at=NOW - 60, cpu_percent=87.4, rss_bytes=300 * 2**20, log_path="/tmp/a.log"),
    ProcessInfo(proc_id="gateway-1", spec=GatewaySpec(), restart=RestartPolicy(), state="exited", exit_code=-9,
                started_at=NOW - 60, cpu_percent=12.0, rss_bytes=50 * 2**20, log_path="/tmp/g.log"),
]


def test_each_process_row_has_its_state_pid_exit_restarts_cpu_memory_and_settings():
    assert cells(processes_table(PROCESSES, "node n1")) == [
        ["agent-host-1", "running", "4321", "", "1/3", "87", "300 MB", "max_in_flight=5000"],
        # not running: no CPU or memory shown (the last sample is not the process's now)
        ["gateway-1", "exited", "", "-9", "0", "", "", ""],
    ]


def test_each_node_row_has_its_machine_and_counts():
    live = NodeInfo(node_id="n1", hostname="box-1", pid=10, version="0.1.0", cpus=8, memory_bytes=16 * 2**30,
                    memory_available_bytes=6 * 2**30, gpus=[GpuInfo(index=0, name="L4", memory_mb=23034)],
                    log_dir="/tmp", started_at=NOW - 3725, heartbeat_at=NOW, heartbeat_s=2.0, processes=PROCESSES)
    gone = live.model_copy(update={"node_id": "n2", "hostname": "box-2", "gpus": [], "processes": [],
                                   "heartbeat_at": 1_000.0, "started_at": 0.0})
    assert cells(nodes_table([live, gone])) == [
        ["n1", "box-1", "8", "16,384 MB (6,144 MB)", "0: L4", "1 running / 2", "0.1.0", "3,725 s"],
        ["n2 (gone)", "box-2", "8", "16,384 MB (6,144 MB)", "-", "0 running / 0", "0.1.0", "1,000 s"],
    ]
