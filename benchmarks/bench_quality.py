"""What each version of the default model costs in quality: its loss on text people wrote, and how long its greedy
follows float32's.

    python benchmarks/bench_quality.py [--max-new-tokens 48] [--json benchmarks/results/quality-cpu.json]

Every version of the default model that loads on this machine (float32 and its reduced-weight siblings:
``presets/models.yaml``, ``weights:``), in one process, on the prompts of ``presets/bench_unseen.yaml`` the project
did not write (MT-Bench questions and HumanEval problems; the model's own ``selfgen`` prompts are left out):

* **loss**: the mean negative log-likelihood per token of the prompts' own text (each prompt as plain text, no chat
  template; the first token not scored), in nats. Human text, so no version is favoured by having written it.
* **Δ loss**: that loss minus float32's, per cent.
* **greedy agreement**: each prompt in the chat template, ``--max-new-tokens`` greedy tokens; the median share of
  them before the version's first token that differs from float32's, and how many prompts agree to the end.

``--compiled``: each version that compiles here again on its compiled forward (the app's served mode: greedy on the
fast path, ``runtime/compiled.py``), its greedy agreement with float32's. A version that rounds its activations (int8)
can part from its own eager greedy where a norm's sums come out in another order, so the served mode's agreement is
measured, not assumed. A speed-up between versions is the CPU table's matter (``bench_cpu_table.py``); this is the
other side of the trade.
The CPU is named in the output (the reduced versions' bits do not depend on it, except oneDNN's bfloat16 route).
"""

from __future__ import annotations

import argparse
import statistics

from common import UNSEEN_PROMPTS, write_json  # first: it puts the repository root on sys.path

import torch
import torch.nn.functional as F

from decoding.harness.bench import load_prompt_set
from decoding.harness.runner import encode_prompt, run_one
from decoding.params import GreedyParams
from decoding.runtime import compiled, routes
from decoding.runtime.pair import ModelPair
from decoding.strategies import get_strategy
from decoding.runtime.kernel_choice import cpu_label
from decoding.runtime.models import default_target, load_model, load_presets


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--json", default=None)
    p.add_argument("--compiled", action="store_true",
                   help="also each version's compiled forward (the app's served mode): its greedy on the fast path")
    args = p.parse_args(argv)
    if not 1 <= args.max_new_tokens <= 256:
        p.error("--max-new-tokens: 1 to 256")
    return args


def text_loss(lm, texts: list[str]) -> float:
    """Mean negative log-likelihood per scored token of ``texts`` under ``lm``, in nats."""
    total, count = 0.0, 0
    with torch.inference_mode():
        for text in texts:
            ids = torch.tensor([lm.tokenizer(text).input_ids])
            logits = lm.model(ids).logits[0, :-1].float()
            total += float(F.cross_entropy(logits, ids[0, 1:], reduction="sum"))
            count += ids.shape[1] - 1
    return total / count


def greedy_tokens(lm, prompts: list[str], max_new: int) -> list[list[int]]:
    out = []
    with torch.inference_mode():
        for text in prompts:
            ids = torch.tensor([encode_prompt(lm.tokenizer, text, chat=lm.chat)])
            gen = lm.model.generate(ids, max_new_tokens=max_new, do_sample=False, attention_mask=torch.ones_like(ids))
            out.append(gen[0, ids.shape[1]:].tolist())
    return out


def compiled_greedy_tokens(lm, prompts: list[str], max_new: int) -> list[list[int]] | None:
    """``lm``'s greedy on the compiled fast path, as the app's race runs it (None: it does not compile here)."""
    if compiled.compiler_missing() is not None or compiled.enable(lm) is not None:
        return None
    pair, out = ModelPair(lm), []
    try:
        for text in prompts:
            ids = list(encode_prompt(lm.tokenizer, text, chat=lm.chat))
            result, _, _ = run_one(get_strategy("greedy"), GreedyParams(fast=True), ids, pair, max_new_tokens=max_new,
                                   trace=False)
            out.append(list(result.token_ids))
    finally:
        compiled.disable(lm)
    return out


def agreement(ref: list[int], got: list[int]) -> int:
    """Tokens before the first where ``got`` leaves ``ref``."""
    return next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    prompts = [text for category, text in load_prompt_set(UNSEEN_PROMPTS) if category != "selfgen"]
    names = routes.versions(default_target(), load_presets())
    print(f"CPU: {cpu_label()}; {len(prompts)} prompts (MT-Bench, HumanEval); versions: {', '.join(names)}")
    doc = {"cpu": cpu_label(), "prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "versions": {}}
    reference = None
    print("| version | weights | loss (nats/token) | Δ loss | greedy tokens before the first that differs from float32's (median) | prompts agreeing to the end |")
    print("|---|---|---:|---:|---:|---:|")
    for name in names:
        lm = load_model(name)
        loss = text_loss(lm, prompts)
        tokens = greedy_tokens(lm, prompts, args.max_new_tokens)
        if reference is None:
            reference = {"loss": loss, "tokens": tokens}
        shared = [agreement(r, t) for r, t in zip(reference["tokens"], tokens)]
        whole = sum(1 for r, t in zip(reference["tokens"], tokens) if r == t)
        delta = 100.0 * (loss / reference["loss"] - 1.0)
        doc["versions"][name] = {"weights": lm.weights, "loss": loss, "delta_pct": delta,
                                 "agree_median": statistics.median(shared), "agree_whole": whole, "shared": shared}
        print(f"| {name} | {lm.weights} | {loss:.4f} | {delta:+.2f} % | {statistics.median(shared):.0f} of "
              f"{args.max_new_tokens} | {whole} of {len(prompts)} |")
        served = compiled_greedy_tokens(lm, prompts, args.max_new_tokens) if args.compiled else None
        if served is not None:
            shared = [agreement(r, t) for r, t in zip(reference["tokens"], served)]
            whole = sum(1 for r, t in zip(reference["tokens"], served) if r == t)
            doc["versions"][name]["compiled"] = {"agree_median": statistics.median(shared), "agree_whole": whole,
                                                 "shared": shared}
            print(f"| {name}, compiled | {lm.weights} | | | {statistics.median(shared):.0f} of "
                  f"{args.max_new_tokens} | {whole} of {len(prompts)} |")
    write_json(args.json, doc)
    return doc


if __name__ == "__main__":
    main()
