# Two commands: `make demo` and `make test`. Both create .venv and install on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
CONFIG ?= configs/tiny.yaml

.PHONY: demo test install lint bench dist check-wheel clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[all]"
	touch $(STAMP)

# The whole pipeline on the tiny offline profile, as one flow run: Stage 1 (pairs, persona reward
# model, GRPO Speaker), Stage 2 (episodes, group reward model, GRPO Director), each with its
# before/after comparison, then the evaluation against the baselines. It ends by printing where the
# artifacts and reports are, and the evaluation's headline table.
demo: $(STAMP)
	$(BIN)/mascot config validate $(CONFIG)
	$(BIN)/mascot models build --config $(CONFIG)
	$(BIN)/mascot run pipeline --config $(CONFIG)

test: $(STAMP)
	$(BIN)/python -m pytest -q

# Every benchmark, one after another, each printing its figures and ratios (on 2 cores about 15 minutes, and about
# 30 more for learning.py and director_credit.py, which train tiny models; see benchmarks/README.md). chat.py talks
# to the demo's trained group, so the demo runs first if it has not.
# gpu_smoke.py needs a CUDA GPU: elsewhere it says so, and the rest go on.
bench: $(STAMP) runs/tiny/eval/summary.json
	$(BIN)/python benchmarks/pairs.py
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/episodes.py
	$(BIN)/python benchmarks/generation.py
	$(BIN)/python benchmarks/chat.py runs/tiny
	$(BIN)/python benchmarks/safety.py
	$(BIN)/python benchmarks/learning.py
	$(BIN)/python benchmarks/director_credit.py
	$(BIN)/python benchmarks/limits.py
	-$(BIN)/python benchmarks/gpu_smoke.py

runs/tiny/eval/summary.json:
	$(MAKE) demo

# The sdist and the wheel in dist/; check-wheel installs the wheel in a fresh virtual environment outside
# the checkout and runs it (CI does).
dist: $(STAMP)
	rm -rf dist
	$(BIN)/python -m build --outdir dist .

check-wheel: $(STAMP)
	bash .ci/check_wheel

lint: $(STAMP)
	$(BIN)/ruff check mascot cli tasks flows tests benchmarks

clean:
	rm -rf $(VENV) runs dist .pytest_cache
