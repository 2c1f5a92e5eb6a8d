# Two commands a user needs: `make demo` and `make test`. Both create .venv when missing.
VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip
# torch is pinned and installed first: the pin takes the CPU build; anything else pulls CUDA.
TORCH   := torch==2.13.0

.PHONY: demo test lint bench clean venv grpc-stubs

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

venv: $(PY)

$(VENV)/.demo-installed: $(PY) pyproject.toml
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e '.[torch]'
	touch $@

$(VENV)/.dev-installed: $(PY) pyproject.toml
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e '.[dev]'
	touch $@

demo: $(VENV)/.demo-installed
	$(VENV)/bin/dlscale demo

lint: $(VENV)/.dev-installed
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy

test: lint
	$(VENV)/bin/pytest -q

bench: $(VENV)/.dev-installed
	$(PY) -m benchmarks.run

# Regenerate the committed gRPC stubs after editing src/dlscale/wire/proto/inference.proto.
grpc-stubs: $(VENV)/.dev-installed
	$(PY) scripts/gen_grpc.py

clean:
	rm -rf $(VENV) .dlscale .pytest_cache .mypy_cache .ruff_cache
