"""The prophet head's mixed data: prompts from ``magpie.py``, the target's own greedy answers, on the CPU.

Work is cut into numbered *units*; a unit is one batch from one source (``SCHEDULE``): prompts
made (sampled, filtered, deduplicated against every prompt kept so far), then answered by the
target greedily (chat template, left padding, up to ``max_new`` tokens) with the target's
last-layer state at every answer position, as ``train_prophet.generate_data`` records them. Each
unit is saved as ``<data-dir>/u00042-<source>.pt``, so a rerun skips finished units (resumable),
and ``--workers N --worker I`` processes share one folder without sharing a unit.

Units 0..len(HELD)-1 come from held-out sources: never trained on, they give the held-out
evaluation and the unseen benchmark's self-generated prompts (``benchmarks/bench_unseen.py``).
"""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from playground.training.magpie import (CODE_TASKS, HELD_SEEDS, SEEDS, TEXT_TASKS, Deduper, Source,
                                      grounded_prompts, held_origin, keep_new, sample_user_turns,
                                      split_by_source, stdlib_pieces, user_prefix)

HELD = (
    Source("magpie-t0.9-held", "magpie", 0.9, held_out=True),
    Source("seeded-held", "seeded", 0.9, HELD_SEEDS, held_out=True),
    Source("grounded-code-held", "grounded", seeds=("code",), held_out=True),
    Source("grounded-text-held", "grounded", seeds=("text",), held_out=True),
    Source("followup-held", "followup", 0.9, held_out=True),
)
SCHEDULE = (
    Source("magpie-t0.7", "magpie", 0.7), Source("magpie-t1.0", "magpie", 1.0),
    Source("seeded-code", "seeded", 0.8, SEEDS["code"]), Source("grounded-code", "grounded", seeds=("code",)),
    Source("magpie-t1.2", "magpie", 1.2), Source("seeded-math", "seeded", 0.8, SEEDS["math"]),
    Source("followup", "followup", 1.0), Source("grounded-text", "grounded", seeds=("text",)),
    Source("seeded-translate", "seeded", 0.8, SEEDS["translate"]), Source("seeded-write", "seeded", 0.9,
                                                                          SEEDS["write"]),
    Source("seeded-ask", "seeded", 0.9, SEEDS["ask"]), Source("template", "template"),
)
HELD_NAMES = frozenset(s.name for s in HELD)


def source_of(unit: int) -> Source:
    return HELD[unit] if unit < len(HELD) else SCHEDULE[(unit - len(HELD)) % len(SCHEDULE)]


LAYERS_DIR = "layers"   # per unit, the intermediate-layer states of its records (when stored), same file name


def layered_unit(unit: int, every: int) -> bool:
    """Whether a unit keeps intermediate-layer states: every held-out unit, and one training unit in
    ``every``, rotating through the schedule's sources round by round so each source is represented."""
    if unit < len(HELD):
        return True
    rnd, pos = divmod(unit - len(HELD), len(SCHEDULE))
    return (pos + rnd) % max(1, every) == 0


def unit_files(data_dir: Path) -> list[Path]:
    return sorted(Path(data_dir).glob("u*-*.pt"))


def load_units(data_dir: Path, layers: bool = False) -> list[dict]:
    """Every record of every finished unit, in unit order (each carries its ``source`` and ``prompt``).

    ``layers``: attach each record's intermediate-layer states (``r["layers"] [T, k, H]``) where its unit
    stored them (``generate_mix(store_layers=...)``); records of units without them carry none."""
    out = []
    for f in unit_files(data_dir):
        records = torch.load(f)
        extra = Path(data_dir) / LAYERS_DIR / f.name
        if layers and extra.is_file():
            for r, lay in zip(records, torch.load(extra)):
                r["layers"] = lay
        out += [r for r in records if len(r["tokens"]) >= 1]
    return out


# --------------------------------------------------------------------------- answers

class _States:
    """Forward hooks that keep, from every forward of a ``generate`` call, the newest position's state at
    the output of the final norm (the last entry of ``output_hidden_states``) and of chosen decoder layers.

    ``layers``: indices into the hidden-state tuple (``i`` = the output of decoder layer ``i``, 1-based;
    the last layer's is the final norm's input, so it is not offered). Unlike ``output_hidden_states``,
    which keeps every layer at every prompt position, this keeps ``len(layers) + 1`` rows per forward.
    """

    def __init__(self, model: Any, layers: Sequence[int]) -> None:
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        blocks = list(decoder.layers)
        bad = [i for i in layers if not 1 <= i < len(blocks)]
        if bad:
            raise ValueError(f"layer indices {bad} are outside 1..{len(blocks) - 1} for this model")
        self.rows: dict[int, list[torch.Tensor]] = {-1: [], **{i: [] for i in layers}}
        self.handles = [decoder.norm.register_forward_hook(self._keep(-1))]
        self.handles += [blocks[i - 1].register_forward_hook(self._keep(i)) for i in layers]

    def _keep(self, key: int) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:
            h = output[0] if isinstance(output, tuple) else output
            self.rows[key].append(h[:, -1:].detach())
        return hook

    def stacked(self, key: int, steps: int) -> torch.Tensor:
        """``[B, steps, H]``: the state before each of the ``steps`` generated tokens."""
        return torch.cat(self.rows[key][:steps], dim=1)

    def close(self) -> None:
        for h in self.handles:
            h.remove()


