# Quick start: `make demo` runs the crash demo on SQLite; `make test` runs every test.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The oldest supported releases (requirements/floor.txt), in a second virtualenv.
FLOOR_VENV := .venv-floor
FLOOR_STAMP := $(FLOOR_VENV)/.installed
# LangGraph's own test suites, run on the stock savers and on ours (requirements/upstream.txt
# adds what they need; the sdists are cached in .upstream/).
UPSTREAM_STAMP := $(VENV)/.upstream-installed
FLOOR_UPSTREAM_STAMP := $(FLOOR_VENV)/.upstream-installed
UPSTREAM := -m graph_durable.testing.upstream
FLOOR_TESTS := tests/nodes tests/test_review_subgraphs.py tests/test_explorer_regressions.py \
	tests/test_crash_forks.py tests/test_exports.py tests/test_versions.py

.PHONY: demo test test-sweeps test-upstream test-upstream-ci notebooks bench soak docs clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(FLOOR_STAMP): pyproject.toml requirements/floor.txt
	test -x $(FLOOR_VENV)/bin/python || $(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(FLOOR_VENV)/bin/python -m pip install --quiet -c requirements/floor.txt -e '.[dev]'
	touch $(FLOOR_STAMP)

$(UPSTREAM_STAMP): $(STAMP) requirements/upstream.txt
	$(PY) -m pip install --quiet -r requirements/upstream.txt
	touch $(UPSTREAM_STAMP)

$(FLOOR_UPSTREAM_STAMP): $(FLOOR_STAMP) requirements/upstream.txt
	$(FLOOR_VENV)/bin/python -m pip install --quiet -c requirements/floor.txt \
		-r requirements/upstream.txt
	touch $(FLOOR_UPSTREAM_STAMP)

demo: $(STAMP)
	$(PY) -m graph_durable.demo

# Tests run on TEST_WORKERS processes (pytest-xdist), handed out one at a time.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist load --maxschedchunk 1

# Every test on the newest releases (but the long sweeps, the explorer's episodes among
# them) and the 4-worker PostgreSQL recovery; then the guard's
# own tests on the oldest supported releases.
test: $(STAMP) $(FLOOR_STAMP)
	$(PY) -m pytest -q -p no:cacheprovider $(XDIST) \
		-m "not sweep and not backends and not prebuilt and not browser"
	GRAPH_DURABLE_EXPECT_FLOOR=1 $(FLOOR_VENV)/bin/python -m pytest -q -p no:cacheprovider \
		$(XDIST) -m "not backends" $(FLOOR_TESTS)

# The long sweeps (marker `sweep`): races of two workers on fifty orphans, generated
# crash schedules and the explorer's 300 episodes; the saver-parametrised tests on
# PostgreSQL (marker `backends`); the crash tests of prebuilt agent frameworks
# (marker `prebuilt`, with the `prebuilt` extra installed first)...
# CI runs them after make test.
PREBUILT_STAMP := $(VENV)/.prebuilt-installed
$(PREBUILT_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,prebuilt,browser]'
	touch $(PREBUILT_STAMP)
FLOOR_BROWSER_STAMP := $(FLOOR_VENV)/.browser-installed
$(FLOOR_BROWSER_STAMP): $(FLOOR_STAMP)
	$(FLOOR_VENV)/bin/python -m pip install --quiet -c requirements/floor.txt -e '.[dev,browser]'
	touch $(FLOOR_BROWSER_STAMP)

# ... and the inbox widget in a real browser (marker `browser`), on the newest widget
# packages and on the floor's (ipywidgets 8.1.0).
test-sweeps: $(STAMP) $(PREBUILT_STAMP) $(FLOOR_BROWSER_STAMP)
	$(PY) -m pytest -q -p no:cacheprovider $(XDIST) -m "sweep or backends or prebuilt or browser"
	GRAPH_DURABLE_EXPECT_FLOOR=1 $(FLOOR_VENV)/bin/python -m pytest -q -p no:cacheprovider \
		-m browser tests/browser
	$(MAKE) test-upstream

# LangGraph's own tests (langgraph's checkpointer-parametrised tests on SQLite, encrypted
# SQLite, async SQLite and PostgreSQL sync, pool, pipeline and async; the saver tests of
# langgraph-checkpoint-sqlite and -postgres) from the sdists of the installed releases,
# on the stock savers and on ours side by side, on the newest and the oldest supported
# releases (9 to 12 minutes each on two cores). Fails on a divergence not listed in
# graph_durable/testing/upstream/known.py.
test-upstream: $(UPSTREAM_STAMP) $(FLOOR_UPSTREAM_STAMP)
	$(PY) $(UPSTREAM) --subset full
	$(FLOOR_VENV)/bin/python $(UPSTREAM) --subset full

# The subset CI runs on every run (.ci/run, between make test and make test-sweeps),
# time-boxed at 5 minutes a suite (it takes about 2 on two cores): langgraph's time
# travel and interruption tests on every saver, and both packages' saver tests, on the
# newest releases.
test-upstream-ci: $(UPSTREAM_STAMP)
	$(PY) $(UPSTREAM) --subset ci --timeout 300

# Run every notebook in a real kernel and store it with its outputs (they are committed
# with them; make test checks each one still runs).
notebooks: $(STAMP)
	$(PY) -m tests.test_notebooks

# Benchmark-only packages (dbos, matplotlib, psutil); if they cannot be installed, the
# benchmarks that need them are skipped with a message.
bench: $(STAMP)
	-$(PY) -m pip install --quiet -r benchmarks/requirements.txt
	$(PY) -m benchmarks

# The documentation site (mkdocs.yml, docs/) into site/, the API reference drawn from the
# docstrings; any warning (a broken link, a page left out of the nav, a docstring
# mkdocstrings cannot read) fails the build. Installs the `docs` extra first.
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

# Randomized explorer: generated episodes crashed in real processes, for SOAK_MINUTES.
# Half of the episodes run on the PostgreSQL savers (a throwaway server started from the
# machine's binaries); SOAK_PATHS=stable keeps to SQLite, SOAK_PATHS=all adds the path
# classes of known bugs; SOAK_ARGS passes more options.
SOAK_MINUTES ?= 30
SOAK_PATHS ?= stable,postgres
soak: $(STAMP)
	$(PY) -m graph_durable.testing.explorer --minutes $(SOAK_MINUTES) --paths $(SOAK_PATHS) $(SOAK_ARGS)

clean:
	rm -rf $(VENV) $(FLOOR_VENV) build *.egg-info demo-run site
