# Quick start: `make demo` runs the crash demo on SQLite; `make test` runs every test.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

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

clean:
	rm -rf $(VENV) build *.egg-info demo-run
