# Developer entry points. `make test` sets up .venv on first use (CPU torch,
# ~1 min from the local wheel mirror) and reruns only when the packaging or
# this file changes (stamp: .venv/.installed).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# Pins: the CPU torch first, so that pip never pulls a CUDA torch for the
# package's `torch` requirement.
TORCH_VERSION := 2.13.0
TORCH_PIN := torch==$(TORCH_VERSION)
PINS := torch_geometric==2.8.0.post1 ninja==1.13.2 PyYAML==6.0.3 \
        tqdm==4.70.1 pytest==9.2.0
# Prebuilt torch-scatter / torch-sparse for torch 2.13.0+cpu (a source build
# takes ~30 min); torch-sparse needs scipy at run time.
SPARSE_WHEELS := ../shared/wheels/torch-2.13.0-cpu
SPARSE_PINS := scipy==1.17.1

DEMO_CFG ?= configs/demo.yaml
BENCH_ARGS ?= --quick

.PHONY: venv test demo compile-kernels bench clean-venv

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -qq $(TORCH_PIN)
	@$(PY) -W ignore -c "import torch, sys; v = torch.__version__; \
	    sys.exit(0 if v.split('+')[0] == '$(TORCH_VERSION)' else f'torch {v} in $(VENV), want $(TORCH_VERSION)')"
	$(PY) -m pip install -qq -e '.[test]' $(TORCH_PIN) $(PINS)
	@if ls $(SPARSE_WHEELS)/*.whl >/dev/null 2>&1; then \
	    echo "installing torch-scatter/torch-sparse from $(SPARSE_WHEELS)"; \
	    $(PY) -m pip install -qq --no-deps $(SPARSE_WHEELS)/*.whl && \
	    $(PY) -m pip install -qq $(SPARSE_PINS) || exit 1; \
	else \
	    echo "no $(SPARSE_WHEELS): skipping torch-sparse (optional)"; \
	fi
	$(PY) -c "import pyg_dfgnn, torch_geometric, yaml, tqdm, pytest"
	@touch $@

test: venv
	$(PY) -m pytest -q tests

demo: venv
	$(PY) -m pyg_dfgnn train --cfg $(DEMO_CFG)

compile-kernels:
	bash scripts/ci-compile-kernels.sh

bench: venv
	$(PY) benchmarks/kernels.py $(BENCH_ARGS)
	$(PY) benchmarks/modules.py $(BENCH_ARGS)

clean-venv:
	rm -rf $(VENV)
