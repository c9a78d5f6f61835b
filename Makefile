# gpuorch — run `make help` for the targets.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
N ?= 3
SIM_N ?= 10000
TEST_WORKERS ?= 2  # pytest-xdist workers; each module (and its embedded system) stays on one worker

.DEFAULT_GOAL := help

help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*?## "}{printf "  \033[1m%-10s\033[0m %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,web]'
	@touch $(STAMP)

setup: $(STAMP) ## Create .venv and install gpuorch with its pinned dependencies

lint: $(STAMP) ## ruff, mypy (strict on proto/ and the pure decision modules), import-linter (package boundaries)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

schemas: $(STAMP) ## Export the contract as JSON Schema into proto/schemas/
	$(BIN)/python -m gpuorch_proto.schema proto/schemas

test: $(STAMP) ## Lint, then the whole pytest suite against a real nats-server and local clusters
	$(MAKE) lint
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile

demo: $(STAMP) ## Start NATS, the four services and local clusters; run the seed's scenario; stop everything
	$(BIN)/gpuorch demo

chaos: $(STAMP) ## Deterministic simulation (SIM_N=10000 schedules), its one-line production mutants (each found within SIM_N), real-process chaos (N=3 schedules), then `make mutants`
	@$(BIN)/python -m gpuorch.dev.dst --schedules $(SIM_N); sim=$$?; \
	echo; $(BIN)/python -m gpuorch.dev.dst --mutants all --schedules $(SIM_N); dmut=$$?; \
	echo; echo "blips around LOST_AFTER (the production liveness rules, virtual time):"; \
	$(BIN)/python -m gpuorch.dev.dst.liveness; \
	echo; echo "real-process chaos (the shells):"; \
	$(BIN)/python -m gpuorch.dev.chaos --schedules $(N); real=$$?; \
	echo; echo "security mutants (the attack suite):"; \
	$(BIN)/python -m gpuorch.dev.security_mutants; mut=$$?; \
	exit $$(( sim | dmut | real | mut ))

mutants: $(STAMP) ## Security mutation campaign: each protection removed on its own must fail its attack tests
	$(BIN)/python -m gpuorch.dev.security_mutants

bench: $(STAMP) ## Benchmarks: routing policy throughput and more; prints numbers
	$(BIN)/python -m gpuorch.dev.bench

clean: ## Remove the venv and local state
	rm -rf $(VENV) .gpuorch .pytest_cache .mypy_cache .ruff_cache

.PHONY: help setup lint schemas test demo chaos mutants bench clean
