"""The consistency-training data set on disk: prompts with their sources, then shards of trajectories.

Everything lives under ``<data dir>`` (the user cache dir by default, never in git) and every stage
resumes where it stopped:

* ``prompts.jsonl``: one prompt a line, ``{"text", "source", "split"}``, appended source by source
  (self-written prompts, one seed at a time, then the template sources); a rerun skips the sources
  already written. ``split`` is ``train`` or ``held``: whole sources are held out.
* ``shard-XXXX.pt``: the records of ``trajectories.record_trajectories`` for the ``train`` prompts in
  order, ``shard_size`` per shard; a rerun continues after the last shard.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import torch

from playground.training.selfprompts import Prompt, dedup_key, self_prompts, template_prompts
from playground.training.trajectories import chat_ids, greedy_answers, record_trajectories


def read_prompts(data_dir: Path) -> list[dict]:
    path = data_dir / "prompts.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _append(data_dir: Path, prompts: Iterable[Prompt], split: str) -> None:
    with open(data_dir / "prompts.jsonl", "a", encoding="utf-8") as fh:
        for p in prompts:
            fh.write(json.dumps({"text": p.text, "source": p.source, "split": split}) + "\n")


def build_prompt_file(lm: Any, data_dir: Path, *, self_seeds: list[int], held_seeds: list[int],
                      temperatures: tuple[float, ...], per_seed: int, build: Callable, templates: int,
                      held_templates: int, exclude: frozenset) -> list[dict]:
    """Self-written prompts seed by seed (train seeds, then held-out seeds), then template sources."""
    from tqdm import tqdm
    data_dir.mkdir(parents=True, exist_ok=True)
    done = {p["source"].rsplit(":", 1)[-1] for p in read_prompts(data_dir) if p["source"].startswith("self:")}
    seen = {dedup_key(p["text"]) for p in read_prompts(data_dir)} | {dedup_key(t) for t in exclude}
    todo = [(s, "train") for s in self_seeds] + [(s, "held") for s in held_seeds]
    todo = [(s, split) for s, split in todo if f"s{s}" not in done]
    for seed, split in tqdm(todo, desc="self-written prompts", unit="seed"):
        _append(data_dir, self_prompts(lm, [seed], temperatures, per_seed, seen), split)
    have = {p["source"] for p in read_prompts(data_dir)}
    if "template:s1" not in have and templates:
        _append(data_dir, template_prompts(build, templates, 1, seen, exclude), "train")
    if "template:s2" not in have and held_templates:
        train_texts = frozenset(p["text"] for p in read_prompts(data_dir))
        _append(data_dir, template_prompts(build, held_templates, 2, seen, exclude | train_texts), "held")
    return read_prompts(data_dir)


def interleave(prompts: list[dict]) -> list[dict]:
    """Self-written and template prompts alternating, so any prefix of the shards holds both."""
    own = [p for p in prompts if p["source"].startswith("self:")]
    tpl = [p for p in prompts if not p["source"].startswith("self:")]
    out = []
    for i in range(max(len(own), len(tpl))):
        out += own[i:i + 1] + tpl[i:i + 1]
    return out


def shards(data_dir: Path) -> list[Path]:
    return sorted(data_dir.glob("shard-*.pt"))


def generate_shards(lm: Any, prompts: list[dict], data_dir: Path, *, shard_size: int, max_new: int, n: int,
                    blocks_per_answer: int, max_iters: int, pack_docs: int, minutes: float, seed: int,
                    pad_share: float = 0.5) -> None:
    """Greedy answers and Jacobi trajectories for ``prompts`` (in order), one shard per ``shard_size``."""
    from tqdm import tqdm
    groups = [prompts[i:i + shard_size] for i in range(0, len(prompts), shard_size)]
    done = len(shards(data_dir))
    deadline = time.time() + minutes * 60
    bar = tqdm(groups[done:], desc="answers + trajectories", unit="shard")
    for index, group in enumerate(bar, start=done):
        if time.time() > deadline:
            bar.write(f"data time budget of {minutes} min reached after {index} shards")
            break
        ids = [chat_ids(lm.tokenizer, p["text"]) for p in group]
        answers = greedy_answers(lm, ids, max_new)
        items = [{"prompt": i, "answer": a, "source": p["source"], "text": p["text"]}
                 for i, a, p in zip(ids, answers, group) if len(a) >= 3]
        rng = random.Random(seed * 100003 + index)
        records = []
        for k in range(0, len(items), pack_docs):
            records += record_trajectories(lm, items[k:k + pack_docs], n=n, blocks_per_answer=blocks_per_answer,
                                           max_iters=max_iters, rng=rng, pad_share=pad_share)
        tmp = data_dir / f"shard-{index:04d}.pt.tmp"
        torch.save(records, tmp)
        tmp.replace(data_dir / f"shard-{index:04d}.pt")          # whole shards only, for a reader beside us
        bar.set_postfix(states=sum(len(b["states"]) for r in records for b in r["blocks"]))


def load_records(data_dir: Path, limit: Optional[int] = None) -> list[dict]:
    """Every record with a block, from the first ``limit`` shards; a shard still being written is skipped."""
    out = []
    for f in shards(data_dir)[:limit]:
        try:
            out += [r for r in torch.load(f) if r["blocks"]]
        except (RuntimeError, EOFError, OSError):
            continue
    return out
