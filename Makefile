# Quick start: `make demo` runs the crash demo on SQLite; `make test` runs every test.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench soak clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m graph_durable.demo

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider

# Benchmark-only packages (dbos, matplotlib, psutil); if they cannot be installed, the
# benchmarks that need them are skipped with a message.
bench: $(STAMP)
	-$(PY) -m pip install --quiet -r benchmarks/requirements.txt
	$(PY) -m benchmarks

# Randomized explorer: generated episodes crashed in real processes, for SOAK_MINUTES.
# SOAK_PATHS=all adds the path classes of known bugs; SOAK_ARGS passes more options.
SOAK_MINUTES ?= 30
SOAK_PATHS ?= stable
soak: $(STAMP)
	$(PY) -m graph_durable.testing.explorer --minutes $(SOAK_MINUTES) --paths $(SOAK_PATHS) $(SOAK_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info demo-run
