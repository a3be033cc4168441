"""What one target forward over T new positions costs, relative to T = 1.

    python benchmarks/bench_forward_cost.py [--target smollm2-135m-instruct] [--repeats 15]
        [--context 128] [--json benchmarks/results/forward-cost-cpu.json]

Speculative, prompt-lookup, prophet and lookahead decoding all trade target
forwards for wider ones: a step verifies 1 + k drafted positions (or a whole
lookahead window) at once. They can only win when a T-position forward costs
far less than T one-position forwards. On a GPU that holds up to hundreds of
positions; on a small CPU it does not, and this script measures by how much.

After a prefill of ``--context`` tokens, forwards of T positions run
round-robin over all T (interleaved, after a warm-up), the cache cropped back
after each; every figure is the median over repeats.

On the CPU it measures both linear kernels on the one loaded model: PyTorch's
default (MKL sgemm) and the weights prepacked for oneDNN (decoding/kernels.py,
what ``load_model`` uses by default). Their T = 1 ratio is also greedy's own
speedup from packing.
"""

from __future__ import annotations

import argparse

from common import median, timed, write_json

from decoding import kernels
from decoding.lm import Session
from decoding.models import load_model
from decoding.result import ModelPair
from decoding.runner import environment

WIDTHS = (1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    lm = load_model(args.target, device=args.device, dtype=args.dtype, pack=False)
    vocab = lm.vocab_size
    session = Session(lm)
    session.prefill([(17 * i + 3) % vocab for i in range(args.context)])
    base = session.length

    def forward(width: int) -> None:
        ids = session.tensor([[(31 * i + 7) % vocab for i in range(width)]])
        session.forward(ids, last_only=width == 1)    # one position: as plain greedy runs it
        session.crop(base)

    def measure() -> dict[int, float]:
        for width in WIDTHS:   # warm-up
            forward(width)
        times: dict[int, list[float]] = {w: [] for w in WIDTHS}
        for _ in range(args.repeats):
            for width in WIDTHS:
                times[width].append(timed(lambda: forward(width), lm.device)[1])
        return {w: median(t) * 1000 for w, t in times.items()}

    tables = {"default": measure()}
    if kernels.pack_linears(lm.model):
        tables["onednn-packed"] = measure()
    rows = []
    for width in WIDTHS:
        row = {"positions": width}
        for name, ms in tables.items():
            row[f"{name}_ms"] = round(ms[width], 2)
            row[f"{name}_relative_to_one"] = round(ms[width] / ms[1], 3)
        rows.append(row)
        print(f"T={width:3d}  " + "  ".join(
            f"{name}: {ms[width]:7.1f} ms x{ms[width] / ms[1]:5.2f}" for name, ms in tables.items()))
    if len(tables) == 2:
        print(f"one-position forward, packed / default: {tables['onednn-packed'][1] / tables['default'][1]:.3f}")
    write_json(args.json, {"environment": environment(ModelPair(lm), 0), "context": args.context,
                           "repeats": args.repeats, "kernels": list(tables), "rows": rows})


if __name__ == "__main__":
    main()
