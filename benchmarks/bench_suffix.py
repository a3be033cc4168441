"""Suffix decoding against prompt lookup (one run), and its history over a multi-turn session (one run).

    python benchmarks/bench_suffix.py grounded [--repeats 3] [--max-new-tokens 64] [--json OUT]
    python benchmarks/bench_suffix.py grounded-history [--repeats 3] [--max-new-tokens 64] [--json OUT]
    python benchmarks/bench_suffix.py multiturn [--repeats 3] [--max-new-tokens 96] [--json OUT]

``grounded``: the input-grounded prompts (three code edits, three summaries) through
``decoding.harness.bench.run_bench``: greedy, suffix decoding, our prompt lookup (chain, and
multi-candidate), transformers' ``generate`` greedy and prompt lookup, interleaved after a
warm-up, median over repeats. Prints the usual table, then per prompt suffix / prompt lookup
(tok/s) and its median over prompts (issue 16's goal: >= 1.2), and suffix / ``generate``'s
prompt lookup.

``grounded-history``: the same six prompts, served by one process one after another, as the
CLI and the benchmarks keep the suffix history (issue 16: "it covers the requests of one
process"). Each prompt's *warm* suffix run drafts also from the outputs of the **other** five
prompts (leave-one-out: the process has served them; its own output is never in its history,
so no request copies itself). Greedy, our prompt lookup, ``generate``'s prompt lookup, suffix
cold (no history) and suffix warm, interleaved per prompt after a warm-up, median over repeats.
Prints per prompt warm / our prompt lookup, cold / our prompt lookup, warm / ``generate``'s.

``multiturn``: the sessions of ``presets/multiturn.yaml`` (one document asked about four
times, one function edited four times), every turn a separate request. One process-wide
``SuffixHistory`` (as the CLI keeps) is cleared at the start of each repeat, then the turns run
in order: greedy, prompt lookup, suffix *cold* (no history) and suffix *warm* (the history of
the turns before, its own output added afterwards), interleaved per turn. Prints per turn the
speedups against greedy, warm / cold, tokens per target forward and the accepted tokens the
history supplied; every method's tokens are compared with greedy's.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import yaml

from common import ROOT, median, timed, write_json  # first: it puts the repository root on sys.path

from decoding.context import RunContext
from decoding.drafting.suffix import SuffixHistory
from decoding.harness import bench
from decoding.harness.runner import encode_prompt, environment
from decoding.runtime.models import load_model
from decoding.runtime.pair import ModelPair
from decoding.strategies import get_strategy
from decoding.tracer import NULL_TRACER

GROUNDED = ["code:2,4,7", "summarization:0,1,2"]


def grounded(pair: ModelPair, args: argparse.Namespace) -> dict:
    def method(name: str, strategy: str, **values) -> bench.Method:
        return bench.Method(name, strategy, get_strategy(strategy).parse(values), lossless=True)
    methods = [method("suffix", "suffix"), method("prompt_lookup", "prompt_lookup"),
               method("prompt_lookup[max_candidates=4]", "prompt_lookup", max_candidates=4),
               method("suffix[tree=false]", "suffix", tree=False),
               bench.Method("hf_greedy", None, anchor="hf_greedy"),
               bench.Method("hf_prompt_lookup", None, anchor="hf_prompt_lookup")]
    variants = []
    for spec in args.suffix_variant:                  # e.g. "edit_tokens=0" or "edit_tokens=8,tree_nodes=16"
        values = dict(item.split("=", 1) for item in spec.split(","))
        variants.append(f"suffix[{spec}]")
        methods.append(bench.Method(variants[-1], "suffix", get_strategy("suffix").parse(values), lossless=True))
    prompts = bench.load_prompt_set(categories=GROUNDED)[:args.turns or None]
    doc = bench.run_bench(pair, prompts, methods, max_new_tokens=args.max_new_tokens, repeats=args.repeats)
    print(bench.markdown_table(doc["summary"], "all"))
    rate = {(r["prompt"], r["method"]): r["tok_s"] for r in doc["rows"]}
    columns = [(m, base) for m in ["suffix", *variants] for base in ("prompt_lookup", "hf_prompt_lookup")]
    ratios = {f"{m} / {base}": [] for m, base in columns}
    print("\n| prompt | " + " | ".join(ratios) + " |\n|---|" + "---|" * len(ratios))
    for _, text in prompts:
        key = text[:80]
        for m, base in columns:
            ratios[f"{m} / {base}"].append(rate[(key, m)] / rate[(key, base)])
        print(f"| {key[:40]!r} | " + " | ".join(f"{v[-1]:.3f}" for v in ratios.values()) + " |")
    doc["ratios"] = {k: {"per_prompt": v, "median": statistics.median(v)} for k, v in ratios.items()}
    for k, v in doc["ratios"].items():
        print(f"median over prompts, {k}: {v['median']:.3f}")
    return doc


def grounded_history(pair: ModelPair, args: argparse.Namespace) -> dict:
    strategies = {n: get_strategy(n) for n in ("greedy", "prompt_lookup", "suffix")}
    params = {n: s.parse({}) for n, s in strategies.items()}
    device = pair.target.device
    prompts = bench.load_prompt_set(categories=GROUNDED)[:args.turns or None]
    ids = [encode_prompt(pair.target.tokenizer, text, chat=pair.target.chat) for _, text in prompts]

    def run(name: str, i: int, history: SuffixHistory | None):
        if name == "hf_prompt_lookup":
            return bench.hf_generate(pair.target, ids[i], args.max_new_tokens, prompt_lookup_num_tokens=10)   # as run_bench
        strategy = "suffix" if name.startswith("suffix") else name
        chosen = params[name] if name in params else params[strategy]
        return strategies[strategy].generate(ids[i], pair, chosen, max_new_tokens=args.max_new_tokens,
                                             tracer=NULL_TRACER,
                                             context=RunContext(history=history) if history else None)
    extra = [f"suffix_warm[history_min_match={v}]" for v in args.compare_min_match]
    for name, v in zip(extra, args.compare_min_match):
        params[name] = strategies["suffix"].parse({"history_min_match": v})
    reference = [run("greedy", i, None).token_ids for i in range(len(ids))]

    def others(i: int) -> SuffixHistory:
        """The history of a process that served every other prompt (its greedy output) before this one."""
        h = SuffixHistory()
        for j, out in enumerate(reference):
            if j != i:
                h.add(out)
        return h
    methods = ("greedy", "prompt_lookup", "hf_prompt_lookup", "suffix_cold", "suffix_warm", *extra)
    warm = [m for m in methods if m.startswith("suffix_warm")]
    for m in methods:                                   # warm-up, untimed
        run(m, 0, others(0) if m in warm else None)
    times: dict[tuple, list[float]] = {}
    outputs: dict[tuple, object] = {}
    for _ in range(args.repeats):
        for i in range(len(ids)):
            for m in methods:
                hist = others(i) if m in warm else None
                res, secs = timed(lambda: run(m, i, hist), device)
                times.setdefault((i, m), []).append(secs)
                outputs[(i, m)] = res
    rows = []
    print("| prompt | warm / our PL | cold / our PL | warm / generate's PL | tokens / forward: PL, cold, warm "
          "| accepted from history | = greedy |\n|---|---|---|---|---|---|---|")
    for i, (_, text) in enumerate(prompts):
        n = len(reference[i])
        rate = {m: n / median(times[(i, m)]) for m in methods}
        tpf = {m: n / outputs[(i, m)].target_forwards for m in ("prompt_lookup", "suffix_cold", *warm)}
        same = all((outputs[(i, m)] if m == "hf_prompt_lookup" else outputs[(i, m)].token_ids) == reference[i]
                   for m in methods)
        row = {"prompt": text[:80], "tokens": n, "tok_s": rate, "tokens_per_target_forward": tpf,
               **{f"{m}_over_pl": rate[m] / rate["prompt_lookup"] for m in extra},
               "drafted_nodes_per_forward": {m: outputs[(i, m)].stats.get("drafted_nodes", 0)
                                             / outputs[(i, m)].target_forwards for m in warm + ["suffix_cold"]},
               "warm_over_pl": rate["suffix_warm"] / rate["prompt_lookup"],
               "cold_over_pl": rate["suffix_cold"] / rate["prompt_lookup"],
               "warm_over_hf_pl": rate["suffix_warm"] / rate["hf_prompt_lookup"],
               "speedup_vs_greedy": {m: rate[m] / rate["greedy"] for m in methods},
               "from_history": outputs[(i, "suffix_warm")].stats.get("accepted_from", {}).get("history", 0),
               "identical_to_greedy": same}
        rows.append(row)
        print(f"| {text[:40]!r} | {row['warm_over_pl']:.3f} | {row['cold_over_pl']:.3f} | "
              f"{row['warm_over_hf_pl']:.3f} | {tpf['prompt_lookup']:.2f}, {tpf['suffix_cold']:.2f}, "
              f"{tpf['suffix_warm']:.2f} | {row['from_history']} | {'yes' if same else 'NO'} |")
        for m in extra:
            print(f"|   {m}: / our PL {row[m + '_over_pl']:.3f}, tokens / forward {tpf[m]:.2f}, drafted nodes / "
                  f"forward {row['drafted_nodes_per_forward'][m]:.1f} (warm default "
                  f"{row['drafted_nodes_per_forward']['suffix_warm']:.1f}) |")
    summary = {k: statistics.median(r[k] for r in rows)
               for k in ("warm_over_pl", "cold_over_pl", "warm_over_hf_pl", *(f"{m}_over_pl" for m in extra))}
    summary["speedup_vs_greedy_geomean"] = {m: bench.geomean([r["speedup_vs_greedy"][m] for r in rows])
                                            for m in methods}
    for k, v in summary.items():
        print(f"{k}: {v if isinstance(v, dict) else round(v, 3)}")
    return {"rows": rows, "summary": summary, "repeats": args.repeats, "max_new_tokens": args.max_new_tokens}


def sessions(path: Path) -> list[tuple[str, int, str]]:
    """[(session name, turn index, prompt text)] in order."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return [(s["name"], i, turn.replace("{text}", s["text"])) for s in data["sessions"]
            for i, turn in enumerate(s["turns"])]


