# deepdive-slurm developer entry points. `make test` and `make run` work on a fresh machine:
# both create the virtual environment first when it is missing or older than pyproject.toml.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PORT   ?= 8700

.PHONY: setup lock test test-fast test-installed image-context image-cpu image ci-container ci-two-hosts pin-images gpu-smoke lint typecheck unit slurm-install nix-install browser-install proxy-install slurm-up slurm-down run serve-tools bench clean

setup: $(STAMP)

# Everything but torch comes from requirements.lock (versions and hashes, generated from
# pyproject.toml by `make lock`); torch is the platform's build, installed first.
TORCH ?= torch==2.13.0
EXTRAS := --extra corpus --extra parquet --extra local --extra test

$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet '$(TORCH)'
	$(BIN)/python -m pip install --quiet --require-hashes -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(STAMP)

# Re-resolve the lock after a change to pyproject.toml's dependencies (needs the index).
lock:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet uv
	$(BIN)/uv pip compile pyproject.toml $(EXTRAS) --universal --generate-hashes --python-version 3.11 -o requirements.lock

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup
	$(BIN)/mypy

# The Slurm tests bring up their own private 2-node cluster (scripts/local-slurm.sh); Slurm and
# munge are installed here first when missing (as root), else those tests skip, saying why.
unit: setup slurm-install nix-install browser-install proxy-install
	$(BIN)/pytest

slurm-install:
	@scripts/local-slurm.sh install || echo "Slurm is not installed: the Slurm tests will skip"

# The trajectory page's tests drive a real headless Chromium through chromium-driver
# (tests/browser.py); installed here when missing (as root), else those tests skip, saying why.
browser-install:
	@{ command -v chromium >/dev/null && command -v chromedriver >/dev/null; } || scripts/apt-install.sh chromium chromium-driver || echo "Chromium is not installed: the browser tests will skip"

# The site-proxy tests (tests/site_proxy.py) run Debian's tinyproxy on a loopback port of their
# own, bridged by socat into a namespace with no route out; installed here when missing (as
# root), else those tests skip, saying why. (On a host with systemd, the package also starts its
# own tinyproxy service on port 8888, answering loopback only: `systemctl disable --now tinyproxy`.)
proxy-install:
	@{ command -v tinyproxy >/dev/null && command -v socat >/dev/null; } || scripts/apt-install.sh tinyproxy socat || echo "tinyproxy or socat is not installed: the site-proxy tests will skip"

# The flake's tests evaluate it with nix (offline, against a stand-in nixpkgs).
nix-install:
	@command -v nix >/dev/null || scripts/apt-install.sh nix-bin || echo "nix is not installed: the flake tests will skip"

# A private Slurm cluster on this host for trying `deepdive submit` (export the SLURM_CONF it prints).
slurm-up: slurm-install
	@scripts/local-slurm.sh up

slurm-down:
	@scripts/local-slurm.sh down

test: lint typecheck unit

# The inner loop: lint and the tests that need no Slurm, no containers and no slow run (the
# `slow` marker: whole jobs, whole local runs, memory and worker-process tests, anything over
# ~10 s, end-to-end wall-clock bounds; docs/testing.md).
test-fast: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	DEEPDIVE_SKIP_SLURM=1 $(BIN)/pytest -m "not slow" -q

# The same checks with the tools already on PATH (an image's environment, no .venv, caches
# under /tmp): what the container CI runs inside the SIF, on the project mounted read-only.
test-installed:
	ruff check --no-cache .
	ruff format --check --no-cache .
	mypy --cache-dir=/tmp/deepdive-mypy-cache
	HYPOTHESIS_STORAGE_DIRECTORY=/tmp/deepdive-hypothesis pytest -p no:cacheprovider

# The main job on the embedded defaults: the whole pipeline on this machine (world, services,
# warm start, GRPO, held-out evaluation); see configs/local.toml. Resumes when run again.
CONFIG ?= configs/local.toml
run: setup
	$(BIN)/deepdive run $(CONFIG)

# The tool server alone on the bundled Wikipedia corpus (no keys, no network).
serve-tools: setup
	$(BIN)/deepdive serve tools --search offline --reader offline --port $(PORT)

bench: setup
	@command -v wrk >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get install -y -q wrk >/dev/null; } \
		|| { echo "make bench needs wrk (apt-get install wrk)"; exit 1; }
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis *.egg-info

# Images (containers/): the CPU image with podman, then its SIF; the training image with
# Apptainer (needs a registry; its base digest in containers/pins.env); the container CI builds
# the CPU image on a debootstrapped base and runs the test suite inside its SIF.
# EXTRA_CA_DIR=/usr/local/share/ca-certificates: a build host behind a proxy whose CA pip needs
# (used while building, never kept in the image).
image-context: setup
	scripts/containers.sh context

image-cpu: setup
	scripts/containers.sh cpu

# NOTEST=1: build without %test (a host with no GPU driver), then `apptainer test --nv` on a GPU node
image:
	NOTEST=$(NOTEST) scripts/containers.sh train

ci-container: setup
	scripts/containers.sh ci

# The cluster as users meet it: a 2-host Slurm of podman containers (slurmctld on ctl, slurmd on
# n1 and n2, on a network and volume of its own), `deepdive submit` of cluster-tiny with every
# task inside the CPU SIF; a USR2 requeue and a SIGKILLed node (scripts/two-hosts.sh, docs/cluster.md).
ci-two-hosts: setup
	scripts/two-hosts.sh ci

pin-images:
	scripts/containers.sh pin

# The GPU acceptance kit (docs/gpu-smoke.md), each step failing loudly with what it checked:
# here, as one node (on a GPU node, inside the training image), or as one Slurm job of an
# experiment's nodes and image (EXPERIMENT=configs/x.toml, waiting for its report).
# MODEL=/models/Qwen2.5-0.5B-Instruct for steps 4 and 5; ONLY=1,6 for some steps.
SMOKE_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
# IMAGE=deepdive-train.sif: first the image's own %test with the node's driver
# (`apptainer test --nv`: what `make image NOTEST=1` left out), stopping there when it fails.
gpu-smoke:
	$(if $(IMAGE),apptainer test --nv $(IMAGE))
	$(SMOKE_PYTHON) -m slurm.cli smoke $(EXPERIMENT) $(if $(EXPERIMENT),--wait) \
		$(if $(MODEL),--model $(MODEL)) $(if $(ONLY),--only $(ONLY))
