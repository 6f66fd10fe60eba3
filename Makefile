# Two commands on a fresh machine:  `make demo`  and  `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch is pinned to the CPU wheel that lies on this machine's disk; an unpinned torch pulls a CUDA build.
TORCH  ?= torch==2.13.0

.PHONY: setup demo test lint bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check $(TORCH)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev,ray]'
	touch $@

demo: setup
	$(BIN)/dpdl run

lint: setup
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/lint-imports

test: lint
	$(BIN)/pytest -q -n 2 --dist loadgroup

bench: setup
	$(BIN)/python benchmarks/bench_accounting.py
	$(BIN)/python benchmarks/bench_floor.py --threads 1

clean:
	rm -rf $(VENV) build *.egg-info
