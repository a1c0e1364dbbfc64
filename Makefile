# The one task-runner file: the README and .ci/run call these targets.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TASK ?= cartpole-balance
# mypy on all four import roots (pyproject's [tool.mypy]), errors at the real files' paths
MYPY := $(BIN)/python import-roots/mypy_real_paths.py

.PHONY: help install run demo test lint typecheck proto lock bench clean

help:  ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# (setup.py builds the optional C module ale.core._linehash, the verifier's per-line hasher: with
# gcc, Python's headers and libssl-dev; without them the install goes on and the verifier uses its
# Python reference, slower; docs/verifier.md, "The native line hasher")
$(VENV)/.installed: pyproject.toml setup.py ale/core/_linehash.c ale/core/_eventscan.c | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	@$(BIN)/python -c 'import ale.core._linehash, ale.core._eventscan' 2>/dev/null || echo "note: the C line hasher and event scan were not built (it needs gcc, python3-dev and libssl-dev); the verifier uses its Python reference, which is slower. To build it: install those, then touch setup.py && make install"
	touch $@

install: $(VENV)/.installed  ## create .venv and install the project with its dev tools

run:  ## the main job: `ale run TASK` with the bundled demo agent; prints the bundle's path
	@sh scripts/preflight.sh $(PY)
	@$(MAKE) --no-print-directory install
	$(BIN)/ale run $(TASK) --out out

demo: install  ## the evaluator alone: serve TASK and drive it with the gym client
	$(BIN)/ale-evaluator demo --task $(TASK)

test: install  ## the whole test suite, lint and type checks included
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(MYPY)
	$(BIN)/pytest

lint: install  ## ruff only
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

typecheck: install  ## mypy strict on ale, ale_evaluator, ale_verify, ale_site
	$(MYPY)

proto: install  ## regenerate ale/env/v1 from proto/ (tests fail when it is stale)
	$(BIN)/python -m grpc_tools.protoc -I proto --python_out=. --grpc_python_out=. --pyi_out=. proto/ale/env/v1/env.proto

lock: install  ## build the evaluator and agent images, write their digests into the release's lock (commit it)
	$(BIN)/ale images build agent-base evaluator
	$(BIN)/ale images lock

bench: install  ## every benchmark; each prints its ratios and writes bench/results/*.json
	$(BIN)/python bench/evaluator_bench.py --out bench/results/evaluator.json
	$(BIN)/python bench/view_bench.py
	$(BIN)/python bench/harness_bench.py --out bench/results/harness.json
	$(BIN)/python bench/verifier_bench.py --out bench/results/verifier.json
	$(BIN)/python bench/site_bench.py
	$(BIN)/python bench/gateway_bench.py --out bench/results/gateway.json

clean:  ## remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
