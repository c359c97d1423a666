# topkbench developer targets. `make install && make test` is exactly what .ci/run does.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
N_JOBS ?= 2

.PHONY: install test test-full lint reproduce-table3 bench clean-cache

install:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e ".[test]"

test:
	$(BIN)/python -m pytest -m "not slow" -q

test-full:
	$(BIN)/python -m pytest -m "slow or not slow" -q

lint:
	$(BIN)/ruff check topkbench tests scripts

reproduce-table3:
	$(BIN)/topkbench sweep experiment=table3 n_jobs=$(N_JOBS)
	$(BIN)/topkbench report experiment=table3

bench:
	$(BIN)/topkbench bench sdca

# numba's disk cache keys a kernel on its own file only: clear it after editing a helper
# that lives in another kernel module
clean-cache:
	find topkbench -name '*.nbi' -delete -o -name '*.nbc' -delete
