# Two entry points for a newcomer (see README):  make study   and   make test
# Both create .venv with pip from nothing. Override PYTHON=python3.11 or PRESET=params/ci.yaml.
PYTHON ?= python3
VENV   ?= .venv
PRESET ?= params/cpu.yaml
# torch 2.13.0 first and pinned: on the project's machines it is a local CPU wheel; an unpinned
# torch would pull a multi-GB CUDA build. Set TORCH_SPEC="" to keep a torch you already have.
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.studylib-installed

.PHONY: setup study test test-fast report clean-outputs

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	if [ -n "$(TORCH_SPEC)" ]; then $(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"; fi
	$(BIN)/python -m pip install --quiet -e ".[notebooks,test,hf,tensorboard]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

setup: $(STAMP)

## the main job: the whole study (default: the `cpu` preset) -> outputs/<preset>/
study: $(STAMP)
	$(BIN)/python -m studylib study --params $(PRESET)

## unit tests + every notebook executed with params/ci.yaml and checked by nbval
test: $(STAMP)
	.ci/browser-deps || echo "(browser deps unavailable: the real-browser test will be skipped)"
	$(BIN)/python -m pytest -q tests
	$(BIN)/python -m studylib study --params params/ci.yaml --no-report
	$(BIN)/python -m studylib study --params params/ci.yaml --no-report --notebooks 04 -p model moe_sigmoid_bias
	$(BIN)/python -m pytest -q --nbval-lax outputs/ci/notebooks

## quick loop for developers: skip the slow tests (subprocess kills, DDP, the Dask cluster, browser)
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" tests

clean-outputs:
	rm -rf outputs/ci outputs/cpu
