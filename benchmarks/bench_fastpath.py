"""The fast path against eager decoding and transformers' generate, one process.

    python benchmarks/bench_fastpath.py [--target smollm2-135m-instruct | --random-smollm2]
        [--device cuda] [--dtype bfloat16] [--max-new-tokens 128] [--repeats 5] [--json OUT]

Methods, interleaved after a warm-up, median over repeats and prompts:
  generate      transformers' eager greedy ``generate`` (the anchor of issue #7)
  greedy        our eager greedy loop (dynamic cache)
  greedy_fast   our greedy on the fast path (static cache; CUDA graphs on a GPU)
Prints tok/s, the ratios greedy_fast/generate and greedy_fast/greedy, whether the
tokens agree, the weights-read bandwidth bound (device bandwidth / weight bytes)
and how close each method gets to it. ``--random-smollm2`` builds a model with
SmolLM2-135M's shapes and random weights (speed only; needs no download).
"""

from __future__ import annotations

import argparse

import torch

from common import generate_new_tokens, median, timed, write_json  # first: it puts the repository root on sys.path

from decoding.harness.bench import measure_bandwidth, weight_bytes
from decoding.harness.runner import encode_prompt
from decoding.params import GreedyParams
from decoding.runtime import fastpath
from decoding.runtime.models import load_model, wrap_model
from decoding.runtime.pair import ModelPair
from decoding.strategies.baselines import greedy

PROMPTS = [
    "Explain in a short paragraph why the sky looks blue.",
    "Write a Python function that checks whether a number is prime.",
    "Give me three tips for writing clear emails.",
]


def random_smollm2(device: str, dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64, tie_word_embeddings=True,
                         max_position_embeddings=8192, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
                         pad_token_id=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(dtype).to(device)
    model.generation_config.pad_token_id = 2
    return wrap_model(model, None, name="random-smollm2")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--random-smollm2", action="store_true")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    if args.random_smollm2:
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = getattr(torch, args.dtype or ("bfloat16" if device == "cuda" else "float32"))
        lm = random_smollm2(device, dtype)
        prompts = [[1] + [(97 * i + 13 * j) % 49000 + 100 for j in range(20 + 7 * i)] for i in range(3)]
    else:
        lm = load_model(args.target, device=args.device, dtype=args.dtype)
        prompts = [encode_prompt(lm.tokenizer, p, chat=lm.chat) for p in PROMPTS]
    pair, n = ModelPair(lm), args.max_new_tokens
    runners = {
        "generate": lambda ids: generate_new_tokens(lm, ids, max_new_tokens=n),
        "greedy": lambda ids: greedy(ids, pair, GreedyParams(), max_new_tokens=n).token_ids,
        "greedy_fast": lambda ids: greedy(ids, pair, GreedyParams(fast=True), max_new_tokens=n).token_ids,
    }
    for ids in prompts:                      # warm-up (captures the graphs)
        for run in runners.values():
            run(ids)
    tok_s: dict[str, list[float]] = {k: [] for k in runners}
    agree: dict[str, int] = {k: 0 for k in runners}
    for ids in prompts:
        outs: dict[str, list[int]] = {}
        for _ in range(args.repeats):
            for name, run in runners.items():   # interleaved
                outs[name], seconds = timed(lambda: run(ids), lm.device)
                tok_s[name].append(len(outs[name]) / seconds)
        for name in runners:
            agree[name] += outs[name] == outs["greedy"]
    med = {k: median(v) for k, v in tok_s.items()}
    bw = measure_bandwidth(lm.device)
    wb = weight_bytes(lm)
    ceiling = bw / wb if bw else None
    doc = {"model": lm.name, "device": str(lm.device), "dtype": str(lm.dtype).replace("torch.", ""),
           "gpu": torch.cuda.get_device_name(lm.device) if lm.device.type == "cuda" else None,
           "torch": torch.__version__, "max_new_tokens": n, "repeats": args.repeats, "prompts": len(prompts),
           "tok_s": med, "same_tokens_as_greedy": {k: f"{v}/{len(prompts)}" for k, v in agree.items()},
           "greedy_fast_over_generate": med["greedy_fast"] / med["generate"],
           "greedy_fast_over_greedy": med["greedy_fast"] / med["greedy"],
           "greedy_over_generate": med["greedy"] / med["generate"],
           "weight_bytes": wb, "bandwidth_bytes_per_s": bw, "tok_s_ceiling": ceiling,
           "fraction_of_ceiling": {k: v / ceiling for k, v in med.items()} if ceiling else None,
           "fastpath": fastpath.pool_stats(lm)}
    for k, v in med.items():
        frac = f"  {v / ceiling:6.1%} of the {ceiling:,.0f} tok/s bound" if ceiling else ""
        print(f"{k:<12} {v:9.1f} tok/s  same tokens as greedy: {doc['same_tokens_as_greedy'][k]}{frac}")
    print(f"greedy_fast / generate = {doc['greedy_fast_over_generate']:.2f}   "
          f"greedy_fast / greedy = {doc['greedy_fast_over_greedy']:.2f}   "
          f"greedy / generate = {doc['greedy_over_generate']:.3f}")
    write_json(args.json, doc)


if __name__ == "__main__":
    main()
