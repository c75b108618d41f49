"""The `populace` command line."""
