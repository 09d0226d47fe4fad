# rocm-assets from a terminal. `make dev` and `make test` are the README's set-up; both install
# what they need first (.ci/setup: apt packages as root, then the project into .venv).
SHELL := /bin/bash
BIN := $(if $(VIRTUAL_ENV),$(VIRTUAL_ENV)/bin,$(CURDIR)/.venv/bin)
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: setup dev test lint

setup:
	bash .ci/setup

# The Dagster UI and daemon (with the placement coordinator) on http://127.0.0.1:3000, storing
# runs in SQLite under $(DAGSTER_HOME), with the shipped rocm-bake.hcl and fleet.yaml.
dev: setup
	mkdir -p "$(DAGSTER_HOME)"
	cp dagster.yaml "$(DAGSTER_HOME)/dagster.yaml"
	$(BIN)/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

# The whole suite; the tests start their own registry, dockerd and sshd on loopback.
# pytest's exit 5 (nothing collected) is a failure, not a pass.
test: setup
	@status=0; $(BIN)/python -m pytest || status=$$?; \
	if [ $$status -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; \
	exit $$status

lint: setup
	$(BIN)/python -m ruff check .
