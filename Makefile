# topkbench developer targets. .ci/run runs `make install && make test && make check-install`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
N_JOBS ?= 2

.PHONY: install install-browser install-torch test test-full test-boundscheck lint reproduce-table3 reproduce-table5 reproduce-table6 smoke-table5 reproduce-table7 smoke-table7 reproduce-table10 reproduce-table11 reproduce-table12 smoke-table11 bench bench-table5 bench-bipartite bench-projections bench-kato bench-peers bench-scale clean-cache check-install

install:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e ".[test]"

# the optional extra topkbench[torch] (topkbench.torch, Table 6): TORCH_SPEC first, so that the
# extra's range finds it installed (torch 2.13.0 has a CPU build on this machine's disk; a bare
# `pip install torch` takes a CUDA build of several GB)
TORCH_SPEC ?= torch==2.13.0
install-torch:
	$(BIN)/python -m pip install "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -e ".[test,torch]"

# Debian's Chromium for the HTML report's browser test (tests/test_html_report.py)
install-browser:
	command -v chromium >/dev/null || (apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

test:
	$(BIN)/python -m pytest -m "not slow" -q

test-full:
	$(BIN)/python -m pytest -m "slow or not slow" -q

# the default tests with numba's bounds checks compiled in (kernels index without them; an
# index past an array raises IndexError here instead of reading garbage); own numba cache
test-boundscheck:
	NUMBA_BOUNDSCHECK=1 NUMBA_CACHE_DIR=$(CURDIR)/.numba-boundscheck \
		$(BIN)/python -m pytest -m "not slow" -q -p no:cacheprovider

# a non-editable install (`pip install .` into a fresh venv, configs shipped as package data)
# trains one model and reproduces Table 3, from a directory outside the checkout
DIST_VENV ?= $(CURDIR)/.venv-dist
check-install:
	rm -rf $(DIST_VENV) && $(PY) -m venv $(DIST_VENV)
	$(DIST_VENV)/bin/python -m pip install -q "$(CURDIR)"
	tmp=$$(mktemp -d) && cd $$tmp && \
		$(DIST_VENV)/bin/topkbench train method=lr_multi C=0.5 dataset.n_test=2000 --json && \
		$(MAKE) -f $(CURDIR)/Makefile reproduce-table3 BIN=$(DIST_VENV)/bin && \
		test -s results/table3/report.md && rm -rf $$tmp

lint:
	$(BIN)/ruff check topkbench tests scripts

reproduce-table3:
	$(BIN)/topkbench sweep experiment=table3 n_jobs=$(N_JOBS)
	$(BIN)/topkbench report experiment=table3 --html

# Table 5: fetch the public datasets (ALOI, Letter, News20, Caltech101 Silhouettes; the CNN
# feature sets must be supplied by hand, see `topkbench data info cub`), sweep the datasets whose
# files are present, report.  Without any data the sweep stops and lists the missing files.
FETCHABLE = aloi letter news20 caltech101_silhouettes
reproduce-table5:
	-for d in $(FETCHABLE); do $(BIN)/topkbench data fetch $$d; done
	$(BIN)/topkbench sweep experiment=table5 n_jobs=$(N_JOBS) --skip-missing
	$(BIN)/topkbench report experiment=table5 --html

# the Table 5 protocol on two small synthetic sets (about 15 s)
smoke-table5:
	$(BIN)/topkbench sweep experiment=table5_smoke n_jobs=$(N_JOBS)
	$(BIN)/topkbench report experiment=table5_smoke --html

# Tables 7 and 9: the ten Mulan sets have no registered download (RAR archives without
# checksums): extract them as `topkbench data info emotions` shows.  The sweep runs the sets that
# are present (linear and RBF rows, 10-fold CV) and the report prints the paper's values beside.
reproduce-table7:
	$(BIN)/topkbench sweep experiment=table7 n_jobs=$(N_JOBS) --skip-missing
	$(BIN)/topkbench report experiment=table7 --html

# the Table 7 protocol on a small synthetic multilabel set (seconds)
smoke-table7:
	$(BIN)/topkbench sweep experiment=table7_smoke n_jobs=$(N_JOBS)
	$(BIN)/topkbench report experiment=table7_smoke --html

# Tables 10-12 (VOC 2007 / COCO region features, user-supplied: `topkbench data info voc2007`)
reproduce-table10:
	$(BIN)/topkbench sweep experiment=table10 n_jobs=$(N_JOBS) --skip-missing
	$(BIN)/topkbench report experiment=table10 --html
reproduce-table11:
	$(BIN)/topkbench sweep experiment=table11 n_jobs=$(N_JOBS) --skip-missing
	$(BIN)/topkbench report experiment=table11 --html
reproduce-table12:
	$(BIN)/topkbench sweep experiment=table12 n_jobs=$(N_JOBS) --skip-missing
	$(BIN)/topkbench report experiment=table12 --html

# the region/image protocol of Tables 10-12 on synthetic data (seconds)
smoke-table11:
	$(BIN)/topkbench sweep experiment=table11_smoke n_jobs=$(N_JOBS)
	$(BIN)/topkbench report experiment=table11_smoke --html

bench-bipartite:
	$(BIN)/topkbench bench bipartite

# TPAMI Fig. 3a (projection scaling, d = 10 ... 10^6, 1,000 problems each; about 15 min)
bench-projections:
	$(BIN)/topkbench bench projections

# Kato & Hirohashi Figs. 2-4 on the seeded synthetic problem (about a minute)
bench-kato:
	$(BIN)/topkbench bench kato-fig2
	$(BIN)/topkbench bench kato-fig3
	$(BIN)/topkbench bench kato-fig4

# ours vs scikit-learn (lbfgs, saga, liblinear -s 3/4/7): wall time to a primal within 1e-3 of
# the certified optimum, one core (n = 20,000, d = 128, m = 100; long: minutes per solver)
bench-peers:
	$(BIN)/topkbench bench peers

# issue 7's memory run: n = 10^6, d = 128, m = 100 float32 features memory-mapped from .npy
# (writes a 0.5 GB temporary file; reports epoch time and peak RSS)
bench-scale:
	$(BIN)/topkbench bench scale

bench-table5:
	$(BIN)/topkbench bench table5 --n-jobs $(N_JOBS)

bench:
	$(BIN)/topkbench bench sdca

# numba's disk cache keys a kernel on its own file only: clear it after editing a helper
# that lives in another kernel module
clean-cache:
	find topkbench -name '*.nbi' -delete -o -name '*.nbc' -delete

# Table 6: a small CNN on Caltech101 Silhouettes' real images (trained with softmax, fine-tuned
# with the top-k losses, and the classifier alone on its features); needs make install-torch
reproduce-table6:
	$(BIN)/topkbench data fetch caltech101_silhouettes
	$(BIN)/topkbench sweep experiment=table6 n_jobs=$(N_JOBS)
	$(BIN)/topkbench report experiment=table6 --html
