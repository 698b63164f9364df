# The two commands a newcomer needs: `make serve` and `make test`.
# Both bootstrap .venv on first use (and again whenever pyproject.toml changes).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: serve test typecheck bench bench-quick bench-recall soak screenshots clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[local,dev]'
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/recalld serve $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(ARGS)

typecheck: $(STAMP)
	$(BIN)/python -m mypy

bench: $(STAMP)
	$(BIN)/python -m bench $(ARGS)

bench-quick: $(STAMP)
	$(BIN)/python -m bench --quick $(ARGS)

bench-recall: $(STAMP)
	$(BIN)/python -m bench.recall_all $(ARGS)

soak: $(STAMP)
	$(BIN)/python -m tests.soak $(ARGS)

# PNGs of the web client's main views, light and dark, into docs/img/ (needs chromium on PATH).
screenshots: $(STAMP)
	$(BIN)/python -m tests.web.screenshots $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
