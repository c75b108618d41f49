"""recorder: a durable JetStream consumer of every run event, written to DuckDB."""