@torch.inference_mode()
def answer(lm: Any, conversations: Sequence[list[dict]], max_new: int,
           layers: Sequence[int] = ()) -> list[dict]:
    """The target's greedy answer to each conversation, with the last-layer state before every answer token.

    ``hidden[i]`` is the state at the position that predicted ``tokens[i]`` (so the target's LM head
    maps it to ``tokens[i]``), as ``train_prophet.generate_data`` records. ``layers``: indices into the
    model's hidden-state tuple (``i`` = output of decoder layer ``i``) whose states at the same
    positions are kept too, as ``r["layers"] [T, len(layers), H]`` in bfloat16 (an intermediate
    residual stream may exceed float16's range). States are taken by forward hooks (``_States``).
    """
    tok = lm.tokenizer
    side, tok.padding_side = tok.padding_side, "left"
    enc = tok.apply_chat_template(list(conversations), add_generation_prompt=True, return_tensors="pt",
                                  padding=True, return_dict=True).to(lm.device)
    tok.padding_side = side
    states = _States(lm.model, layers)
    try:
        seq = lm.model.generate(**enc, max_new_tokens=max_new, do_sample=False, pad_token_id=tok.pad_token_id)
    finally:
        states.close()
    new = seq[:, enc["input_ids"].shape[1]:]                                        # [B, T]
    T = new.shape[1]
    hid = states.stacked(-1, T)                                                     # [B, T, H]
    lay = torch.stack([states.stacked(i, T) for i in layers], dim=2).to(torch.bfloat16) if layers else None
    eos = set(lm.eos_token_ids)
    out = []
    for b, conv in enumerate(conversations):
        ids = new[b].tolist()
        stop = next((i + 1 for i, t in enumerate(ids) if t in eos), len(ids))
        out.append({"tokens": new[b, :stop].cpu().clone(), "hidden": hid[b, :stop].to(torch.float16).cpu().clone(),
                    "conversation": conv, "answer": tok.decode(ids[:stop], skip_special_tokens=True).strip()})
        if lay is not None:
            out[-1]["layers"] = lay[b, :stop].cpu().clone()
    return out


# --------------------------------------------------------------------------- prompts per unit

