"""Is the prophet head calibrated? Its path probabilities against how often the target accepts those nodes.

    python benchmarks/prophet_calibration.py [--prompts presets/prompts.yaml] [--max-new-tokens 64]
        [--json benchmarks/results/prophet-calibration.json]

The tree keeps the nodes with the highest path probability (the product of the head's confidences along
the path), so the tree is only as good as those numbers. This runs the prophet (defaults, without the
copy branch, whose nodes carry no head probability) on every prompt of ``--prompts`` and, from the
run's own ``DraftTree`` events, compares:

* each verified node's path probability with whether it was on the accepted path (by tenths);
* the same by depth;
* each node's own confidence with whether it was accepted, among nodes whose parent was accepted (the
  conditional calibration the next depth depends on).

Deterministic (greedy); the CPU is named only for the record. Use prompts the benchmark headline does not
(the default is the template prompts), so that any correction fitted here is not fitted on the headline.
"""

from __future__ import annotations

import argparse
import collections

import torch

from common import write_json  # first: it puts the repository root on sys.path

from decoding.harness.bench import load_prompt_set
from decoding.harness.runner import encode_prompt, run_one
from decoding.runtime.head import prophet_for
from decoding.runtime.kernel_choice import cpu_label
from decoding.runtime.models import PRESETS_DIR, load_model
from decoding.runtime.pair import ModelPair
from decoding.strategies import get_strategy


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", default=str(PRESETS_DIR / "prompts.yaml"))
    p.add_argument("--target", default="smollm2-135m-instruct")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def tally(events: list, tables: dict) -> None:
    """Add every verified node of every ``DraftTree`` in ``events`` to ``tables`` ([n, sum predicted, accepted])."""
    for e in events:
        if type(e).__name__ != "DraftTree":
            continue
        accepted, path, depth = set(e.accepted), [], []
        for i, parent in enumerate(e.parents):
            path.append(e.q[i] * (path[parent] if parent >= 0 else 1.0))
            depth.append(1 + (depth[parent] if parent >= 0 else 0))
            hit = int(i in accepted)
            for name, key, p in (("path", min(9, int(path[i] * 10)), path[i]), ("depth", depth[i], path[i])):
                row = tables[name][key]
                row[0], row[1], row[2] = row[0] + 1, row[1] + p, row[2] + hit
            if parent < 0 or parent in accepted:
                row = tables["own_given_parent"][min(9, int(e.q[i] * 10))]
                row[0], row[1], row[2] = row[0] + 1, row[1] + e.q[i], row[2] + hit


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    lm = load_model(args.target)
    pair, prophet = ModelPair(lm, None, prophet=prophet_for(lm)), get_strategy("prophet")
    params = prophet.parse({"lookup": False})
    tables: dict = {k: collections.defaultdict(lambda: [0, 0.0, 0]) for k in ("path", "depth", "own_given_parent")}
    prompts = load_prompt_set(args.prompts)
    for _, text in prompts:
        _, _, events = run_one(prophet, params, encode_prompt(lm.tokenizer, text, chat=True), pair,
                               max_new_tokens=args.max_new_tokens)
        tally(events, tables)
    out = {}
    print(f"CPU: {cpu_label()}; {args.target}, {len(prompts)} prompts of {args.prompts}, "
          f"{args.max_new_tokens} new tokens, prophet defaults without the lookup branch")
    titles = {"path": "path probability (tenths)", "depth": "depth",
              "own_given_parent": "own confidence, parent accepted (tenths)"}
    for name, table in tables.items():
        print(f"\n| {titles[name]} | nodes | mean predicted | accepted |\n|---|---:|---:|---:|")
        out[name] = []
        for key in sorted(table):
            n, s, a = table[key]
            out[name].append({"key": key, "nodes": n, "predicted": round(s / n, 4), "accepted": round(a / n, 4)})
            print(f"| {key / 10 if name != 'depth' else key} | {n} | {s / n:.3f} | {a / n:.3f} |")
    doc = {"cpu": cpu_label(), "target": args.target, "prompts": args.prompts, "tables": out}
    write_json(args.json, doc)
    return doc


if __name__ == "__main__":
    main()
