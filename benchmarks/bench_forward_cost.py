"""What one target forward over T new positions costs, on each CPU linear kernel.

    python benchmarks/bench_forward_cost.py [--target smollm2-135m-instruct] [--repeats 15]
        [--context 128] [--json benchmarks/results/forward-cost-cpu.json]

Speculative, prompt-lookup, prophet and lookahead decoding all trade target
forwards for wider ones: a step verifies 1 + k drafted positions (or a whole
lookahead window) at once. They can only win when a T-position forward costs
far less than T one-position forwards.

On the CPU, which linear kernel is faster depends on the machine and on T
(decoding/runtime/kernels.py): PyTorch's default (MKL sgemm) or weights prepacked for
oneDNN. ``load_model`` times both on the model's layers once per machine and
runs each bucket of row counts on the faster one ("chosen", decoding/
kernel_choice.py). This script measures whole forwards on all three on one
loaded model, interleaved after a warm-up, after a prefill of ``--context``
tokens (the cache cropped back after each), median over repeats. It prints
every T, then per bucket the chosen kernels' cost against the better of the
two (goal: within 5 %). A one-position forward runs as greedy runs it (LM head
on the last position only); wider ones compute every position's logits, as a
verify forward does.
"""

from __future__ import annotations

import argparse

import torch

from common import median, remeasure_kernels, timed, write_json  # first: it puts the repository root on sys.path

from decoding.harness.runner import environment
from decoding.runtime import kernels
from decoding.runtime.kernel_choice import REPEATS
from decoding.runtime.models import load_model
from decoding.runtime.pair import ModelPair
from decoding.runtime.session import Session

WIDTHS = (1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 64, 128)


def kernel_setter(model):
    """Every linear layer as a PackedLinear; returns set(choice_of_shape) to switch kernels in place."""
    kernels.apply(model, "packed")
    layers = [child for _, _, child in kernels.linear_layers(model) if isinstance(child, kernels.PackedLinear)]

    def use(choice_of_shape) -> None:
        for layer in layers:
            layer.set_choice(choice_of_shape(kernels.shape_of(layer)))
    return use


def time_forwards(lm, use, configs: dict, repeats: int, context: int) -> dict:
    """Median ms per (config, T): a warm-up, then each (config, T) once per repeat, config order rotating."""
    vocab = lm.vocab_size
    session = Session(lm)
    session.prefill([(17 * i + 3) % vocab for i in range(context)])
    base = session.length

    def forward(width: int) -> None:
        ids = session.tensor([[(31 * i + 7) % vocab for i in range(width)]])
        session.forward(ids, last_only=width == 1)    # one position: as plain greedy runs it
        session.crop(base)

    names = list(configs)
    for name in names:
        use(configs[name])
        for width in WIDTHS:
            forward(width)
    times: dict[tuple[str, int], list[float]] = {(c, w): [] for c in names for w in WIDTHS}
    for rep in range(repeats):
        for width in WIDTHS:
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                use(configs[name])
                times[(name, width)].append(timed(lambda: forward(width), lm.device)[1])
    return {key: median(values) * 1000 for key, values in times.items()}


def report(ms: dict, bucket_kernels: list[dict]) -> tuple[list[dict], list[dict]]:
    """Print every T, then per bucket the chosen kernels' cost against the better of the two."""
    names = ("default", "packed", "chosen")
    print(f"{'T':>4} {'default ms':>11} {'packed ms':>10} {'chosen ms':>10} {'chosen/best':>12}")
    rows = []
    for width in WIDTHS:
        d, p, c = (ms[(name, width)] for name in names)
        rows.append({"positions": width, "bucket": kernels.bucket_label(kernels.bucket_of(width)),
                     "default_ms": round(d, 2), "packed_ms": round(p, 2), "chosen_ms": round(c, 2),
                     "chosen_over_best": round(c / min(d, p), 3)})
        print(f"{width:>4} {d:>11.1f} {p:>10.1f} {c:>10.1f} {c / min(d, p):>12.3f}")
    buckets = []
    print(f"\n{'rows':>6} {'chosen kernel':>22} {'default ms':>11} {'packed ms':>10} {'chosen ms':>10} "
          f"{'chosen/best':>12}  (sums over the T of each bucket; goal <= 1.05)")
    for bucket in bucket_kernels:
        inside = [r for r in rows if r["bucket"] == bucket["rows"]]
        d, p, c = (sum(r[f"{name}_ms"] for r in inside) for name in names)
        kernel = bucket["kernel"] if bucket["kernel"] != "mixed" else f"{bucket['packed_share']:.0%} packed"
        buckets.append({**bucket, "default_ms": round(d, 2), "packed_ms": round(p, 2), "chosen_ms": round(c, 2),
                        "chosen_over_best": round(c / min(d, p), 3)})
        print(f"{bucket['rows']:>6} {kernel:>22} {d:>11.1f} {p:>10.1f} {c:>10.1f} {c / min(d, p):>12.3f}")
    return rows, buckets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    ap.add_argument("--remeasure", action="store_true",
                    help="time the kernels again for load_model's choice and replace the cached decision "
                         "(for one taken while the machine was busy)")
    ap.add_argument("--kernel-repeats", type=int, default=REPEATS, help="repeats of that timing")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)     # part of the kernel choice's cache key

    lm = load_model(args.target, device=args.device, dtype=args.dtype, kernels="auto")
    if lm.device.type != "cpu" or not kernels.packable_dtype(lm.model):
        raise SystemExit(f"this compares CPU linear kernels; {lm.name} runs on {lm.device} in {lm.dtype}")
    if args.remeasure:
        remeasure_kernels(lm, args.target, args.kernel_repeats)
    choice = lm.state.kernel_choice
    env = environment(ModelPair(lm), 0)              # describes the chosen kernels, before switching
    table = dict(choice.table)
    configs = {"default": lambda shape: kernels.ALL_DEFAULT, "packed": lambda shape: kernels.ALL_PACKED,
               "chosen": lambda shape: table.get(shape, kernels.ALL_DEFAULT)}
    ms = time_forwards(lm, kernel_setter(lm.model), configs, args.repeats, args.context)
    print(f"CPU: {env['cpu']}, {env['threads']} torch threads, torch {env['torch']}, {lm.name} "
          f"({env['dtype']}); kernel choice {choice.source}: {env['target']['kernels']}")
    rows, buckets = report(ms, env["target"]["kernel_buckets"])
    worst = max(b["chosen_over_best"] for b in buckets)
    print(f"worst bucket: chosen/best = {worst:.3f} (goal <= 1.05); one position, packed/default = "
          f"{ms[('packed', 1)] / ms[('default', 1)]:.3f}")
    write_json(args.json, {"environment": env, "context": args.context, "repeats": args.repeats,
                           "kernel_choice": choice.record(), "rows": rows, "buckets": buckets,
                           "worst_chosen_over_best": worst})


if __name__ == "__main__":
    main()
