# The two commands a new user needs: `make demo` and `make test`. Everything else is set-up.
.DEFAULT_GOAL := help
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
SETUP := $(VENV)/.bootstrapped
SETUP_INPUTS := pyproject.toml $(wildcard uv.lock) libs/pyproject.toml \
	services/ingest/pyproject.toml services/decision/pyproject.toml services/actuator/pyproject.toml

.PHONY: help setup demo test test-unit test-integration test-e2e lint typecheck fmt clean k8s-testbin \
	gpu-stack-testbin

help:
	@echo "make demo   - set up, start an embedded NATS and run the simulated cluster demo"
	@echo "make test   - set up, start the servers the suite needs and run every test"
	@echo "make lint   - ruff, mypy (strict) and import-linter"
	@echo "make k8s-testbin - build/cache kube-apiserver, etcd, helm (once per machine, needs Go)"
	@echo "make gpu-stack-testbin - build/cache kwok, KAI-Scheduler, cluster-autoscaler (needs Go)"

$(SETUP): $(SETUP_INPUTS) scripts/bootstrap.sh
	PYTHON=$(PY) scripts/bootstrap.sh

setup: $(SETUP)

demo: $(SETUP)
	$(BIN)/fracpilot demo

lint: $(SETUP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

typecheck: $(SETUP)
	$(BIN)/mypy

fmt: $(SETUP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# kube-apiserver, etcd and helm for tests/integration/k8s, built from their Go modules into
# ~/.cache/fracpilot/k8s-testbin (FRACPILOT_K8S_TESTBIN overrides); about a second when cached.
k8s-testbin:
	bash scripts/k8s-testbin.sh >/dev/null

# The real GPU scheduling stack for tests/integration/gpu_stack: kwok, KAI-Scheduler, kube-scheduler,
# kube-controller-manager and cluster-autoscaler (kwok provider), built from their Go modules into
# ~/.cache/fracpilot/gpu-stack-testbin (FRACPILOT_GPU_STACK_TESTBIN overrides); ~15 min cold,
# under a second when cached.
gpu-stack-testbin: k8s-testbin
	bash scripts/gpu-stack-testbin.sh >/dev/null

# Servers the tests start themselves: Debian's prometheus package (tests/support/prometheus_server.py).
# Installs only when missing (needs root/apt); about 0.05 s when already there.
.PHONY: servers
servers:
	bash scripts/install-servers.sh

test test-integration: servers

# The suite waits on servers more than it computes: workers overlap the waits. Each worker
# starts its own servers; tests/conftest.py keeps the tests of one expensive server (and of
# one module) together and hands the longest groups out first (--no-loadscope-reorder keeps
# its order). The chaos suite runs afterwards, away from the other tests: it measures
# recovery times, which a busy machine would stretch. Its scenarios run two at a time: each
# waits on a paced load (samples at a fixed rate) and takes about half a core of two.
PYTEST_WORKERS ?= 3
CHAOS_WORKERS ?= 2
PYTEST_PARALLEL = -n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=25

test: $(SETUP) lint k8s-testbin gpu-stack-testbin
	$(BIN)/pytest $(PYTEST_PARALLEL) -m "not chaos"
	$(BIN)/pytest -n $(CHAOS_WORKERS) --dist loadgroup --no-loadscope-reorder -m chaos \
		--durations=10 tests/chaos

test-unit: $(SETUP)
	$(BIN)/pytest tests/unit

test-integration: $(SETUP) k8s-testbin gpu-stack-testbin
	$(BIN)/pytest -m integration

test-e2e: $(SETUP)
	$(BIN)/pytest -m e2e

# Fuzzing: `make test` runs a short pass (300 generated inputs per subject, hypothesis profile
# "fuzz"); this runs the long one, at least 10,000 per subject ("fuzz-long", tests/conftest.py).
.PHONY: fuzz
fuzz: $(SETUP)
	FRACPILOT_FUZZ_LONG=1 $(BIN)/pytest tests/unit/fuzz tests/integration/test_fuzz_subjects.py \
		tests/integration/test_fuzz_webhook.py -s \
		-W ignore::hypothesis.errors.HypothesisWarning --timeout 3600

# The chart carries copies of files kept elsewhere (a copied chart must render alone: no links
# out of it): the RBAC of deploy/rbac/ and the alert rules of deploy/prometheus/. This copies
# them and regenerates the chart's README from values.yaml; tests fail when either is stale.
.PHONY: chart-sync chart-readme
chart-sync: chart-readme
	mkdir -p helm/fracpilot/files/rbac
	cp deploy/rbac/*.yaml helm/fracpilot/files/rbac/
	cp deploy/prometheus/fracpilot-alerts.yml helm/fracpilot/files/fracpilot-alerts.yml
	mkdir -p helm/fracpilot/files/nats
	cp deploy/nats/permissions.conf helm/fracpilot/files/nats/permissions.conf

chart-readme: $(SETUP)
	$(BIN)/python scripts/chart_readme.py

clean:
	rm -rf $(VENV) .tools .pytest_cache .mypy_cache .ruff_cache .hypothesis
