"""The consistency-trained preset (CLLM) against the base model: Jacobi's tokens per forward and speed over
each model's own greedy, on prompts no training used, in one process after a warm-up, medians of repeats.
No adapter is shipped: it needs a preset ``smollm2-135m-instruct-cllm`` (``base:`` + ``adapter:`` in
presets/models.yaml) made from your own ``python -m playground.train_consistency --export`` (docs/consistency-training.md).

    python benchmarks/bench_consistency.py [--repeats 3] [--max-new-tokens 64] [--lossless-prompts N] [--json FILE]

Prompt sets: ``held`` (presets/consistency/heldout.yaml: whole held-out sources of the training command,
self-written and template) and ``chat`` (presets/prompts.yaml's chat prompts, excluded from training).
Per model and prompt: greedy and Jacobi (hybrid, pad init, the block the preset was trained for; ``--block``)
interleaved, ``--repeats``
timed runs each after one untimed warm-up; tokens per target forward are deterministic. Then, untimed, every
lossless strategy on the preset against its own greedy (token-identical or not), and the quality drift: the
preset's greedy answers against the base model's (position-wise agreement) and the base model's per-token
loss on the preset's answers vs. on its own.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import write_json  # noqa: E402
from decoding.harness.runner import encode_prompt, run_one  # noqa: E402
from decoding.runtime.kernel_choice import cpu_label  # noqa: E402
from decoding.runtime.models import PRESETS_DIR, load_model, load_presets  # noqa: E402
from decoding.runtime.pair import ModelPair  # noqa: E402
from decoding.strategies import get_strategy  # noqa: E402

BASE, CLLM = "smollm2-135m-instruct", "smollm2-135m-instruct-cllm"
LOSSLESS = [("jacobi", {}), ("jacobi", {"variant": "jacobi"}), ("jacobi", {"variant": "gs_jacobi"}),
            ("jacobi", {"variant": "sliding"}), ("jacobi", {"init": "random", "block_size": 16}),
            ("lookahead", {}), ("prompt_lookup", {}), ("speculative", {})]


def prompt_sets(heldout: Path | None = None) -> dict[str, list[str]]:
    """``held``: the training command's held-out prompts (``heldout``: the file a run wrote with
    ``--write-heldout``, default the bundled one); ``chat``: presets/prompts.yaml's chat prompts."""
    held = yaml.safe_load((heldout or PRESETS_DIR / "consistency" / "heldout.yaml").read_text(encoding="utf-8"))
    chat = yaml.safe_load((PRESETS_DIR / "prompts.yaml").read_text(encoding="utf-8"))["chat"]
    return {"held": [p["text"] for p in held["prompts"]], "chat": list(chat)}


def speed(lm, prompts: list[str], repeats: int, max_new: int, block: int = 0) -> list[dict]:
    greedy, jacobi = get_strategy("greedy"), get_strategy("jacobi")
    pair, gp, jp = ModelPair(lm), greedy.parse({}), jacobi.parse({"block_size": block} if block else {})
    warm = encode_prompt(lm.tokenizer, prompts[0], chat=True)
    run_one(greedy, gp, warm, pair, max_new_tokens=16, trace=False)
    run_one(jacobi, jp, warm, pair, max_new_tokens=16, trace=False)
    rows = []
    for text in prompts:
        ids = encode_prompt(lm.tokenizer, text, chat=True)
        tg, tj = [], []
        for _ in range(repeats):
            g, seconds, _ = run_one(greedy, gp, ids, pair, max_new_tokens=max_new, trace=False)
            tg.append(seconds)
            j, seconds, _ = run_one(jacobi, jp, ids, pair, max_new_tokens=max_new, trace=False)
            tj.append(seconds)
        rows.append({"prompt": text, "tokens": len(g.token_ids), "greedy_ids": g.token_ids,
                     "greedy_s": statistics.median(tg), "jacobi_s": statistics.median(tj),
                     "tokens_per_forward": len(j.token_ids) / j.target_forwards,
                     "speedup": statistics.median(tg) / statistics.median(tj),
                     "exact": j.token_ids == g.token_ids, "iterations_per_block": j.stats.get("mean_iterations_per_block")})
        print(f"  {lm.name[-4:]} {rows[-1]['tokens_per_forward']:.2f} tok/fwd {rows[-1]['speedup']:.2f}x "
              f"{text[:60]!r}", flush=True)
    return rows


def lossless(lm, prompts: list[str], max_new: int) -> dict[str, str]:
    pair, self_pair = ModelPair(lm), ModelPair(lm, lm)
    greedy = get_strategy("greedy")
    out: dict[str, list[bool]] = {}
    for text in prompts:
        ids = encode_prompt(lm.tokenizer, text, chat=True)
        ref = run_one(greedy, greedy.parse({}), ids, pair, max_new_tokens=max_new, trace=False)[0].token_ids
        for name, values in LOSSLESS:
            strategy = get_strategy(name)
            res = run_one(strategy, strategy.parse(values), ids, self_pair if strategy.needs_assistant else pair,
                          max_new_tokens=max_new, trace=False)[0]
            out.setdefault(f"{name} {values}" if values else name, []).append(res.token_ids == ref)
    return {k: f"{sum(v)}/{len(v)}" for k, v in out.items()}


