# Populace task runner (https://just.systems). `just` alone lists the recipes.

# List the recipes
default:
    @just --list

# Embedded NATS and every service in the foreground (Ctrl-C stops)
up:
    uv run populace up

# Start everything, play one game, print the rounds
demo:
    uv run populace demo

# Test suite; extra arguments go to pytest (e.g. `just test tests/unit -x`)
test *args:
    uv run pytest {{ args }}

# Dummy benchmark: 100k agents, 1 s per answer
bench:
    uv run populace bench dummy --agents 100000 --latency 1.0

# Dummy benchmark: 1M agents, result saved under bench/results/
bench-1m:
    uv run populace bench dummy --agents 1000000 --latency 1.0 --out bench/results/dummy-1m.json

# Ruff, without adding it to the project's dependencies
lint:
    uv run --with ruff ruff check .

# Where the documentation lives
docs:
    @echo "Docs: README.md (overview, CLI), deploy/README.md (Docker image, compose, POPULACE_* settings) and docs/ (design notes, as they are added)."

# Validate compose.yaml (needs Docker with the compose plugin)
compose-config:
    docker compose config -q
