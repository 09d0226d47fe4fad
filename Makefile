# rocm-assets from a terminal. `make dev` and `make test` are the README's set-up; both install
# what they need first (.ci/setup: apt packages as root, then the project into .venv).
SHELL := /bin/bash
BIN := $(if $(VIRTUAL_ENV),$(VIRTUAL_ENV)/bin,$(CURDIR)/.venv/bin)
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: setup dev test test-slow lint demo

setup:
	bash .ci/setup

# The Dagster UI and daemon (with the placement coordinator) on http://127.0.0.1:3000, storing
# runs in SQLite under $(DAGSTER_HOME), with the shipped rocm-bake.hcl and fleet.yaml.
dev: setup
	mkdir -p "$(DAGSTER_HOME)"
	cp dagster.yaml "$(DAGSTER_HOME)/dagster.yaml"
	$(BIN)/python -m dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

# The tests start their own registry, dockerds, sshd and PostgreSQL on loopback. Two workers
# (pytest-xdist), a test module per worker at a time so module fixtures are shared. pytest's
# exit 5 (nothing collected) is a failure.
PYTEST = @status=0; $(BIN)/python -m pytest -n 2 --dist loadfile -m $(1) || status=$$?; \
	if [ $$status -eq 5 ]; then echo "make $@: pytest collected no tests" >&2; exit 1; fi; \
	exit $$status

# Everything but the tests marked slow: the everyday suite.
test: setup
	$(call PYTEST,"not slow")

# The tests marked slow: the deployment under compose and the fault tests that hold a farm for
# minutes (a 150-run burst, a cut link, a registry outage, a killed daemon, a fleet edit, the
# authority stress). CI runs both targets.
test-slow: setup
	$(call PYTEST,slow)

lint: setup
	$(BIN)/python -m ruff check .

# The example farm (examples/farm) on this machine, as root: a local registry, three BuildKit nodes
# (dockerds on private sockets, each a buildx builder) and the UI on http://127.0.0.1:3000 running
# a two-arch backfill, every build a real `docker buildx bake`. Ctrl-C stops and removes all of it;
# if a part of it dies, it stops the rest and keeps its directory (logs, runs) and says where.
# Needs `docker buildx`: without it, it says in one line how to install it.
demo: setup
	$(BIN)/python examples/demo.py

# ---- The seed's targets, as thin calls into Dagster and rocm-assets ----------------------------
# push-all, push-wheels, push-pytorch, push-runtime and gpu-test launch a backfill through the
# webserver's GraphQL API (`rocm-assets backfill`), so the UI must be up (`make dev`, or a
# deployment at DAGSTER_URL). The coordinator places each build on the pool, one run per build,
# started once its inputs are pushed, so the seed's `BUILDER=snoc-pool` is accepted and not needed.
# ARCH is the GPU arches to build, space-separated; it defaults to $GPU_ARCH. Each target runs
# $(BIN)/rocm-assets, which `make setup` installs.
#
# Env-only settings. Bake reads PUBLISHED_INPUTS, SCCACHE_LOG, RUN_ID, CACHE_TAG_SUFFIX and the
# SDE_* pins from its environment, so they are not make variables here: write
# `SCCACHE_LOG=debug make build-all BUILDER=snoc-think`, not `make build-all ... SCCACHE_LOG=debug`.
# build-all's bake inherits them from the caller unchanged. The push-* and gpu-test builds run in
# Dagster's run workers, which inherit the environment `make dev` was started with: set them
# there. Those builds always bake with PUBLISHED_INPUTS=1 and RUN_ID=<run id>; build-all refuses
# PUBLISHED_INPUTS=1.
ARCH ?= $(GPU_ARCH)
GROUP ?= default
DAGSTER_URL ?= http://127.0.0.1:3000
ROCM_ASSETS = $(BIN)/rocm-assets
BACKFILL = $(ROCM_ASSETS) backfill --url $(DAGSTER_URL)
ARCHES = --arch $(or $(strip $(ARCH)),$(error make $@: set ARCH=<arch ...> (or GPU_ARCH): the GPU arches to build))

.PHONY: push-all push-wheels push-pytorch push-runtime gpu-test build-all watch

# The default group for ARCH, scheduled over the pool and published: the usual way to build.
push-all:
	$(BACKFILL) --group default $(ARCHES)

# Just the wheel artifacts: the wheels group.
push-wheels:
	$(BACKFILL) --group wheels $(ARCHES)

# The pytorch image alone.
push-pytorch:
	$(BACKFILL) --targets pytorch $(ARCHES)

# pytorch-run is in no group (no node has a GPU to exercise it): only its own job builds it.
push-runtime:
	$(BACKFILL) --job pytorch_run_job $(ARCHES)

# The seed's `make test`: pytorch-test on a fleet node with each arch's GPU, as pytorch's check.
# A job of checks alone carries no partitions in Dagster 1.13, so each arch is its own run,
# queued through the instance in $(DAGSTER_HOME) with the partition as a tag.
gpu-test:
	@for arch in $(or $(strip $(ARCH)),$(error make $@: set ARCH=<arch ...> (or GPU_ARCH))); do \
	  $(BIN)/python -m dagster job launch -w workspace.yaml -j pytorch_test_job \
	    --tags "{\"dagster/partition\": \"$$arch\"}" || exit $$?; \
	done

# GROUP (default: default) on ONE builder in one bake: contexts resolve in-process, nothing is
# pushed. BUILDER must be one node's builder in the fleet file; the pool is refused, because
# every target would be its own bake and stage 2 would build against whatever is in the registry.
build-all:
	$(ROCM_ASSETS) build-all --builder $(or $(BUILDER),$(error make build-all: set BUILDER=<one node's builder in fleet.yaml>)) --group $(GROUP) $(if $(strip $(ARCH)),--arch $(ARCH))

# The farm live: a line per node, then the queue; Ctrl-C ends it. ONCE=1 prints one frame.
watch:
	$(ROCM_ASSETS) watch --url $(DAGSTER_URL) $(if $(ONCE),--once)

# ---- The deployment: deploy/README.md ---------------------------------------------------------
.PHONY: deploy-base-images deploy-wheelhouse

# The base images from Debian packages, for a Docker host that cannot pull from Docker Hub: a
# bookworm minbase (debootstrap), Python 3.11, buildx and PostgreSQL. As root, on the host whose
# engine builds the farm; prints the deploy/.env lines that select them. REBUILD=1 makes them anew.
deploy-base-images:
	bash deploy/base-images.sh $(if $(REBUILD),--rebuild)

# Every wheel the farm image installs, for a host whose image builds reach no package index:
# set ROCM_WHEELHOUSE to WHEELHOUSE and ROCM_PIP_NO_INDEX=1 in deploy/.env.
WHEELHOUSE ?= $(CURDIR)/deploy/.wheelhouse
deploy-wheelhouse:
	$(BIN)/python -m pip download --dest "$(WHEELHOUSE)" . -r deploy/requirements.txt 'setuptools>=68'
