# Two commands: `make demo` and `make test`. Both create .venv and install on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
CONFIG ?= configs/tiny.yaml

.PHONY: demo test install lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[all]"
	touch $(STAMP)

# Stage 1 then Stage 2 on the tiny offline profile: pairs, persona reward model, GRPO Speaker;
# episodes, group reward model, GRPO Director; each with its before/after comparison. Each stage
# ends by printing where its artifacts and report.md are.
demo: $(STAMP)
	$(BIN)/mascot config validate $(CONFIG)
	$(BIN)/mascot models build --config $(CONFIG)
	$(BIN)/mascot run stage1 --config $(CONFIG)
	$(BIN)/mascot run stage2 --config $(CONFIG)

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check mascot cli tasks flows tests benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache
