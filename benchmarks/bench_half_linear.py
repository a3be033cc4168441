"""The float16-weight product on the CPU: the project's kernel against FBGEMM's and float32, over a forward's weights.

    python benchmarks/bench_half_linear.py [--rows 1 2 4 10 16] [--repeats 5] [--copies 4] [--layers 30] [--json PATH]

What a float16-weight forward of the bundled model multiplies (SmolLM2-135M's shapes as the compiled path joins
them: per layer q|k|v 960 x 576, o 576 x 576, gate|up 3072 x 576, down 576 x 1536; 30 layers and the LM head
49152 x 576), for a verify forward of M rows. ``--copies`` distinct copies of those weights are cycled (about 270 MB
each in float16), so the weights stream from memory as in a real forward rather than sitting in a cache a copy
fits. Three products, timed interleaved after a warm-up round in one process, median ms of a whole forward's
products:

- ``ours``: ``attention_kernels.half_linear`` (float16 weights, each row's bits the same at any M);
- ``fbgemm``: PyTorch's prepacked float16 product (``quantized.linear_dynamic_fp16``), where this build has it
  (``kernels.half_available``);
- ``float32``: ``F.linear`` on the float32 weights (twice the bytes);
- ``bf16-ours``: ``attention_kernels.bf16_linear`` on bfloat16 copies (the bfloat16-weight version's product: the
  same bytes as float16, AVX-512 BF16's pair products where the CPU has them; another model's arithmetic, timed
  beside the others).
- ``int8-ours``: ``attention_kernels.i8_linear`` on int8 copies, the rows quantized to int8 per group of 64 inputs
  (the int8-weight-and-activation version's product: a quarter of float32's weight bytes, AVX-512 VNNI's byte
  products where the CPU has them; another model's arithmetic again).

Each M also checks that ``ours`` gives every row the bits it gives that row alone. The CPU and the instruction set
PyTorch runs (the AVX2 caps of BENCHMARKS.md change it) are named in the output.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from common import interleaved_ms, median, write_json  # first: it puts the repository root on sys.path

from decoding.runtime import attention_kernels, kernels
from decoding.runtime.cpu import pytorch_isa
from decoding.runtime.kernel_choice import cpu_label

LAYER = ((960, 576), (576, 576), (3072, 576), (576, 1536))     # (N, K) per layer, joined as the compiled path does
LAYERS, HEAD = 30, (49152, 576)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 10, 16])
    p.add_argument("--repeats", type=int, default=5, help="timed rounds (each: every copy once per product)")
    p.add_argument("--copies", type=int, default=4, help="distinct copies of the weights, cycled")
    p.add_argument("--layers", type=int, default=LAYERS, help="decoder layers' products (the LM head's too)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if not all(1 <= m <= 64 for m in args.rows):
        p.error("--rows: each between 1 and 64")
    if not 1 <= args.copies <= 16 or not 1 <= args.repeats <= 100 or not 0 <= args.layers <= 64:
        p.error("--copies: 1 to 16; --repeats: 1 to 100; --layers: 0 to 64")
    return args


def weights(copies: int, layers: int = LAYERS) -> list[list[torch.Tensor]]:
    """``copies`` forwards' worth of float32 weights, [N, K] each (the LM head's last), small values as a trained
    model's."""
    gen = torch.Generator().manual_seed(0)
    shapes = [s for _ in range(layers) for s in LAYER] + [HEAD]
    return [[torch.randn(n, k, generator=gen) * 0.05 for n, k in shapes] for _ in range(copies)]


