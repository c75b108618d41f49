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

# The paper's education study with chain of thought on 50 SmolLM2 personas, then its report
study:
    uv run populace demo --scenario examples/education-cot.yaml --db education-cot.duckdb
    uv run populace results last --db education-cot.duckdb --by education
    uv run populace report last --db education-cot.duckdb --out education-cot.html

# The two games × 3 seeds on the dummy model (a quick sweep), table in ratios.csv
sweep:
    uv run populace sweep examples/sweeps/ratios.yaml --out ratios.csv --db ratios.duckdb

# Gateway benchmark, result saved under bench/results/
bench-gateway:
    uv run populace bench gateway --json --out bench/results/gateway.json

# Test suite on 2 workers; extra arguments go to pytest (e.g. `just test tests/unit -x`, `-n 0` for one process)
test *args:
    uv run --extra local pytest -n 3 --dist loadgroup --durations=30 {{ args }}

# Dummy benchmark: 100k agents, 1 s per answer
bench:
    uv run populace bench dummy --agents 100000 --latency 1.0

# Dummy benchmark: 1M agents, result saved under bench/results/
bench-1m:
    uv run populace bench dummy --agents 1000000 --latency 1.0 --out bench/results/dummy-1000000.json

# Dummy benchmark of the public-goods game (groups of 5): 1M agents
bench-public-goods:
    uv run populace bench dummy --simulation public-goods --agents 1000000 --latency 1.0 --out bench/results/dummy-public-goods-1000000.json

# Dummy benchmark of the public-goods game with punishment (a scene of 4 members, two ordered acts a
# round, groups drawn again every round): 1M agents, and the ratio game at the same size in the same run
bench-punishment:
    uv run populace bench dummy --simulation punishment --agents 1000000 --latency 1.0 --compare ratio-game --out bench/results/dummy-punishment-1000000.json

# Ruff (pinned in the dev group, configured in pyproject.toml; the test suite runs it too)
lint:
    uv run ruff check .

# AsyncAPI documents of every service (each subject with its payload schema) under docs/asyncapi/
asyncapi:
    for s in orchestrator agent_host environment gateway recorder; do uv run faststream docs gen populace.$s.app:faststream_app --factory --out docs/asyncapi/$s.json; done

# Where the documentation lives
docs:
    @echo "Docs: README.md (the front page and a map), docs/*.md (a manual per topic: simulations.md to write your own, built-in-simulations, graphs, worlds, models, scenarios, populations-and-reports, commands, recorded, failures, security, manager, compose-and-deployment, how-it-works, benchmarks, development, limits), deploy/README.md (Docker image, compose, POPULACE_* settings), deploy/CLUSTER.md, deploy/AUTH.md; 'just asyncapi' writes every service's AsyncAPI document to docs/asyncapi/."

# Validate compose.yaml (needs Docker with the compose plugin)
compose-config:
    docker compose config -q