class Pools:
    """What units draw from: the standard library's pieces (split by module), earlier answered prompts."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        self._stdlib: Optional[dict] = None
        self._texts: dict[Path, list[dict]] = {}     # unit file -> its records' text fields

    def stdlib(self, kind: str, held: bool) -> list[str]:
        if self._stdlib is None:
            self._stdlib = stdlib_pieces()
        return [p for mod, parts in self._stdlib.items() if held_origin(mod) == held for p in parts[kind]]

    def answered(self, held: bool) -> list[dict]:
        """Single-turn conversations already answered in sources of the same side (held or not)."""
        for f in unit_files(self.data_dir):
            if f not in self._texts:
                self._texts[f] = [{k: r[k] for k in ("source", "conversation", "answer")} for r in torch.load(f)]
        return [r for rs in self._texts.values() for r in rs
                if (r["source"] in HELD_NAMES) == held and len(r["conversation"]) == 1 and r["answer"]]


def unit_conversations(lm: Any, source: Source, unit: int, batch: int, dedupe: Deduper, pools: Pools,
                       templates: Callable[[int, int], list[str]]) -> tuple[list[list[dict]], dict]:
    """The conversations (message lists ending in a user turn) of one unit, and the drop counts."""
    rng = random.Random(1_000_003 * unit + 17)
    tok = lm.tokenizer
    if source.kind in ("magpie", "seeded"):
        seeds = [rng.choice(source.seeds) if source.seeds else "" for _ in range(batch)]
        prefix = user_prefix(tok)
        raw = sample_user_turns(lm, [prefix + s for s in seeds], temperature=source.temperature, seed=unit)
        texts = [None if t is None else (s + t).strip() for s, t in zip(seeds, raw)]
        kept, dropped = keep_new(texts, dedupe)
        return [[{"role": "user", "content": t}] for t in kept], dropped
    if source.kind == "followup":
        pool = pools.answered(source.held_out)
        if not pool:
            return [], {"no conversations yet": 1}
        picked = [rng.choice(pool) for _ in range(batch)]
        history = [r["conversation"] + [{"role": "assistant", "content": r["answer"]}] for r in picked]
        raw = sample_user_turns(lm, [user_prefix(tok, h) for h in history], temperature=source.temperature,
                                seed=unit)
        texts = [None if t is None else t.strip() for t in raw]
        convs, dropped = [], {}
        for h, t in zip(history, texts):
            kept, why = keep_new([t], dedupe)
            for k, v in why.items():
                dropped[k] = dropped.get(k, 0) + v
            if kept:
                convs.append(h + [{"role": "user", "content": kept[0]}])
        return convs, dropped
    if source.kind == "grounded":
        kind = source.seeds[0]
        pieces = pools.stdlib(kind, source.held_out)
        if kind == "text":   # half over the target's own earlier answers of the same side
            pieces = pieces + [r["answer"] for r in pools.answered(source.held_out) if len(r["answer"]) > 200]
        texts = grounded_prompts(pieces, CODE_TASKS if kind == "code" else TEXT_TASKS, batch, rng)
    else:   # template
        texts = templates(batch, unit)
    if source.kind == "grounded":   # the same text under other tasks is fine; the same prompt is not
        kept = list(dict.fromkeys(texts))
        dropped = {"duplicate": len(texts) - len(kept)}
    else:
        kept, dropped = keep_new(texts, dedupe)
    return [[{"role": "user", "content": t}] for t in kept], dropped


# --------------------------------------------------------------------------- the loop

def generate_mix(lm: Any, data_dir: Path, *, units: int, minutes: float, batch: int = 48, max_new: int = 96,
                 worker: int = 0, workers: int = 1, templates: Callable[[int, int], list[str]] = lambda n, s: [],
                 exclude: Sequence[str] = (), store_layers: Sequence[int] = (), layers_every: int = 1,
                 min_free_gb: float = 0.0) -> int:
    """Make units ``0..units-1`` (this worker's share) not made yet, until ``minutes`` pass; returns how
    many this call made. ``exclude``: prompts no unit may near-duplicate (the unseen benchmark's).
    ``store_layers``: intermediate hidden-state indices to keep too (``answer``), for the held-out units
    and every ``layers_every``-th training unit, in ``<data-dir>/layers/`` (a layer-fusion head trains
    on those units). Stops early when the disk holding ``data_dir`` has under ``min_free_gb`` free."""
    from tqdm import tqdm
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    dedupe = Deduper()
    for text in exclude:
        dedupe.add(text)
    for r in load_units(data_dir):
        dedupe.add(r["conversation"][-1]["content"])
    done = {int(f.name[1:6]) for f in unit_files(data_dir)}
    todo = [u for u in range(units) if u % workers == worker and u not in done]
    pools = Pools(data_dir)
    deadline = time.time() + minutes * 60
    made = 0
    bar = tqdm(todo, desc=f"prophet data (worker {worker}/{workers})", unit="unit")
    for unit in bar:
        if time.time() > deadline:
            bar.write(f"generation time budget of {minutes} min reached")
            break
        if min_free_gb and shutil.disk_usage(data_dir).free < min_free_gb * 1e9:
            bar.write(f"less than {min_free_gb} GB free on the data disk: stopping")
            break
        source = source_of(unit)
        keep_layers = tuple(store_layers) if store_layers and layered_unit(unit, layers_every) else ()
        convs, dropped = unit_conversations(lm, source, unit, batch, dedupe, pools, templates)
        records = answer(lm, convs, max_new, keep_layers) if convs else []
        name = f"u{unit:05d}-{source.name}.pt"
        if keep_layers:   # beside the unit, written first: a unit file's presence means the unit is whole
            (data_dir / LAYERS_DIR).mkdir(exist_ok=True)
            torch.save([r.pop("layers") for r in records], data_dir / LAYERS_DIR / name)
        for r in records:
            r.update(source=source.name, prompt=r["conversation"][-1]["content"], unit=unit)
        torch.save(records, data_dir / name)
        made += 1
        bar.set_postfix(source=source.name, kept=len(records), dropped=sum(dropped.values()),
                        tokens=sum(len(r["tokens"]) for r in records))
    return made


def final_records(data_dir: Path, exclude: Sequence[str] = (), layers: bool = False
                  ) -> tuple[list[dict], list[dict], dict]:
    """(train, held, counts): every unit's records after a global near-duplicate pass across workers and
    against ``exclude`` (the unseen benchmark's prompts: never trained on), split by source.
    ``layers``: only the records whose unit stored intermediate-layer states, with them attached."""
    dedupe = Deduper()
    for text in exclude:
        dedupe.add(text)
    kept, dropped = [], 0
    for r in load_units(data_dir, layers=layers):
        if layers and "layers" not in r:
            continue
        if r["source"].startswith("grounded") or dedupe.add(r["prompt"]):
            kept.append(r)
        else:
            dropped += 1
    train, held = split_by_source(kept, HELD_NAMES)
    bench = Deduper()
    for text in exclude:
        bench.add(text)
    leaked = [r for r in train if bench.duplicate(r["prompt"])]
    train = [r for r in train if not bench.duplicate(r["prompt"])]
    counts = {"units": len(unit_files(data_dir)), "duplicates_dropped": dropped + len(leaked),
              "train": len(train), "held": len(held),
              "train_tokens": sum(len(r["tokens"]) for r in train)}
    return train, held, counts
