"""Which reduced-precision target a CPU should offer: forward cost by width, and whether rows depend on width.

    python benchmarks/bench_precision.py [--repeats 9] [--context 120] [--json benchmarks/results/precision-cpu.json]

Four versions of one model, loaded in one process and timed interleaved after a warm-up: the float32 model on
the kernels ``load_model`` chose (the reference), its float16-weight preset (``weights: fp16``: float16 weights
read by FBGEMM, float32 activations), its bfloat16-weight preset (``weights: bf16``: bfloat16 weights on oneDNN,
AMX on an Intel Xeon, float32 between the layers; where this CPU passes its checks) and a bfloat16 model
(``--dtype bfloat16``). For each, the median ms of a
forward over T new positions after a prefill of ``--context`` tokens (the cache cropped back after each), and
a width check: the logits of one 10-position (and one 32-position) forward against as many one-position
forwards over the same tokens.

Speculative decoding can only be lossless against a model's own greedy when the verify forward's rows are the
rows a one-position forward computes (up to rounding far below the logit margins); the width check measures
that. The CPU is named in the output.
"""

from __future__ import annotations

import argparse

import torch

from common import median, timed, write_json  # first: it puts the repository root on sys.path

from decoding.harness.bench import width_logits
from decoding.harness.runner import environment
from decoding.runtime.kernel_choice import cpu_label
from decoding.runtime.kvcache import cache_kwarg, crop_cache
from decoding.runtime.models import load_model, load_presets, runs_here
from decoding.runtime.pair import ModelPair

WIDTHS = (1, 2, 5, 9, 13, 17, 25, 33)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default="smollm2-135m-instruct")
    p.add_argument("--half", default="smollm2-135m-instruct-fp16w", help="the float16-weight preset of --target")
    p.add_argument("--bf16", default="smollm2-135m-instruct-bf16w", help="the bfloat16-weight preset of --target")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--context", type=int, default=120)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def width_check(model, prefix: torch.Tensor, tokens: torch.Tensor) -> dict:
    """One forward over ``tokens`` against one forward per token, after the same ``prefix``."""
    wide, narrow = width_logits(model, prefix, tokens)
    return {"max_abs_logit_diff": float((wide - narrow).abs().max()),
            "argmax_agrees": int((wide.argmax(-1) == narrow.argmax(-1)).sum()), "rows": tokens.shape[1]}


@torch.inference_mode()
def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    models = {"float32": load_model(args.target, dtype="float32"), "fp16-weights": load_model(args.half)}
    if runs_here(load_presets()[args.bf16], "cpu"):
        models["bf16-weights"] = load_model(args.bf16)
    models["bfloat16"] = load_model(args.target, dtype="bfloat16")
    gen = torch.Generator().manual_seed(0)
    vocab = models["float32"].vocab_size
    prefix = torch.randint(100, vocab - 1, (1, args.context), generator=gen)
    probe = torch.randint(100, vocab - 1, (1, max(WIDTHS)), generator=gen)
    caches = {k: lm.model(prefix, use_cache=True).past_key_values for k, lm in models.items()}
    ms: dict[str, dict[int, list[float]]] = {k: {t: [] for t in WIDTHS} for k in models}
    for rep in range(args.repeats + 1):                       # repeat 0 is the warm-up
        for t in WIDTHS:
            for k, lm in models.items():
                x = probe[:, :t]
                _, s = timed(lambda: lm.model(x, **{cache_kwarg(lm.model): caches[k]}, use_cache=True,
                                              logits_to_keep=1 if t == 1 else 0), lm.device)
                crop_cache(caches[k], args.context)
                if rep:
                    ms[k][t].append(s * 1e3)
    table = {k: {t: round(median(v), 2) for t, v in per.items()} for k, per in ms.items()}
    checks = {k: width_check(lm.model, prefix, probe[:, :10]) for k, lm in models.items()}
    checks32 = {k: width_check(lm.model, prefix, probe[:, :32]) for k, lm in models.items()}
    print(f"CPU: {cpu_label()}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"{args.target}, context {args.context}, medians of {args.repeats}")
    print("| model | " + " | ".join(f"T={t} ms" for t in WIDTHS) + " | T=17 / T=1 | 10 rows at once vs one by one "
          "| 32 rows |")
    print("|---|" + "---:|" * (len(WIDTHS) + 1) + "---|---|")
    for k, row in table.items():
        c, c32 = checks[k], checks32[k]
        print(f"| {k} | " + " | ".join(f"{row[t]:.1f}" for t in WIDTHS) + f" | {row[17] / row[1]:.2f} | "
              f"max logit diff {c['max_abs_logit_diff']:.2g}, argmax {c['argmax_agrees']}/{c['rows']} | "
              f"{c32['max_abs_logit_diff']:.2g}, argmax {c32['argmax_agrees']}/{c32['rows']} |")
    ref = table["float32"][1]
    for k in [k for k in models if k != "float32"]:
        print(f"{k}: one position {ref / table[k][1]:.2f}x the float32 model's speed")
    doc = {"environment": environment(ModelPair(models["float32"]), 0), "cpu": cpu_label(), "context": args.context,
           "repeats": args.repeats, "ms": table, "width_check": checks, "width_check_32": checks32}
    write_json(args.json, doc)
    return doc


if __name__ == "__main__":
    main()
