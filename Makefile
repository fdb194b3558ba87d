# Two commands matter: `make run` and `make test`. Everything else is what they build on.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
TRITON_ENV := .venv-triton
BUILD_ENV := .venv-build
SCHEMA_CHECK := deploy/grafana/schema-check
OIDC_PROVIDER := tests/oidc-provider
PORT ?= 8080
# `make test` runs the tests that time nothing on this many processes at once (pytest-xdist),
# then the ones marked `alone` (floods, deadlines, latency bounds) one at a time.
TEST_WORKERS ?= 2
# What `make run` and `make test` install and build first, made side by side (a parallel make:
# pip, torch and npm each wait on something else much of the time).
SETUP_JOBS ?= 3
PIP := --disable-pip-version-check --quiet
# Every environment installs from its lock (hashes, every package pinned: nothing resolves
# at install time); `make lock` writes them.
LOCKED := $(PIP) --require-hashes --no-deps
# PyTorch's CPU wheels (torch 2.13.0+cpu, the model build only): PyPI's torch is a CUDA
# build of several GB. Our machines also carry the wheel in pip's find-links.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
# ... the same file PyTorch's index serves (its hash is in the lock); `make lock` reads it
# there when it is present, as our machines reach no other index than PyPI.
LOCAL_TORCH := /opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
UV_VERSION := 0.13.8
LOCK_TOOL := .venv-lock
APT_TEST_PACKAGES := chromium prometheus docker-compose wrk hey haproxy redis-server curl valgrind
# The container tests' (make test-containers): podman builds and runs the images, with
# runc and netavark (../shared/PLATFORM.md, Containers; netavark runs iptables); debootstrap
# makes their base.
APT_CONTAINER_PACKAGES := podman runc netavark aardvark-dns iptables debootstrap docker-compose

.PHONY: test-setup test-containers test-quarantine lock models-examples keys help run test lint typecheck models install system-deps test-system-deps clean bench bench-capacity bench-placement bench-ledger bench-instructions bench-shared-state soak gpu-smoke docs docs-serve

help:
	@echo "make run    install, build the models, start Triton (CPU) and the gateway on :$(PORT)"
	@echo "make test   install (apt packages included), build the models, lint and run the whole suite"
	@echo "make models export the ONNX models make run serves into model_repository/ (skips what is up to date)"
	@echo "make lock   re-resolve every environment's lock file (uv), hashes included"
	@echo "make test-containers  build the images in deploy/ with podman and run them as compose and k8s do"
	@echo "make test-quarantine  the tests of bounds not yet met (xfail), outside make test: XPASS when one holds"
	@echo "make lint   ruff + mypy"
	@echo "make bench  the gateway beside Triton direct, a reference gateway and KServe: table, JSON, plot in .reports/"
	@echo "make bench-capacity  static in-flight limits 1..64 against the default gate under overload (hey)"
	@echo "make bench-placement two Tritons, one 5x slower: shortest queue against round-robin and the two apart"
	@echo "make bench-ledger  what each stage of the hot path costs (py-spy under load)"
	@echo "make bench-instructions  instructions per request, gateway and reference (callgrind: no noise from the machine)"
	@echo "make soak   5 minutes at 80 % of capacity: RSS drift, descriptors, metric series, errors"
	@echo "make gpu-smoke  on a GPU host: docker compose up, then every check in one report"
	@echo "make keys   API keys for compose and Kubernetes (deploy/secrets/), a client key printed once"
	@echo "make docs   build the documentation site into site/ (make docs-serve: serve it)"
	@echo "make clean  remove the virtual environments and built models"