def multiturn(pair: ModelPair, args: argparse.Namespace) -> dict:
    history = SuffixHistory()                       # process-wide, as the CLI keeps one
    strategies = {n: get_strategy(n) for n in ("greedy", "prompt_lookup", "suffix")}
    params = {n: s.parse({}) for n, s in strategies.items()}

    def run(name: str, ids: list[int], context: RunContext | None):
        strategy = "suffix" if name.startswith("suffix") else name
        return strategies[strategy].generate(ids, pair, params[strategy], max_new_tokens=args.max_new_tokens,
                                             tracer=NULL_TRACER, context=context)
    methods = {"greedy": None, "prompt_lookup": None, "suffix_cold": None, "suffix_warm": "warm"}
    turns = [(name, i, encode_prompt(pair.target.tokenizer, text, chat=pair.target.chat))
             for name, i, text in sessions(Path(args.sessions))][:args.turns or None]
    for m in methods:                               # 1. warm-up, untimed; then an empty history
        run(m, turns[0][2], RunContext(history=history) if methods[m] else None)
    times: dict[tuple, list[float]] = {}
    outputs: dict[tuple, object] = {}
    for _ in range(args.repeats):                   # 2. each repeat replays the sessions from scratch
        history.clear()
        for name, i, ids in turns:
            for m, warm in methods.items():
                res, secs = timed(lambda: run(m, ids, RunContext(history=history) if warm else None),
                                  pair.target.device)
                times.setdefault((name, i, m), []).append(secs)
                outputs[(name, i, m)] = res
    rows = []
    for name, i, _ in turns:
        ref = outputs[(name, i, "greedy")].token_ids
        base = len(ref) / median(times[(name, i, "greedy")])
        row = {"session": name, "turn": i, "tokens": len(ref)}
        for m in methods:
            res = outputs[(name, i, m)]
            row[m] = {"tok_s": len(res.token_ids) / median(times[(name, i, m)]),
                      "equals_greedy": res.token_ids == ref,
                      "tokens_per_target_forward": len(res.token_ids) / res.target_forwards,
                      "from_history": res.stats.get("accepted_from", {}).get("history", 0)}
            row[m]["speedup"] = row[m]["tok_s"] / base
        row["warm_over_cold"] = row["suffix_warm"]["tok_s"] / row["suffix_cold"]["tok_s"]
        rows.append(row)
    _print_turns(rows)
    later = [r["warm_over_cold"] for r in rows if r["turn"] > 0]
    return {"rows": rows, "warm_over_cold_geomean_later_turns": bench.geomean(later),
            "warm_over_cold_geomean_all": bench.geomean([r["warm_over_cold"] for r in rows])}


