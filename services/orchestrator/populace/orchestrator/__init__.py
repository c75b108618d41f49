"""orchestrator: accepts runs, places agents on agent-hosts, paces rounds, keeps run state."""
