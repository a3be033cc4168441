"""The batch race on the bundled model: 4 unseen prompts as one batch against the same 4 run one after another,
for greedy, speculative decoding and the prophet (issue 49, item 3).

    python benchmarks/bench_batch.py                        # batch 4, 48 new tokens, presets/bench_unseen.yaml
    python benchmarks/bench_batch.py --batch 8 --max-new-tokens 64 --json benchmarks/results/bench_batch.json

The rows: the unseen set's prompts taken one category at a time in turn (``harness.batch.batch_prompts``), so
they differ in kind and length. Speculative decoding drafts with the target's prophet head as a chain (the
bundled model has no smaller offline model with its tokenizer; that is the page's default assistant for it);
the prophet drafts its trees. Each strategy is warmed up, then its four single-row runs and its batch are timed
once (``harness.batch.race_batch``). Prints one line per strategy: throughput batched and one by one (all rows'
tokens over the wall time), their ratio, target forwards, rows equal to greedy and the steps each row waited.
The CPU is named in the output and the JSON. Wall times on a shared machine are noisy; the forwards and the
accepted lengths are not.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from decoding.harness.batch_race import batch_prompts, race_batch  # noqa: E402
from decoding.harness.bench import load_prompt_set  # noqa: E402
from decoding.harness.runner import encode_prompt  # noqa: E402
from decoding.runtime.head import prophet_for  # noqa: E402
from decoding.runtime.kernel_choice import cpu_label  # noqa: E402
from decoding.runtime.models import PRESETS_DIR, load_model  # noqa: E402
from decoding.runtime.pair import ModelPair  # noqa: E402
from decoding.strategies import get_strategy  # noqa: E402
from decoding.strategies.batched import check_batch  # noqa: E402

STRATEGIES = ("greedy", "speculative", "prophet")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=Path, default=PRESETS_DIR / "bench_unseen.yaml")
    p.add_argument("--batch", default="4")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--target", default="smollm2-135m-instruct")
    p.add_argument("--strategy", action="append", choices=STRATEGIES)
    p.add_argument("--json", type=Path, default=None)
    return p.parse_args(argv)


def table(entries: list[dict], cpu: str, threads: int) -> str:
    out = [f"CPU: {cpu}, {threads} torch threads", "",
           "| strategy | rows | tokens | one by one tok/s | batch tok/s | ratio | target forwards (batch / one by one) "
           "| rows = greedy | accepted = single-row | waited steps per row |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for e in entries:
        same = sum(r["accepted_lengths"] == r["single_accepted_lengths"] for r in e["rows"])
        waited = " ".join(str(r["waited_steps"]) for r in e["rows"])
        out.append(f"| {e['strategy']} | {e['batch']} | {e['tokens']} | {e['single_tokens_per_s']} | "
                   f"{e['batch_tokens_per_s']} | {e['throughput_ratio']} | {e['batch_forwards']} / "
                   f"{e['single_forwards']} | {e['rows_equal_greedy']}/{e['batch']} | {same}/{e['batch']} | {waited} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    batch = check_batch(args.batch)
    lm = load_model(args.target)
    pair = ModelPair(lm, prophet=prophet_for(lm))
    texts = batch_prompts(load_prompt_set(args.prompts)[0][1], batch, args.prompts)
    ids = [encode_prompt(lm.tokenizer, t, chat=True) for t in texts]
    names = args.strategy or list(STRATEGIES)
    entries = race_batch(ids, pair, [(n, get_strategy(n).parse({})) for n in names],
                         max_new_tokens=args.max_new_tokens,
                         progress=lambda msg: print(f"[bench_batch] {msg}", file=sys.stderr, flush=True))
    cpu = cpu_label()
    print(table(entries, cpu, args.threads))
    print("prompt tokens per row:", [len(i) for i in ids])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"cpu": cpu, "threads": args.threads, "prompts": texts,
                                         "max_new_tokens": args.max_new_tokens, "batch_race": entries}, indent=1))
    return 0 if all(e["rows_equal_greedy"] == e["batch"] for e in entries) else 1


if __name__ == "__main__":
    raise SystemExit(main())