# Debian's Python needs python3-venv for `python3 -m venv`.
system-deps:
	@$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || { \
	  echo "installing python3-venv (apt)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq python3-venv; }

test-system-deps: system-deps
	@command -v npm >/dev/null || { \
	  echo "installing nodejs and npm (apt)"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq nodejs npm; }
	@missing=""; for p in $(APT_TEST_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing$$missing (apt)"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# The gateway: what serving needs, from its lock.
$(VENV)/.installed: deploy/gateway/requirements.txt pyproject.toml | system-deps
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install $(LOCKED) -r deploy/gateway/requirements.txt
	$(VENV)/bin/pip install $(PIP) --no-deps --no-build-isolation -e .
	touch $@

# The dev and test tools beside it (lint, types, the suite's clients), from their lock.
$(VENV)/.dev-installed: $(VENV)/.installed deploy/gateway/requirements-dev.txt
	$(VENV)/bin/pip install $(LOCKED) -r deploy/gateway/requirements-dev.txt
	touch $@

# Triton's own environment: the Python backend stub runs its python3 (numpy<2!).
$(TRITON_ENV)/.installed: deploy/triton/requirements.txt deploy/triton/pytriton.txt | system-deps
	$(PYTHON) -m venv $(TRITON_ENV)
	$(TRITON_ENV)/bin/pip install $(LOCKED) -r deploy/triton/requirements.txt
	$(TRITON_ENV)/bin/pip install $(LOCKED) -r deploy/triton/pytriton.txt
	touch $@

# Export-time only (torch, CPU build); never needed to serve.
$(BUILD_ENV)/.installed: deploy/model-build/requirements.txt deploy/model-build/requirements-nodeps.txt deploy/model-build/torch.txt | system-deps
	$(PYTHON) -m venv $(BUILD_ENV)
	$(BUILD_ENV)/bin/pip install $(LOCKED) --retries 1 --extra-index-url $(TORCH_INDEX) -r deploy/model-build/torch.txt
	$(BUILD_ENV)/bin/pip install $(LOCKED) -r deploy/model-build/requirements.txt
	$(BUILD_ENV)/bin/pip install $(LOCKED) -r deploy/model-build/requirements-nodeps.txt
	touch $@

# The locks, re-resolved with uv (seconds, where pip's resolver walked back through every
# tritonclient release for minutes): universal (every platform's wheels hashed) except the
# model build, which is Linux x86_64 with torch's CPU build. Prove an update with `make test`.
LOCK := $(LOCK_TOOL)/bin/uv pip compile --quiet --generate-hashes --python-version 3.11
lock: | system-deps
	test -x $(LOCK_TOOL)/bin/uv || { $(PYTHON) -m venv $(LOCK_TOOL) && $(LOCK_TOOL)/bin/pip install $(PIP) uv==$(UV_VERSION); }
	$(LOCK) --universal pyproject.toml deploy/gateway/build-system.in -o deploy/gateway/requirements.txt
	$(LOCK) --universal pyproject.toml deploy/gateway/build-system.in --extra dev \
	  -c deploy/gateway/requirements.txt -o deploy/gateway/requirements-dev.txt
	$(LOCK) --universal deploy/triton/requirements.in -o deploy/triton/requirements.txt
	$(LOCK) --universal --no-deps deploy/triton/pytriton.in -o deploy/triton/pytriton.txt
	$(LOCK) --python-platform x86_64-manylinux_2_28 --index-strategy unsafe-best-match \
	  $(if $(wildcard $(LOCAL_TORCH)),--find-links $(dir $(LOCAL_TORCH)),--extra-index-url $(TORCH_INDEX)) \
	  deploy/model-build/requirements.in -o deploy/model-build/requirements.txt
	$(LOCK) --universal --no-deps deploy/model-build/requirements-nodeps.in -o deploy/model-build/requirements-nodeps.txt
	{ echo "# torch alone, from deploy/model-build/requirements.txt: installed first, from TORCH_INDEX"; \
	  awk '/^torch==/{p=1; print; next} p && /^[^ ]/{p=0} p' deploy/model-build/requirements.txt; } > deploy/model-build/torch.txt

install: $(VENV)/.installed $(TRITON_ENV)/.installed

# Grafana's published dashboard schema + TypeScript, to type-check the dashboards.
$(SCHEMA_CHECK)/node_modules/.installed: $(SCHEMA_CHECK)/package-lock.json | test-system-deps
	npm ci --prefix $(SCHEMA_CHECK) --no-audit --no-fund --loglevel=error
	touch $@

# A certified OpenID Provider (node-oidc-provider) for the token tests (tests/helpers/oidc.py).
$(OIDC_PROVIDER)/node_modules/.installed: $(OIDC_PROVIDER)/package-lock.json | test-system-deps
	npm ci --prefix $(OIDC_PROVIDER) --no-audit --no-fund --loglevel=error
	touch $@

# KServe's transformer, which `make bench` (and its smoke test) measures beside the gateway,
# in a virtual environment of its own (gateway/bench/side_by_side.py makes it on first use;
# made here so the suite's time is the tests').
KSERVE_ENV := .cache/kserve-0.21.0
$(KSERVE_ENV)/.installed: | $(VENV)/.dev-installed
	$(VENV)/bin/python -c "from pathlib import Path; from gateway.bench.side_by_side import kserve_python; kserve_python(Path('.cache'))"

# What `make run` serves (model_repository/); the tutorials' example networks are
# `make models-examples` (the suite builds them). build.py skips what is up to date; the
# marker skips even the build environment while none of its inputs changed.
MODEL_INPUTS := $(wildcard deploy/model-build/*.py deploy/model-build/*.txt deploy/model-build/data/*) \
  model_repository/text_postprocess/labels.txt model_repository/image_postprocess/labels.txt
MODELS_BUILT := model_repository/.built
$(MODELS_BUILT): $(MODEL_INPUTS)
	$(MAKE) --no-print-directory $(BUILD_ENV)/.installed
	$(BUILD_ENV)/bin/python deploy/model-build/build.py --repository model_repository
	touch $@

models: $(MODELS_BUILT)

# (the build environment made in the recipe, after `models`: as a prerequisite beside it, a
# parallel make installed it twice at once, once here and once in MODELS_BUILT's own make)
models-examples: models
	$(MAKE) --no-print-directory $(BUILD_ENV)/.installed
	$(BUILD_ENV)/bin/python deploy/model-build/build.py --repository model_repository --examples build/examples

# torch's build environment (1.1 GB) only exports the models: `make run` removes it once
# they are built (KEEP_BUILD_ENV=1 keeps it; the next export makes it again).
KEEP_BUILD_ENV ?=
# (the environments and the models made side by side, as for `make test`)
run:
	$(MAKE) --no-print-directory -j$(SETUP_JOBS) --output-sync=line install models
	$(if $(KEEP_BUILD_ENV),,rm -rf $(BUILD_ENV))
	$(VENV)/bin/triton-gateway local --port $(PORT) --triton-env $(TRITON_ENV)

lint: $(VENV)/.dev-installed
	$(VENV)/bin/ruff check gateway tests deploy model_repository
	$(VENV)/bin/ruff format --check gateway tests deploy model_repository
	$(VENV)/bin/mypy

# What the suite needs, made side by side (SETUP_JOBS): 244 s on a fresh clone here, against
# 348 s one after another.
TEST_SETUP := test-system-deps install $(VENV)/.dev-installed models-examples lint $(SCHEMA_CHECK)/node_modules/.installed \
  $(OIDC_PROVIDER)/node_modules/.installed $(KSERVE_ENV)/.installed
test-setup: $(TEST_SETUP)

test:
	$(MAKE) --no-print-directory -j$(SETUP_JOBS) --output-sync=target test-setup
	TRITON_GATEWAY_TRITON_ENV=$(TRITON_ENV) $(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadfile \
	  -m "not containers and not quarantine and not alone"; shared=$$?; \
	TRITON_GATEWAY_TRITON_ENV=$(TRITON_ENV) $(VENV)/bin/pytest -m "not containers and not quarantine and alone"; \
	alone=$$?; [ $$shared = 0 ] && [ $$alone = 0 ]

# The tests of acceptance bounds not yet met (xfail: they cannot fail a run), kept out of
# `make test`; run and reported here (XPASS when a bound holds).
test-quarantine: test-system-deps install $(VENV)/.dev-installed models-examples
	TRITON_GATEWAY_TRITON_ENV=$(TRITON_ENV) $(VENV)/bin/pytest -m quarantine -rxX

# The images in deploy/ built with podman from the locks, and run as compose and Kubernetes
# run them (tests/containers; CI runs it after the suite). Leaves images, never containers.
test-containers: install $(VENV)/.dev-installed models
	@missing=""; for p in $(APT_CONTAINER_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing$$missing (apt)"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	$(VENV)/bin/pytest -m containers tests/containers

clean:
	rm -rf $(VENV) $(TRITON_ENV) $(BUILD_ENV) $(LOCK_TOOL) .triton $(SCHEMA_CHECK)/node_modules
	find model_repository -name '*.onnx' -o -name '*.onnx.stamp' | xargs -r rm -f
	rm -f $(MODELS_BUILT)

# The gateway side by side with Triton direct (trivial and real models; own Triton and
# gateway; wrk as the HTTP load generator): table, .reports/bench.json and .reports/bench.png.
# BENCH_OPTIONS=--perf-analyzer adds NVIDIA's perf_analyzer, Triton's HTTP against /v2.
BENCH_OPTIONS ?=
bench: test-system-deps install $(VENV)/.dev-installed models
	$(VENV)/bin/triton-gateway bench --out .reports/bench $(BENCH_OPTIONS)

# Where the in-flight limit sits: static limits 1, 2, 4 ... 64 and the default (each model gated on Triton's batches), each
# flooded by hey (100 connections that send again at once) for 30 s, three times interleaved,
# at Triton's speed and 5x slower (about 40 minutes): .reports/capacity.json, the medians with
# their spread, and the verdict against the best static limit and the cap of 64.
bench-capacity: test-system-deps install $(VENV)/.dev-installed
	$(VENV)/bin/python -m gateway.bench.capacity --out .reports/capacity

# Placement across Triton replicas: two Tritons, the second 5x slower, behind one gateway
# placing by shortest queue and one by round-robin, against the two apart; a flood and half
# load, three rounds interleaved (about 5 minutes): .reports/placement.json.
bench-placement: test-system-deps install $(VENV)/.dev-installed models
	$(VENV)/bin/python -m gateway.bench.placement --out .reports/placement

# The hot path's cost ledger: each stage's share of the gateway's CPU (py-spy under wrk load,
# trivial model, c=8): .reports/ledger.json.
bench-ledger: test-system-deps install $(VENV)/.dev-installed models
	$(VENV)/bin/python -m gateway.bench.ledger --out .reports/ledger.json

# Instructions per request of the gateway and the reference gateway (valgrind's callgrind,
# trivial model, one request at a time): a count the machine's load does not move, for
# changes too small for CPU time to show. AGAINST=<rev> adds the gateway at that revision.
bench-instructions: test-system-deps install $(VENV)/.dev-installed
	$(VENV)/bin/python -m gateway.bench.instructions --out .reports/instructions.json $(if $(AGAINST),--against $(AGAINST))

# API keys for the compose stack and Kubernetes, in one step: deploy/secrets/api-keys (the
# gateway's keys file: hashes), deploy/secrets/prometheus-key (Prometheus scrapes /metrics
# with it), deploy/secrets/smoke-key (make gpu-smoke's) and a first client key, printed
# once. Never committed (.gitignore).
keys: $(VENV)/.installed
	@test ! -e deploy/secrets/api-keys || { echo "deploy/secrets/api-keys exists: add a client with $(VENV)/bin/triton-gateway new-key ID --keys-file deploy/secrets/api-keys"; exit 1; }
	@mkdir -p deploy/secrets && chmod 700 deploy/secrets
	@$(VENV)/bin/triton-gateway new-key prometheus --keys-file deploy/secrets/api-keys > deploy/secrets/prometheus-key
	@chmod 644 deploy/secrets/prometheus-key  # read by Prometheus's own user in its container
	@$(VENV)/bin/triton-gateway new-key smoke --keys-file deploy/secrets/api-keys > deploy/secrets/smoke-key
	@echo "client key for 'client' (keep it; it is not stored):"
	@$(VENV)/bin/triton-gateway new-key client --keys-file deploy/secrets/api-keys
	@chmod 644 deploy/secrets/api-keys  # hashes only; read by the gateway's user in its container

# The documentation site (mkdocs.yml, docs/): built offline into site/, or served.
docs: $(VENV)/.dev-installed
	$(VENV)/bin/python docs/generate.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: $(VENV)/.dev-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

# The cost of shared rate limits: the same gateway with its buckets in a real redis-server.
bench-shared-state: test-system-deps install $(VENV)/.dev-installed models
	$(VENV)/bin/triton-gateway bench --shared-state --repositories trivial --out .reports/bench-shared-state

# 5 minutes of mixed traffic at 80 % of capacity against its own Triton and gateway:
# RSS drift, descriptors, metric series, errors (exit 1 on a problem).
soak: install $(VENV)/.dev-installed models
	mkdir -p .reports
	$(VENV)/bin/python tests/helpers/soak.py --seconds 300 --json .reports/soak.json

# On a GPU host: bring up the compose GPU stack and check it in one go (one-screen report).
gpu-smoke: $(VENV)/.dev-installed
	$(VENV)/bin/python deploy/gpu-smoke/smoke.py --compose gpu --perf --url http://localhost:$(PORT)