@torch.no_grad()
def nll(lm, text: str, answer: list[int]) -> tuple[float, int]:
    """The base model's summed loss on ``answer`` after the chat prompt, and its length."""
    ids = encode_prompt(lm.tokenizer, text, chat=True)
    logits = lm.model(input_ids=torch.tensor([ids + answer])).logits[0, len(ids) - 1:-1].float()
    return float(torch.nn.functional.cross_entropy(logits, torch.tensor(answer), reduction="sum")), len(answer)


def drift(base, base_rows: list[dict], cllm_rows: list[dict]) -> dict:
    agree, own, theirs = [], [0.0, 0], [0.0, 0]
    for b, c in zip(base_rows, cllm_rows):
        a, o = b["greedy_ids"], c["greedy_ids"]
        agree.append(sum(x == y for x, y in zip(a, o)) / max(len(a), len(o), 1))
        for acc, ans in ((own, a), (theirs, o)):
            loss, n = nll(base, b["prompt"], ans)
            acc[0] += loss
            acc[1] += n
    return {"agreement": round(statistics.mean(agree), 4), "identical": sum(x == 1.0 for x in agree),
            "base_loss_on_base": round(own[0] / own[1], 4), "base_loss_on_cllm": round(theirs[0] / theirs[1], 4)}


def summary(rows: list[dict]) -> dict:
    return {"tokens_per_forward": round(statistics.median(r["tokens_per_forward"] for r in rows), 3),
            "speedup": round(statistics.median(r["speedup"] for r in rows), 3),
            "exact": f"{sum(r['exact'] for r in rows)}/{len(rows)}"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sets", default="held,chat")
    ap.add_argument("--no-lossless", action="store_true")
    ap.add_argument("--lossless-prompts", type=int, default=0,
                    help="check the lossless strategies on the first this many prompts of each set (0: all)")
    ap.add_argument("--heldout", type=Path, default=None,
                    help="the held-out prompts the training run wrote (--write-heldout; default: the bundled file)")
    ap.add_argument("--block", type=int, default=None, help="Jacobi's block for both models (default: the block "
                    "the preset was trained for, its trained_params; 0: auto, from this machine's curve)")
    ap.add_argument("--prompts", type=int, default=0, help="only the first this many prompts of each set (0: all)")
    ap.add_argument("--json", default="benchmarks/results/consistency-cpu.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    env = {"cpu": cpu_label(), "threads": torch.get_num_threads(), "torch": torch.__version__,
           "load_before": os.getloadavg()[0], "repeats": args.repeats, "max_new_tokens": args.max_new_tokens,
           "heldout": str(args.heldout) if args.heldout else None, "adapter": None}
    print(f"CPU: {env['cpu']}, {env['threads']} threads, load {env['load_before']:.1f}", flush=True)
    preset = load_presets().get(CLLM)
    if preset is None:
        raise SystemExit(f"no preset {CLLM}: add one with base: and adapter: (see this script's docstring)")
    if args.block is None:      # the block it was trained for: auto picks a narrow one where wide forwards cost
        args.block = int(((preset.trained_params or {}).get("block_size")) or 0)
    env["jacobi_block"], env["adapter"] = args.block or "auto", preset.adapter
    base, cllm = load_model(BASE), load_model(CLLM)
    doc: dict = {"environment": env, "sets": {}}
    for name, prompts in prompt_sets(args.heldout).items():
        if name not in args.sets.split(","):
            continue
        prompts = prompts[:args.prompts or None]
        print(f"{name}: {len(prompts)} prompts", flush=True)
        rows = {m.name: speed(m, prompts, args.repeats, args.max_new_tokens, args.block) for m in (base, cllm)}
        entry = {"base": summary(rows[BASE]), "cllm": summary(rows[CLLM]),
                 "drift": drift(base, rows[BASE], rows[CLLM]), "rows": rows}
        if not args.no_lossless:
            entry["lossless_on_cllm"] = lossless(cllm, prompts[:args.lossless_prompts or None], args.max_new_tokens)
        doc["sets"][name] = entry
        print(f"{name}: base {entry['base']} | cllm {entry['cllm']} | drift {entry['drift']}"
              + (f" | lossless {entry['lossless_on_cllm']}" if "lossless_on_cllm" in entry else ""), flush=True)
    env["load_after"] = os.getloadavg()[0]
    write_json(args.json, doc)


if __name__ == "__main__":
    main()
