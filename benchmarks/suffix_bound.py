"""How far can copying go? Upper bounds on tokens per target forward for model-free drafters, on the six
input-grounded prompts of ``make bench-suffix`` (64 tokens, the bundled model), next to what our prompt lookup
and suffix decoding reach. Deterministic: no timing, run it anywhere.

    python benchmarks/suffix_bound.py [--json benchmarks/results/suffix-bound.json]

Each step of greedy's output is replayed with a perfect chooser:

* *match bound*: the longest run of the coming tokens that follows **some occurrence of the last committed
  token** in the prompt and output so far. Every drafter that copies what followed a match of the context's end
  (prompt lookup, suffix decoding, with any tree width and any scoring) commits at most this much per forward.
* *edit bound*: the match bound plus two continuations that need no match, from the copy that was just
  cut short: the source right after the rejected token (the target replaced it) and the rejected token itself
  (the target inserted text before it), kept for the last two cut-short copies. A model-free drafter that
  follows the source across small edits (a renamed variable, an added comma) commits at most this much.
* *copy bound*: the longest run of the coming tokens found **anywhere** in the prompt and output so far, match
  or not. Only a drafter that knows where to copy from without a match (a model) could reach it.

A step commits the copied run plus the target's own token, as in the speculative loop.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Callable, Sequence

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from decoding.drafting.suffix import run_length  # noqa: E402
from decoding.harness.runner import encode_prompt  # noqa: E402
from decoding.runtime.models import PRESETS_DIR, load_model  # noqa: E402
from decoding.runtime.pair import ModelPair  # noqa: E402
from decoding.strategies import get_strategy  # noqa: E402

GROUNDED = [("code", 2), ("code", 4), ("code", 7), ("summarization", 0), ("summarization", 1),
            ("summarization", 2)]


def match_run(context: Sequence[int], coming: Sequence[int]) -> int:
    """The longest prefix of ``coming`` that follows an earlier occurrence of ``context[-1]``."""
    return max((run_length(context, i, coming) for i in _after_matches(context)), default=0)


def _after_matches(context: Sequence[int]) -> list[int]:
    """Where a copy may start: just after each earlier occurrence of ``context[-1]``."""
    return [i + 1 for i in range(len(context) - 1) if context[i] == context[-1]]


def copy_run(context: Sequence[int], coming: Sequence[int]) -> int:
    """The longest prefix of ``coming`` found anywhere in ``context``."""
    n = 0
    while n < len(coming) and _occurs(context, coming[:n + 1]):
        n += 1
    return n


def _occurs(hay: Sequence[int], needle: Sequence[int]) -> bool:
    k = len(needle)
    return any(hay[i:i + k] == needle for i in range(len(hay) - k + 1))


def edit_replay(prompt: Sequence[int], output: Sequence[int], keep: int = 4) -> int:
    """Target forwards of the edit bound: matches of the last token, or resuming a cut-short copy."""
    pos = steps = 0
    cursors: list[int] = []
    while pos < len(output):
        context, coming = list(prompt) + list(output[:pos]), output[pos:]
        best, start = max(((run_length(context, i, coming), i) for i in _after_matches(context) + cursors),
                          default=(0, -1))
        run = min(best, len(output) - pos - 1)
        if run > 0:           # the copy was cut short at start + run: resume after it, or at it
            cursors = ([start + run + 1, start + run] + cursors)[:keep]
        pos += run + 1
        steps += 1
    return steps


def replay(prompt: Sequence[int], output: Sequence[int], run: Callable[[Sequence[int], Sequence[int]], int]) -> int:
    """Target forwards a perfect chooser needs: each step commits ``run``'s copy (not past the last token) + 1."""
    pos = steps = 0
    while pos < len(output):
        context = list(prompt) + list(output[:pos])
        pos += min(run(context, output[pos:]), len(output) - pos - 1) + 1
        steps += 1
    return steps


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m-instruct", help="a preset name (presets/models.yaml)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--json", help="write the per-prompt numbers here")
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    sets = yaml.safe_load((PRESETS_DIR / "prompts.yaml").read_text())
    target = load_model(args.target)
    pair = ModelPair(target)
    methods = {name: get_strategy(name) for name in ("greedy", "prompt_lookup", "suffix")}
    rows = []
    for category, index in GROUNDED:
        ids = encode_prompt(target.tokenizer, sets[category][index],
                            chat=getattr(target.tokenizer, "chat_template", None) is not None)
        runs = {name: s.generate(ids, pair, s.parse({}), max_new_tokens=args.max_new_tokens)
                for name, s in methods.items()}
        out = runs["greedy"].token_ids
        assert all(r.token_ids == out for r in runs.values()), "a drafter left greedy's output"
        row = {"prompt": f"{category}[{index}]", "tokens": len(out),
               "prompt_lookup": len(out) / runs["prompt_lookup"].target_forwards,
               "suffix": len(out) / runs["suffix"].target_forwards,
               "match_bound": len(out) / replay(ids, out, match_run),
               "edit_bound": len(out) / edit_replay(ids, out),
               "copy_bound": len(out) / replay(ids, out, copy_run)}
        rows.append(row)
        print(" ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)
    print("tokens per target forward, mean over prompts; and the median over prompts of each / prompt lookup:")
    for key in ("prompt_lookup", "suffix", "match_bound", "edit_bound", "copy_bound"):
        ratio = statistics.median(r[key] / r["prompt_lookup"] for r in rows)
        print(f"  {key:14s} {statistics.fmean(r[key] for r in rows):.3f}   / prompt lookup, median {ratio:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"target": args.target, "max_new_tokens": args.max_new_tokens,
                                              "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
