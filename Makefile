# fedrepro — two commands: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed

.PHONY: demo report scorecard progress test test-e2e test-slow lint dry-run-paper rehearse mutation clean

# The venv is rebuilt only when the pinned requirements or the package metadata change.
$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first: pinned to the CPU build; an unpinned torch would pull a multi-GB CUDA build
	$(BIN)/pip install --quiet --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.txt
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/snakemake --cores all

# the reproduction scorecard alone (results/scorecard/, results/figures/scorecard_<paper>.png)
scorecard: $(STAMP)
	$(BIN)/snakemake --cores all scorecard

# which cells of a (possibly running) run are done, per paper and target; CONFIG=config/paper.yaml
progress: $(STAMP)
	$(BIN)/python -m fedrepro.progress $(if $(CONFIG),--configfile $(CONFIG))

# The page to open first: every table and figure the last run wrote (only those on disk), with
# captions, the scorecard and provenance, as one self-contained results/report.html. It never
# trains: only the report's own rules may run (fedrepro.reporting.make_report).
# Another config: make report CONFIG=config/paper.yaml
CONFIG ?=
report: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m fedrepro.reporting.make_report $(if $(CONFIG),--configfile $(CONFIG))

# The test files spread over TEST_WORKERS processes (pytest-xdist; --dist loadfile: a file's tests
# stay in one process, so its module fixtures run once). 2 = this project's CI machine's cores;
# TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 2
test: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

# The `e2e` tests make test skips (19 tests, 19-23 minutes here): every paper's targets built by Snakemake on
# a smoke config, the Flower deployment (TLS, node auth), the report in Chromium (tests/install_chromium.sh
# installs it, as root), the Ray-simulation and deployment stall/crash checks, the dataset-stats
# rule, AdaFedSelecKD's row and train/evaluate jobs against its cell jobs, the canonical-params rerun.
test-e2e: $(STAMP)
	FEDREPRO_E2E=1 HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m e2e tests

# The `exhaustive` tests make test skips: kills at more seeded moments and fault kinds per paper
# (cells and row jobs), and Snakemake killed mid-run (tests/faults.py; about 20-40 minutes here).
test-slow: $(STAMP)
	FEDREPRO_EXHAUSTIVE=1 HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -m exhaustive tests

# Mutation testing of the method code (issue 24; tests/mutation.py, docs/mutation.md): mutmut,
# pinned in requirements-mutation.txt, mutates one module at a time against its fast tests in
# .mutation/<module>/; scores in .mutation/scores.json.  Not part of `make test` (hours for all).
# One module: make mutation MODULES=adafedseleckd.kd   (list: .venv/bin/python tests/mutation.py --list)
MODULES ?=
$(VENV)/.mutation-installed: $(STAMP) requirements-mutation.txt
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-mutation.txt
	touch $@

mutation: $(VENV)/.mutation-installed
	$(BIN)/python tests/mutation.py $(MODULES)

lint: $(STAMP)
	$(BIN)/snakemake --lint
	$(BIN)/lint-imports

# The paper grid's code paths, a few steps each at true model size (random weights where no
# checkpoint can be fetched), under results/rehearsal/; the report says what failed and which
# numbers are outside their stated bounds (warn), if any.
# REHEARSE_MEM_MB: the host memory (MB) Snakemake may hand out (--resources mem_mb); jobs whose
# declared peaks (config/rehearsal.yaml) fit run side by side.  Default 85 % of this machine's RAM;
# empty: no limit.
REHEARSE_MEM_MB ?= $(shell awk '/^MemTotal:/ {printf "%d", $$2 / 1024 * 0.85}' /proc/meminfo 2>/dev/null)
# --forcerun rehearse: after a failed run the report written below (for the failed cells) must not
# count as the rule's output -- the next make rehearse retries the failed cells, not "nothing to be done"
rehearse: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/snakemake --cores all $(if $(REHEARSE_MEM_MB),--resources mem_mb=$(REHEARSE_MEM_MB)) \
	  --keep-going --forcerun rehearse --configfile config/paper.yaml config/rehearsal.yaml \
	  || ($(BIN)/python -m fedrepro.rehearsal.report results/rehearsal; exit 1)
	@cat results/rehearsal/report.md
	FEDREPRO_REHEARSAL=1 FEDREPRO_REHEARSAL_DIR=$(CURDIR) HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q tests/test_rehearsal_cells.py
	@# the verdict last: "rehearsal: N ok, W warn, F failed" and every warn's reason (warn exits 0)
	@$(BIN)/python -m fedrepro.rehearsal.report --summary results/rehearsal

dry-run-paper: $(STAMP)
	$(BIN)/snakemake -n --configfile config/paper.yaml

clean:
	rm -rf results logs benchmarks .snakemake
