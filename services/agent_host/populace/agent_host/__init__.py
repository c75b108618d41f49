"""agent-host: hosts many agents per process (or one agent per OS process) and plays their turns."""
