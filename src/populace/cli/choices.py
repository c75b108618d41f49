"""The choices the CLI's options offer, spelled here so that building the command line (every
`populace …`, `--version` and `--help` included) does not import the contracts and settings
that validate them (their pydantic models take longer to build than the rest of the start).
tests/unit/test_cli_imports.py checks each equals the field it mirrors, so they cannot drift."""

from __future__ import annotations

from typing import Literal

ModelBackend = Literal["dummy", "local", "sim", "openai"]  # ModelConfig.backend
DemoModel = Literal[ModelBackend, "vllm"]  # vllm: backend openai, on vLLM replicas the demo starts
PersonaModel = Literal["template", "local", "sim", "openai"]  # ModelConfig.backend without dummy (writes no text)
Storage = Literal["file", "memory"]  # Settings.storage
RestartMode = Literal["never", "on-failure"]  # RestartPolicy.mode
Router = Literal["prefix-affinity", "least-loaded", "round-robin"]  # GatewaySpec.router (or None)
ReplicaBackend = Literal["local", "sim", "vllm"]  # ReplicasSpec.backend
LlmServer = Literal["vllm", "llamacpp"]  # populace.bench.llm.SERVERS: the replicas `bench llm` starts
EndpointKind = Literal["openai", "vllm", "llamacpp"]  # ModelEndpoint.kind, of an endpoint at a URL
