"""Deterministic sweep behind the suffix strategy's defaults: tokens per target forward (and drafted
nodes per forward) on the six input-grounded prompts of ``make bench-suffix``, 64 tokens, every run checked
against greedy. No timing: run it anywhere.

    python benchmarks/sweep_suffix.py
"""
import argparse
import statistics
import sys
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from decoding.harness.runner import encode_prompt  # noqa: E402
from decoding.runtime.models import load_model  # noqa: E402
from decoding.runtime.pair import ModelPair  # noqa: E402
from decoding.strategies import get_strategy  # noqa: E402


def main() -> None:
    argparse.ArgumentParser(description="the suffix defaults' deterministic sweep (no options)").parse_args()
    torch.set_num_threads(1)
    P = yaml.safe_load(open(Path(__file__).resolve().parents[1] / "presets" / "prompts.yaml"))
    prompts = [P["code"][i] for i in (2, 4, 7)] + [P["summarization"][i] for i in (0, 1, 2)]
    lm = load_model("smollm2-135m-instruct")
    pair = ModelPair(lm)
    ids = [encode_prompt(lm.tokenizer, p, chat=True) for p in prompts]
    g = get_strategy("greedy")
    ref = [g.generate(i, pair, g.parse({}), max_new_tokens=64).token_ids for i in ids]
    configs = [("prompt_lookup", {}), ("prompt_lookup", {"max_candidates": 4})] + [
        ("suffix", dict(spec_factor=f, spec_offset=o, min_token_prob=m, tree_nodes=t))
        for f, o, m, t in [(1, 0, .1, 12), (2, 0, .1, 12), (4, 0, .1, 12), (1, 2, .1, 12), (2, 2, .1, 12),
                           (2, 2, 0.0, 12), (2, 2, .1, 24), (4, 4, .1, 24), (1, 4, .1, 16), (2, 1, .05, 16)]]
    for kind, kw in configs:
        s = get_strategy(kind)
        tpf, nodes = [], []
        for i, r in zip(ids, ref):
            res = s.generate(i, pair, s.parse(kw), max_new_tokens=64)
            assert res.token_ids == r, (kind, kw)
            tpf.append(len(r) / res.target_forwards)
            nodes.append(res.stats.get("drafted_nodes", 0) / res.target_forwards)
        print(kind, kw, "tpf mean %.3f" % statistics.mean(tpf), [round(x, 2) for x in tpf],
              "nodes/fwd %.1f" % statistics.mean(nodes), flush=True)


if __name__ == "__main__":
    main()
