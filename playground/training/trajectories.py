"""The base model's fixed points and its Jacobi trajectories toward them.

``greedy_answers`` runs batched greedy generation (left padding) for chat prompts: each answer is
the fixed point every Jacobi block of it converges to. ``record_trajectories`` then runs Jacobi on
blocks of ``n`` tokens hung on those answers (the paper's ``pad`` initialisation or random tokens),
every block of a group of answers in one forward per iteration (``packing``), and keeps every
distinct state: ``y^0`` (the guess), ``y^1``, ... until the block stops changing or ``max_iters``.
A record is ``{prompt, answer, source, blocks: [{t, init, states [S, n] int32, converged}]}``: the
block starts at answer token ``t``; ``states[k]`` is the block's guess after ``k`` iterations.
"""

from __future__ import annotations

import random
from typing import Any, Sequence

import torch

from decoding.runtime.kvcache import cache_kwarg, crop_cache
from playground.training.packing import Doc, float_mask, pack


def chat_ids(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                         tokenize=True, return_dict=True)["input_ids"]


def pad_token(lm: Any) -> int:
    """The token the ``pad`` init fills a block with (``LoadedModel.pad_token_id``, as ``strategies/jacobi.py``)."""
    return lm.pad_token_id


@torch.inference_mode()
def greedy_answers(lm: Any, prompts: Sequence[list[int]], max_new: int) -> list[list[int]]:
    """Greedy continuations of ``prompts`` (token ids), batched with left padding; EOS kept, nothing after."""
    eos = set(lm.eos_token_ids)
    pad = pad_token(lm)
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], device=lm.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=lm.device)
    out = lm.model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new,
                            pad_token_id=pad, eos_token_id=sorted(eos) or None)
    answers = []
    for row in out[:, width:].tolist():
        stop = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        answers.append(row[:stop])
    return answers


def pick_blocks(length: int, n: int, count: int, rng: random.Random) -> list[tuple[int, int]]:
    """Up to ``count`` non-overlapping blocks ``(t, size)`` of an answer of ``length`` tokens.

    A block starts at answer token ``t >= 1`` (token 0 comes from the prefill, as in decoding) and
    holds ``min(n, length - t)`` tokens, at least 2.
    """
    free = list(range(1, max(1, length - 1)))
    rng.shuffle(free)
    taken: list[tuple[int, int]] = []
    for t in free:
        size = min(n, length - t)
        if len(taken) >= count:
            break
        if size >= 2 and all(t + size <= s or s + m <= t for s, m in taken):
            taken.append((t, size))
    return sorted(taken)


@torch.inference_mode()
def record_trajectories(lm: Any, items: Sequence[dict], *, n: int, blocks_per_answer: int, max_iters: int,
                        rng: random.Random, pad_share: float = 0.5) -> list[dict]:
    """Jacobi trajectories of the base model for the answers in ``items`` (``{prompt, answer, ...}``).

    One prefill over every context, then one forward per iteration over every unfinished block.
    Inits are ``pad`` for a share ``pad_share`` of the blocks and ``random`` for the rest, spread evenly
    (``0.5``: they alternate); the default Jacobi starts from ``pad``.
    """
    from transformers import DynamicCache
    model, dev, pad = lm.model, lm.device, pad_token(lm)
    docs, blocks = [], []              # blocks: (doc, t, anchor, size, init, states)
    for d, item in enumerate(items):
        context = list(item["prompt"]) + list(item["answer"])
        docs.append(Doc(context))
        for t, size in pick_blocks(len(item["answer"]), n, blocks_per_answer, rng):
            i, r = len(blocks), 1.0 - pad_share
            init = "random" if int((i + 1) * r + 1e-9) > int(i * r + 1e-9) else "pad"
            guess = [pad] * size if init == "pad" else [rng.randrange(lm.vocab_size) for _ in range(size)]
            blocks.append([d, t, len(item["prompt"]) + t - 1, size, init, [guess]])
    # 1. the contexts, once: the cache, and the prediction each block's first position always gets
    ctx = pack(docs)
    cache = DynamicCache()
    logits = model(input_ids=ctx.ids[None].to(dev), position_ids=ctx.positions[None].to(dev),
                   attention_mask=float_mask(ctx.allowed, lm.dtype, dev), **{cache_kwarg(model): cache},
                   use_cache=True).logits[0]                                                       # [Tc, V]
    first = [int(logits[ctx.ctx_start[b[0]] + b[2]].argmax()) for b in blocks]
    tc = ctx.ids.shape[0]
    live = list(range(len(blocks)))
    for _ in range(max_iters):
        if not live:
            break
        # 2. one Jacobi iteration of every live block: inputs y[:-1] after its anchor
        query = [Doc(docs[d].context, []) for d in range(len(docs))]
        for i in live:
            d, _, anchor, _, _, states = blocks[i]
            query[d].blocks.append((anchor, states[-1][:-1]))
        q = pack(query, contexts=False)
        out = model(input_ids=q.ids[None].to(dev), position_ids=q.positions[None].to(dev),
                    attention_mask=float_mask(q.allowed, lm.dtype, dev), **{cache_kwarg(model): cache},
                    use_cache=True).logits[0].argmax(-1).tolist()                                  # [Tb]
        crop_cache(cache, tc)
        seen = {d: 0 for d in range(len(docs))}
        still = []
        for i in live:
            d, _, _, size, _, states = blocks[i]
            start = q.block_start[d][seen[d]]
            seen[d] += 1
            new = [first[i]] + out[start:start + size - 1]
            if new != states[-1]:
                states.append(new)
                still.append(i)
        live = still
    records = []
    for d, item in enumerate(items):
        mine = [b for b in blocks if b[0] == d]
        records.append({**item, "blocks": [
            {"t": t, "init": init, "states": torch.tensor(states, dtype=torch.int32),
             "converged": states[-1] == list(item["answer"][t:t + size])}
            for _, t, _, size, init, states in mine]})
    return records
