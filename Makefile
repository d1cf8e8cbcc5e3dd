# Rate-limit lab: developer and CI entry points.
#
#   make setup   make test   make run   make lab   make bench   make lint   make lock   make clean
#   make test-pythons   make test-eager   (the library's tests on other Pythons, on eager tasks)
#
# Everything runs inside .venv, created on demand. Extra arguments:
#   make test PYTEST_ARGS="-k sliding -x"     make bench BENCH_ARGS="..."     make lab LAB_ARGS="--port 8899"

PYTHON     ?= python3
# Resolved now, before .venv/bin is put first on PATH below.
BASE_PYTHON := $(shell command -v $(PYTHON))
UV_VERSION ?= 0.13.9
VENV       := .venv
VPY        := $(VENV)/bin/python
UV         := $(VENV)/bin/uv
STAMP      := $(VENV)/.installed
LOCK       := requirements.lock
REPORT_DIR := build/report
EXECUTED_DIR := build/chapters
BOOK_SRC   := build/book-src

# Chapters are notebooks/<digits>...ipynb; make sorts them by name, so zero-pad the numbers.
NOTEBOOKS  := $(sort $(wildcard notebooks/[0-9]*.ipynb))
CHAPTERS   ?= $(NOTEBOOKS)
# nbval re-runs every committed notebook, numbered or not.
TEST_NOTEBOOKS := $(sort $(wildcard notebooks/*.ipynb))
# Spread notebooks over two kernels (one file per worker) only when there are enough of them.
XDIST_ARGS := $(if $(word 4,$(TEST_NOTEBOOKS)),-n 2 --dist loadfile)
# jupyter refuses to run as root without --allow-root.
ROOT_ARGS  := $(if $(filter 0,$(shell id -u)),--allow-root)

PYTEST_ARGS ?=
# make test-pythons: the library's tests on each of these too, each Python in a venv of its own
# (.venv-3.12, ...) made as `make setup` makes .venv, from the same lock. tools/find-python finds
# the interpreters (PATH, then `pyenv root`; PYTHON_3_12=... to name one).
PY_VERSIONS  ?= 3.12 3.13
# make test-eager: the library's tests once more, on this Python, every event loop starting its
# tasks with asyncio.eager_task_factory (RATELIMIT_TASK_FACTORY=eager, see tests/conftest.py).
EAGER_PYTHON ?= 3.12
LIBRARY_TESTS := tests/core tests/http
LIBRARY_TEST_ARGS ?= -n 2
SERVE_PORT  ?= 8000
SERVE_ARGS  ?=
BENCH_ARGS  ?=
LAB_ARGS    ?=
# make plan: chapter 8 on your own access log (LOG empty: the lab's example log).
LOG         ?=
LIMIT       ?= 100/min
IDENTITY    ?=
FORMAT      ?=
PLAN_DIR    ?= build/plan
CLUSTER_DIR ?= build/cluster
CLUSTER_REPLICAS ?= 0
SENTINEL_DIR ?= build/sentinel

# Recipes see the venv's tools (jupyter, ruff, the kernel's python) before the system's.
export VIRTUAL_ENV := $(CURDIR)/$(VENV)
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# Replays stay quiet in committed notebook outputs and in tests (no tqdm bars).
run refresh test test-python-% test-eager: export RATELIMIT_PROGRESS = 0
# Only `make refresh` rewrites what is committed: the measured table, the records and the gallery;
# `make run` and `make test` check the records instead (ratelimit/lab/records.py).
refresh: export RATELIMIT_SAVE_MEASUREMENTS = 1
refresh: export RATELIMIT_WRITE_FIGURES = 1
run test test-python-% test-eager: export RATELIMIT_SAVE_MEASUREMENTS = 0
run test test-python-% test-eager: export RATELIMIT_WRITE_FIGURES = 0
# uv would otherwise warn that it cannot hard-link from its cache on another filesystem.
export UV_LINK_MODE ?= copy

.DEFAULT_GOAL := help
.PHONY: help setup lock test test-record test-pythons test-eager run refresh plan lab serve bench bench-record lint clean
.PHONY: cluster-up cluster-down
.PHONY: sentinel-up sentinel-down

# help: list the targets.
help:
	@echo "make setup   create .venv and install the locked dependencies (no-op when up to date)"
	@echo "make test    mypy --strict, then tests/ and the notebooks (nbval strict); PYTEST_ARGS=... is passed on"
	@echo "make test-pythons  run the library's tests (tests/core, tests/http) on Python $(PY_VERSIONS), each in .venv-X.Y"
	@echo "make test-eager    the same tests on Python $(EAGER_PYTHON) with asyncio.eager_task_factory on every event loop"
	@echo "make run     execute notebooks/[0-9]*.ipynb into $(EXECUTED_DIR)/ and build the book $(REPORT_DIR)/ (tracked files untouched)"
	@echo "make refresh execute chapters in place, refreshing their outputs, records, table and gallery, then the README parts made from the records (CHAPTERS=... for some)"
	@echo "make plan    chapter 8 on your access log: LOG=access.log LIMIT=100/min [IDENTITY=user FORMAT=clf], into $(PLAN_DIR)/ (notebook and HTML;"
	@echo "            clients are counted by address unless IDENTITY names a field)"
	@echo "make lab     start JupyterLab on notebooks/"
	@echo "make serve   run the demo API (ratelimit.demo) on 127.0.0.1:$(SERVE_PORT), docs at /docs; REDIS_URL picks a real Redis"
	@echo "make bench   run python -m bench; BENCH_ARGS=... is passed on"
	@echo "make test-record   copy the last make test's time and counts into tests/record.json and the README"
	@echo "make bench-record  copy the latest build/bench/results.json into bench/record.json and re-render book/benchmarks.md's tables"
	@echo "make lint    ruff check ratelimit bench tests tools, and lint-imports (the import layering)"
	@echo "make cluster-up    start a local 3-master Redis Cluster; prints its URL, PIDs in $(CLUSTER_DIR)/state.json"
	@echo "                   (CLUSTER_REPLICAS=1: one replica per master, attached and in sync)"
	@echo "make cluster-down  stop exactly the PIDs cluster-up recorded and remove $(CLUSTER_DIR)/"
	@echo "make sentinel-up   start a local primary + replica + 3 Sentinels; prints its URL, PIDs in $(SENTINEL_DIR)/state.json"
	@echo "make sentinel-down stop exactly the PIDs sentinel-up recorded and remove $(SENTINEL_DIR)/"
	@echo "make lock    regenerate $(LOCK) from pyproject.toml (all extras, Python 3.11 and later)"
	@echo "make clean   remove .venv, the .venv-X.Y of test-pythons, build/ and caches"

# setup: the venv with every locked dependency plus this project (editable); re-runs only when the lock or pyproject.toml change.
setup: $(STAMP)

# make_venv DIR,PYTHON: the venv itself with a pinned uv in it (pip is only used to bring in uv).
define make_venv
$(2) -m venv $(1)
$(1)/bin/python -m pip install --quiet "uv==$(UV_VERSION)"
endef

# sync_venv DIR: exactly the locked dependencies (`uv pip check`: nothing that a package needs on
# DIR's Python is missing from the lock), then this project, editable.
define sync_venv
$(1)/bin/uv pip sync --python $(1)/bin/python --compile-bytecode $(LOCK)
$(1)/bin/uv pip check --python $(1)/bin/python
$(1)/bin/uv pip install --python $(1)/bin/python --compile-bytecode --no-deps -e .
endef

$(UV):
	$(if $(BASE_PYTHON),,$(error $(PYTHON) not found; set PYTHON=...))
	$(call make_venv,$(VENV),$(BASE_PYTHON))

$(STAMP): $(LOCK) pyproject.toml | $(UV)
	$(call sync_venv,$(VENV))
	@touch $@

# .venv-X.Y for another Python, made the same way; tools/find-python fails, saying where it
# looked, when there is no Python X.Y.
.venv-%/bin/uv:
	@tools/find-python $* > /dev/null
	$(call make_venv,.venv-$*,"$$(tools/find-python $*)")

.venv-%/.installed: $(LOCK) pyproject.toml | .venv-%/bin/uv
	$(call sync_venv,.venv-$*)
	@touch $@

# (Not intermediate files that make may delete once the tests have run.)
.PRECIOUS: .venv-%/bin/uv .venv-%/.installed

# The lock: every extra, resolved once for Python 3.11 and later on any platform (--universal:
# what only some Pythons or platforms need, such as papermill's aiohttp on 3.12, carries a marker).
compile_lock = $(UV) pip compile pyproject.toml --all-extras --universal --python-version 3.11 -o $(LOCK) >/dev/null

# Only when the lock is missing altogether; an existing lock is never regenerated behind your back.
$(LOCK): | $(UV)
	$(compile_lock)

# lock: regenerate requirements.lock (then `make setup` installs it).
lock: | $(UV)
	$(compile_lock)

# test: the import contracts (lint-imports), mypy --strict over the library and tests/typing's user
# code (pyproject.toml's [tool.mypy]), then pytest over tests/ plus the notebooks under nbval
# strict; "no tests collected" (exit 5) counts as success.
test: setup
	$(VPY) tools/test_record.py start
	$(VENV)/bin/lint-imports --no-cache --no-logo
	$(VENV)/bin/mypy
	@# The lab's compiled kernels (numba) are built here, once, by planning the example log: the
	@# two test workers then load them from the cache instead of compiling beside timed tests.
	$(VPY) -m ratelimit.lab plan --no-measure --no-progress > /dev/null 2> $(VENV)/.plan-warm-up.log \
	  || { cat $(VENV)/.plan-warm-up.log; exit 1; }
	$(VPY) -m pytest -p no:cacheprovider tests --junitxml=build/test-run/junit.xml \
	  $(if $(TEST_NOTEBOOKS),--nbval --nbval-current-env $(XDIST_ARGS) $(TEST_NOTEBOOKS)) \
	  $(PYTEST_ARGS); \
	rc=$$?; $(VPY) tools/test_record.py finish $$rc || true; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests"; exit 0; fi; exit $$rc

# test-record: the last make test's time and counts (build/test-run/) -> tests/record.json and
# the README's sentence about how long make test takes.
test-record: setup
	$(VPY) tools/test_record.py record

# library_tests X.Y: pytest over the library's tests in .venv-X.Y, its bin/ first on PATH.
library_tests = VIRTUAL_ENV="$(CURDIR)/.venv-$(1)" PATH="$(CURDIR)/.venv-$(1)/bin:$$PATH" \
  .venv-$(1)/bin/python -m pytest -p no:cacheprovider $(LIBRARY_TEST_ARGS) $(LIBRARY_TESTS) $(PYTEST_ARGS)

# test-pythons: the library's tests on each of PY_VERSIONS (make test runs them on .venv's).
test-pythons: $(addprefix test-python-,$(PY_VERSIONS))

# test-python-X.Y: the library's tests on Python X.Y alone.
test-python-%: .venv-%/.installed
	$(call library_tests,$*)

# test-eager: the library's tests on EAGER_PYTHON, every event loop with the eager task factory.
test-eager: export RATELIMIT_TASK_FACTORY = eager
test-eager: .venv-$(EAGER_PYTHON)/.installed
	$(call library_tests,$(EAGER_PYTHON))

# refresh: execute chapters in place from a clean kernel (CHAPTERS=notebooks/04_x.ipynb for some), recording
# their quoted numbers in notebooks/data/records/, then render the README's generated parts from
# those records (RENDER_README=0 skips that step).
refresh: setup
ifneq ($(CHAPTERS),)
	jupyter nbconvert --to notebook --execute --inplace --ExecutePreprocessor.record_timing=False \
	  --ExecutePreprocessor.timeout=600 $(CHAPTERS)
	$(VPY) tools/strip_widget_state.py $(CHAPTERS)
endif
	$(if $(filter 0,$(RENDER_README)),,$(VPY) -m ratelimit.lab.readme README.md)

# run: execute every chapter from a clean kernel into $(EXECUTED_DIR)/ (two at a time), then build
# the book from those copies into $(REPORT_DIR)/ (sources assembled in $(BOOK_SRC)/; tools/book.py);
# the committed notebooks, table and figures stay as they are.
run: setup
	@mkdir -p notebooks
	$(VPY) tools/book.py --execute-into $(EXECUTED_DIR) --src $(BOOK_SRC) --out $(REPORT_DIR) $(NOTEBOOKS)

# plan: chapter 8 ("Your traffic") on another log (tools/plan_page.py): LOG, LIMIT, IDENTITY and FORMAT
# checked, then filled into its parameters cell (papermill); the executed notebook and its HTML
# land in $(PLAN_DIR)/. Any failure is one line on stderr naming the cause.
plan: export RATELIMIT_PROGRESS = 0
plan: setup
	@$(VPY) tools/plan_page.py --out "$(PLAN_DIR)" --limit "$(LIMIT)" $(if $(LOG),--log "$(LOG)") \
	  $(if $(IDENTITY),--identity "$(IDENTITY)") $(if $(FORMAT),--format "$(FORMAT)")

# lab: JupyterLab on notebooks/, bound to loopback; jupyter prints the URL with its token.
lab: setup
	@mkdir -p notebooks
	jupyter lab --ServerApp.root_dir=notebooks --ip 127.0.0.1 --no-browser $(ROOT_ARGS) $(LAB_ARGS)

# serve: the demo API on loopback; REDIS_URL picks a real Redis, else the embedded one.
serve: setup
	$(VPY) -m ratelimit.demo --host 127.0.0.1 --port $(SERVE_PORT) $(SERVE_ARGS)

# bench: the benchmark suite (bench/, beside the library).
bench: setup
	$(VPY) -m bench $(BENCH_ARGS)

# bench-record: the book's benchmark tables from the latest full `make bench` (bench/readme.py).
bench-record: setup
	$(VPY) -m bench --record

# cluster-up: a local Redis Cluster (3 masters, CLUSTER_REPLICAS replicas each, free loopback ports) that stays up; a no-op if it runs.
cluster-up: setup
	$(VPY) -m ratelimit.devtools.cluster up --dir $(CLUSTER_DIR) --replicas $(CLUSTER_REPLICAS)

# cluster-down: stop the PIDs recorded by cluster-up (and nothing else); a no-op if none.
cluster-down: setup
	$(VPY) -m ratelimit.devtools.cluster down --dir $(CLUSTER_DIR)

# sentinel-up: a local primary, replica and three Sentinels (free loopback ports) that stay up; a no-op if it runs.
sentinel-up: setup
	$(VPY) -m ratelimit.devtools.sentinel up --dir $(SENTINEL_DIR)

# sentinel-down: stop the PIDs recorded by sentinel-up (and nothing else); a no-op if none.
sentinel-down: setup
	$(VPY) -m ratelimit.devtools.sentinel down --dir $(SENTINEL_DIR)

# lint: ruff over the library, the tests and the tools; the import contracts (pyproject.toml).
lint: setup
	ruff check ratelimit bench tests tools
	lint-imports --no-cache --no-logo

# clean: remove the venv, the report and every cache.
clean:
	rm -rf $(VENV) $(wildcard .venv-*) build .pytest_cache .hypothesis .ruff_cache *.egg-info
	find . -path ./.git -prune -o \( -name __pycache__ -o -name .ipynb_checkpoints \) -type d -prune -exec rm -rf {} +