def _print_turns(rows: list[dict]) -> None:
    print("| session | turn | tokens | prompt lookup | suffix cold | suffix warm | warm / cold | tok/fwd cold → warm "
          "| accepted from history | = greedy |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        eq = all(r[m]["equals_greedy"] for m in ("prompt_lookup", "suffix_cold", "suffix_warm"))
        print(f"| {r['session']} | {r['turn'] + 1} | {r['tokens']} | {r['prompt_lookup']['speedup']:.2f}x "
              f"| {r['suffix_cold']['speedup']:.2f}x | {r['suffix_warm']['speedup']:.2f}x "
              f"| {r['warm_over_cold']:.3f} | {r['suffix_cold']['tokens_per_target_forward']:.2f} → "
              f"{r['suffix_warm']['tokens_per_target_forward']:.2f} | {r['suffix_warm']['from_history']} "
              f"| {'yes' if eq else 'NO'} |")
    later = [r["warm_over_cold"] for r in rows if r["turn"] > 0]
    print(f"warm / cold, geometric mean over turns 2+: {bench.geomean(later):.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("grounded", "grounded-history", "multiturn"))
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--sessions", default=str(ROOT / "presets" / "multiturn.yaml"))
    ap.add_argument("--compare-min-match", type=int, nargs="*", default=[],
                    help="grounded-history: also run suffix warm with these history_min_match values")
    ap.add_argument("--suffix-variant", nargs="*", default=[],
                    help="grounded: also run suffix with these parameters, e.g. edit_tokens=0 tree_nodes=16,edit_tokens=8")
    ap.add_argument("--turns", type=int, default=0, help="smoke test: only the first N prompts or turns (0: all)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    pair = ModelPair(load_model(args.target))
    doc = {"grounded": grounded, "grounded-history": grounded_history, "multiturn": multiturn}[args.mode](pair, args)
    doc["environment"] = environment(pair, 0)
    write_json(args.json, doc)


if __name__ == "__main__":
    main()
