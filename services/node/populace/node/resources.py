"""What a node tells about its machine: host name, CPUs, memory, GPUs (when `nvidia-smi` is
there), a few free ports."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess

import psutil

from populace.core.contracts import GpuInfo

NVIDIA_SMI_QUERY = ["--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"]


def parse_nvidia_smi(text: str) -> list[GpuInfo]:
    """`nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader,nounits` output;
    lines it cannot read are left out."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not parts[0].isdigit():
            continue
        try:
            memory = int(float(parts[2]))
        except ValueError:
            continue
        gpus.append(GpuInfo(index=int(parts[0]), name=parts[1], memory_mb=memory))
    return gpus


def gpus() -> list[GpuInfo]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, *NVIDIA_SMI_QUERY], capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_nvidia_smi(out.stdout)


def free_ports(count: int = 5) -> list[int]:
    """`count` TCP ports nothing listens on now (the kernel's choice; held together, so distinct)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("0.0.0.0", 0))
            socks.append(s)
        return sorted(s.getsockname()[1] for s in socks)
    finally:
        for s in socks:
            s.close()


def default_node_id() -> str:
    """The machine's short host name, as one subject token (letters, digits, '-', '_')."""
    name = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname().split(".")[0])[:64]
    return name or "node"


def machine() -> dict:
    memory = psutil.virtual_memory()
    return {"hostname": socket.gethostname(), "cpus": os.cpu_count() or 1, "memory_bytes": memory.total,
            "memory_available_bytes": memory.available}
