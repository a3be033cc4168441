"""Consistency-train a model for Jacobi decoding (CLLMs): ``python -m playground.train_consistency``.

Stages (each resumable; the data lives under the user cache dir, never in git):

1. ``prompts``  chat prompts the model writes itself (its template up to a user turn, sampled at
   several temperatures, filtered and deduplicated; ``training/selfprompts.py``) and template prompts
   (``train_prophet.build_prompts``). Whole sources (one seed's batch, one template seed) are held
   out; the benchmark prompts of ``presets/prompts.yaml`` never enter.
2. ``data``     the base model's greedy answers (the fixed points), then its Jacobi trajectories on
   blocks of ``--block`` tokens of them (pad and random init), every distinct state recorded
   (``training/trajectories.py``); shards ``<data-dir>/shard-XXXX.pt``, a held-out shard ``held.pt``.
3. ``train``    LoRA factors beside every linear layer (``training/lora.py``), trained on the AR loss
   on the fixed point plus the global consistency loss (every sampled state -> the fixed point; KL to
   the model's own distribution at the fixed point, or CE) and optionally the local one, all in one
   packed forward per step (``training/consistency.py``). Checkpoints to ``--out-dir`` (``--resume``
   continues); held-out measures as it goes (``training/evaluate.py``): teacher-forced state accuracy,
   and the default Jacobi's tokens per forward with greedy agreement with the base model.
4. ``export``   the adapter in fp16 safetensors (``--export``), merged into the model at load time by
   the preset's ``adapter:`` field (``runtime/adapter.py``).

The first run's commands and results (its adapter was not shipped) are in docs/consistency-training.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import time
from pathlib import Path
from typing import Any, Optional

import torch
import yaml

from decoding.runtime.models import PRESETS_DIR, cache_root, load_model
from playground.train_prophet import build_prompts, lr_factor
from playground.training import dataset
from playground.training.consistency import Weights, losses
from playground.training.evaluate import decode, teacher_forced
from playground.training.lora import add_lora, load_lora_state, lora_state, save_adapter
from playground.training.selfprompts import acceptable
from playground.training.stopping import Stop, stop_requested
from playground.training.trajectories import chat_ids, greedy_answers, record_trajectories


def default_dir(kind: str, target: str) -> Path:
    return cache_root().parent / kind / target.replace("/", "--")


def benchmark_prompts() -> frozenset:
    data = yaml.safe_load((PRESETS_DIR / "prompts.yaml").read_text(encoding="utf-8")) or {}
    return frozenset(t for items in data.values() for t in items or [] if isinstance(t, str))


def make_data(lm: Any, args: argparse.Namespace, data_dir: Path) -> None:
    temps = tuple(float(t) for t in args.temperatures.split(","))
    prompts = dataset.build_prompt_file(
        lm, data_dir, self_seeds=list(range(args.self_seeds)),
        held_seeds=list(range(1000, 1000 + args.held_seeds)), temperatures=temps, per_seed=args.per_seed,
        build=build_prompts, templates=args.templates, held_templates=args.held_templates,
        exclude=benchmark_prompts())
    train = dataset.interleave([p for p in prompts if p["split"] == "train"])
    held = dataset.interleave([p for p in prompts if p["split"] == "held"])
    print(f"prompts: {len(train)} for training, {len(held)} held out "
          f"({len({p['source'] for p in held})} held-out sources)")
    if args.write_heldout:
        write_heldout(held[args.held_records:], args.write_heldout, args.heldout_count)
    traj = dict(n=args.block, blocks_per_answer=args.blocks_per_answer, max_iters=args.max_iters,
                pad_share=args.pad_share)
    if not (data_dir / "held.pt").is_file():
        group = held[:args.held_records]
        ids = [chat_ids(lm.tokenizer, p["text"]) for p in group]
        items = [{"prompt": i, "answer": a, "source": p["source"], "text": p["text"]}
                 for i, a, p in zip(ids, greedy_answers(lm, ids, args.max_new), group)]
        records = []
        for k in range(0, len(items), args.pack_docs):
            records += record_trajectories(lm, items[k:k + args.pack_docs], rng=random.Random(k), **traj)
        torch.save(records, data_dir / "held.pt")
    dataset.generate_shards(lm, train, data_dir, shard_size=args.shard_size, max_new=args.max_new,
                            pack_docs=args.pack_docs, minutes=args.gen_minutes, seed=args.seed, **traj)


def write_heldout(held: list[dict], path: Path, count: int) -> None:
    """The benchmark's held-out prompts: ``count`` of the held-out sources' prompts, alternating kinds (the
    caller passes those after the ``--held-records`` that training measures itself on, so no checkpoint
    was picked on them)."""
    doc = {"about": "Held-out prompts of python -m playground.train_consistency: whole sources it never trained on "
                    "(self-written batches of held-out seeds, a held-out template seed), and not the ones "
                    "training measured itself on. benchmarks/bench_consistency.py runs on them.",
           "prompts": [{"text": p["text"], "source": p["source"]} for p in held
                       if acceptable(p["text"])][:count]}      # (a stricter filter than older data had)
    path.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=110), encoding="utf-8")
    print(f"wrote {path} ({min(count, len(held))} prompts)")


def evaluate(model: Any, tok: Any, held: list[dict], args: argparse.Namespace, weights: Weights,
             full: bool) -> dict:
    out = {"teacher_forced": teacher_forced(model, held[:args.eval_records], weights)}
    if full:
        out["decode"] = decode(model, tok, held[:args.eval_prompts], args.eval_tokens)
    return out


def train(model: Any, tok: Any, records: list[dict], held: list[dict], args: argparse.Namespace,
          ckpt: Optional[dict], stop: Optional[Stop] = None) -> list[dict]:
    """Steps until ``args.steps``, the time budget, or ``stop`` (``stopping.stop_requested``: SIGTERM), each of
    which ends with an evaluation and a checkpoint."""
    from tqdm import tqdm
    stop = stop if stop is not None else Stop()
    weights = Weights(ar=args.w_ar, consistency=args.w_consistency, local=args.w_local, kind=args.consistency,
                      trim=args.trim, rows=args.state_rows)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    start = ckpt["step"] if ckpt else 0
    log: list[dict] = ckpt["log"] if ckpt else []
    if ckpt:
        opt.load_state_dict(ckpt["optim"])
    rng = random.Random(args.seed + start)
    device = next(model.parameters()).device
    if args.bf16 is None:
        args.bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    print(f"training under {'bfloat16 autocast' if args.bf16 else str(next(model.parameters()).dtype)} on {device}")
    t_begin = time.time()
    deadline = t_begin + args.train_minutes * 60
    if not ckpt:
        log.append({"step": 0, **evaluate(model, tok, held, args, weights, full=args.eval_at_start)})
        print(json.dumps(log[-1]))
    model.train()
    bar = tqdm(range(start, args.steps), desc="consistency training", unit="step", initial=start, total=args.steps)
    step, ema = start, {}
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = args.lr * lr_factor(step, args.steps, (time.time() - t_begin) / (args.train_minutes * 60),
                                              start)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bool(args.bf16)):
            out = losses(model, rng.sample(records, args.batch), weights, args.states_per_block, rng)
        opt.zero_grad(set_to_none=True)
        out["loss"].backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        for k in ("ar", "consistency", "local", "state_acc", "hard_acc"):
            if k in out:
                ema[k] = out[k] if k not in ema else 0.95 * ema[k] + 0.05 * out[k]
        bar.set_postfix({k: f"{v:.3f}" for k, v in ema.items()})
        done = step + 1
        last = done == args.steps or time.time() > deadline or bool(stop)
        if done % args.eval_every == 0 or last:
            if args.reload:                 # shards written since (the data stage still running beside us)
                records = dataset.load_records(args.data_dir) or records
            full = done % (args.eval_every * args.decode_every) == 0 or last
            log.append({"step": done, "minutes": round((time.time() - t_begin) / 60, 1), "answers": len(records),
                        "train": dict(ema), **stop.record(),
                        **evaluate(model, tok, held, args, weights, full)})
            bar.write(json.dumps(log[-1]))
            torch.save({"step": done, "lora": lora_state(model), "optim": opt.state_dict(), "log": log,
                        "args": vars(args) | {"out_dir": str(args.out_dir), "data_dir": str(args.data_dir),
                                              "export": str(args.export)}},
                       args.out_dir / "checkpoint.pt")
            if full:
                torch.save(lora_state(model), args.out_dir / f"lora-{done:05d}.pt")
        if last:
            break
    return log


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m playground.train_consistency", description=__doc__.split("\n")[0])
    a = p.add_argument
    a("--target", default="smollm2-135m-instruct")
    a("--threads", type=int, default=2, help="torch CPU threads")
    a("--device", default=None, help="cpu, cuda or auto (default): where the data is made and the adapter trained")
    a("--dtype", default="float32", help="the model's dtype for the data and the training (default float32: the "
      "fixed points are the answers the float32 model gives on a CPU, where the preset runs)")
    a("--data-dir", type=Path, default=None, help="default: user cache dir/consistency-data/<target>")
    a("--out-dir", type=Path, default=None, help="default: user cache dir/consistency-runs/<target>")
    a("--resume", action="store_true", help="continue from --out-dir/checkpoint.pt")
    a("--export", type=Path, default=None, help="write the shipped fp16 adapter here")
    a("--export-from", type=Path, default=None, help="export these saved factors (lora-XXXXX.pt, or a "
      "checkpoint.pt) instead of training")
    a("--skip-data", action="store_true", help="train on the shards that exist")
    a("--reload", action="store_true", help="read the shards again at every evaluation (train while a "
      "--data-only run is still making them)")
    a("--data-only", action="store_true", help="make the data, then stop")
    # 1. prompts
    a("--self-seeds", type=int, default=48, help="training batches of self-written prompts (one seed each)")
    a("--held-seeds", type=int, default=3, help="held-out batches of self-written prompts")
    a("--per-seed", type=int, default=32)
    a("--temperatures", default="0.7,0.9,1.1", help="seed s samples at the (s mod count)-th")
    a("--templates", type=int, default=1200, help="template prompts for training (one source)")
    a("--held-templates", type=int, default=48, help="template prompts held out (another seed)")
    # 2. data
    a("--max-new", type=int, default=96)
    a("--block", type=int, default=16, help="Jacobi block size of the recorded trajectories")
    a("--blocks-per-answer", type=int, default=2)
    a("--max-iters", type=int, default=16, help="iterations recorded per trajectory")
    a("--pad-share", type=float, default=0.5, help="share of the blocks started from pad tokens (the default "
      "Jacobi's init); the rest start from random tokens")
    a("--shard-size", type=int, default=32)
    a("--pack-docs", type=int, default=8, help="answers whose trajectories share one forward")
    a("--held-records", type=int, default=48)
    a("--write-heldout", type=Path, default=None, help="write the first --heldout-count held-out prompts here (YAML)")
    a("--heldout-count", type=int, default=24)
    a("--gen-minutes", type=float, default=60.0)
    # 3. train
    a("--rank", type=int, default=16)
    a("--alpha", type=float, default=32.0)
    a("--lr", type=float, default=1e-3)
    a("--steps", type=int, default=2000)
    a("--train-minutes", type=float, default=180.0)
    a("--batch", type=int, default=4, help="answers per step")
    a("--states-per-block", type=int, default=2)
    a("--consistency", choices=("kl", "ce"), default="kl", help="global loss: KL to the fixed point's distribution "
      "(the paper) or cross-entropy to its token")
    a("--trim", action="store_true", help="feed a sampled state from its first token that is not the fixed "
      "point's (the same rows but for ones that repeat AR rows: less compute per state)")
    a("--state-rows", type=int, default=0, help="with --trim: train only this many predictions of a state "
      "after its first wrong token (0: all)")
    a("--w-ar", type=float, default=1.0)
    a("--w-consistency", type=float, default=1.0)
    a("--w-local", type=float, default=0.0)
    a("--bf16", action=argparse.BooleanOptionalAction, default=None, help="train under bfloat16 autocast "
      "(default: on a GPU with native bfloat16, off on the CPU); the data and the evaluations stay in --dtype")
    a("--eval-every", type=int, default=50, help="teacher-forced held-out measures every this many steps")
    a("--decode-every", type=int, default=2, help="... and decoding ones every this many of those")
    a("--eval-records", type=int, default=24)
    a("--eval-prompts", type=int, default=12)
    a("--eval-tokens", type=int, default=64)
    a("--eval-at-start", action=argparse.BooleanOptionalAction, default=True)
    a("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    args.data_dir = args.data_dir or default_dir("consistency-data", args.target)
    args.out_dir = args.out_dir or default_dir("consistency-runs", args.target)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if not args.skip_data and not args.export_from:
        make_data(load_model(args.target, device=args.device, dtype=args.dtype), args, args.data_dir)
    if args.data_only:
        return {}
    base = load_model(args.target, kernels="default", device=args.device, dtype=args.dtype)   # plain linears, to wrap
    model = copy.deepcopy(base.model).float()
    add_lora(model, args.rank, args.alpha)
    ckpt_path = args.out_dir / "checkpoint.pt"
    ckpt = torch.load(ckpt_path, weights_only=False) if args.resume and ckpt_path.is_file() else None
    if ckpt:
        load_lora_state(model, ckpt["lora"])
    summary: dict = {"target": args.target, "rank": args.rank, "alpha": args.alpha}
    if args.export_from:                   # saved factors (lora-XXXXX.pt) or a checkpoint (checkpoint.pt)
        saved = torch.load(args.export_from, weights_only=False)
        load_lora_state(model, saved["lora"] if "lora" in saved and "optim" in saved else saved)
        summary["steps_done"] = saved["step"] if "optim" in saved else int(
            "".join(c for c in args.export_from.stem if c.isdigit()) or 0)
        return finish(model, summary, args)
    records = dataset.load_records(args.data_dir)
    held = [r for r in torch.load(args.data_dir / "held.pt") if r["blocks"]]
    states = sum(len(b["states"]) for r in records for b in r["blocks"])
    print(f"data: {len(records)} answers / {states} states for training, {len(held)} held out ({args.data_dir})")
    if len(records) < args.batch or not held:
        raise SystemExit(f"not enough data in {args.data_dir}; run without --skip-data")
    # a timeout's SIGTERM ends training as its time budget would, and the export and summary still follow
    with stop_requested() as stop:
        log = train(model, base.tokenizer, records, held, args, ckpt, stop)
        summary |= {"train_answers": len(records), "train_states": states, "held_answers": len(held),
                    "steps_done": log[-1]["step"], "last": log[-1], **stop.record()}
        return finish(model, summary, args)


def finish(model: Any, summary: dict, args: argparse.Namespace) -> dict:
    """The adapter exported (``--export``) and the run's ``summary.json``."""
    if args.export:
        save_adapter(model, args.export, {"base": args.target, "rank": args.rank,
                                          "steps": summary.get("steps_done", args.export_from)})
        print(f"wrote {args.export} ({args.export.stat().st_size / 1e6:.1f} MB)")
    (args.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