def _ours_at(width: int):
    def call(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        attention_kernels.half_width(width)
        return attention_kernels.half_linear(x, packed, None)
    return call


def _int8(weight: torch.Tensor) -> tuple:
    q, scales = kernels.int8_rows(weight)
    return attention_kernels.pack_int8(q), scales


def products(copies: list[list[torch.Tensor]], fbgemm: bool) -> dict:
    """Each product's packed weights per copy, and the call that runs one of them on rows ``x``. ``ours`` runs the
    path the load measured as faster (``attention_kernels.choose_half_width``); where the build has both, the other
    path is timed too (``ours-8`` or ``ours-16``: floats per register; the same bits)."""
    chosen = attention_kernels.half_width()
    packed = [[attention_kernels.pack_half(w) for w in ws] for ws in copies]
    out = {"ours": (packed, _ours_at(chosen)), "float32": (copies, lambda x, w: F.linear(x, w)),
           "bf16-ours": ([[attention_kernels.pack_bf16(w) for w in ws] for ws in copies],
                         lambda x, w: attention_kernels.bf16_linear(x, w, None, w.shape[0] * 4)),
           "int8-ours": ([[_int8(w) for w in ws] for ws in copies],
                         lambda x, w: attention_kernels.i8_linear(x, w[0], w[1], None, w[1].shape[0]))}
    other = 8 if chosen == 16 else 16
    if attention_kernels.half_choice()["widest"] == 16:
        out[f"ours-{other}"] = (packed, _ours_at(other))
    if fbgemm:
        out["fbgemm"] = ([[torch.ops.quantized.linear_prepack_fp16(w, None) for w in ws] for ws in copies],
                         torch.ops.quantized.linear_dynamic_fp16)
    return out


def rows_exact(packed: torch.Tensor, m: int) -> bool:
    x = torch.randn(m, packed.shape[1] * 8, generator=torch.Generator().manual_seed(m))
    alone = torch.cat([attention_kernels.half_linear(x[i:i + 1], packed, None) for i in range(m)])
    return torch.equal(attention_kernels.half_linear(x, packed, None), alone)


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    reason = attention_kernels.load_default()
    if reason is not None:
        raise SystemExit(f"the project's kernel is not available here: {reason}")
    copies = weights(args.copies, args.layers)
    kinds = products(copies, kernels.half_available())
    names = list(kinds)
    cpu = (f"{cpu_label()}; PyTorch's kernels: {pytorch_isa()}; kernel built for {attention_kernels.target_arch()}; "
           f"its path: {attention_kernels.half_width()} floats ({attention_kernels.half_choice()['why']})")
    print(f"CPU: {cpu}; {torch.get_num_threads()} threads; {args.copies} copies of the weights "
          f"({sum(w.numel() for w in copies[0]) * 2 / 1e6:.0f} MB each in float16)")
    flops = 2 * sum(w.numel() for w in copies[0])
    doc = {"cpu": cpu, "threads": torch.get_num_threads(), "copies": args.copies, "rows": {}}
    print("| rows | " + " | ".join(f"{n} ms" for n in names) + " | ours GFLOP/s | fbgemm / ours | float32 / ours "
          "| rows exact |")
    print("|---:|" + "---:|" * (len(names) + 4))
    with torch.inference_mode():
        for m in args.rows:
            xs = {k: torch.randn(m, k) for k in {k for _, k in LAYER + (HEAD,)}}

            def forward(name: str) -> None:
                packed, call = kinds[name]
                for ws in packed:                    # every copy once: the weights stream from memory
                    for i, w in enumerate(ws):
                        call(xs[copies[0][i].shape[1]], w)

            times, _ = interleaved_ms(names, args.repeats, forward)
            attention_kernels.half_width(int(attention_kernels.half_choice()["width"]))
            ms = {n: median(t) / args.copies for n, t in times.items()}
            exact = all(rows_exact(w, m) for w in kinds["ours"][0][0][-1:] + kinds["ours"][0][0][3:4])
            ratio = {n: ms[n] / ms["ours"] for n in names}
            doc["rows"][str(m)] = {"ms": ms, "ours_gflops": flops * m / ms["ours"] / 1e6, "exact": exact}
            print(f"| {m} | " + " | ".join(f"{ms[n]:.2f}" for n in names)
                  + f" | {flops * m / ms['ours'] / 1e6:.0f} | "
                  + (f"{ratio['fbgemm']:.2f}" if "fbgemm" in ratio else "–")
                  + f" | {ratio['float32']:.2f} | {'yes' if exact else 'NO'} |", flush=True)
    write_json(args.json, doc)
    return doc


if __name__ == "__main__":
    main()
