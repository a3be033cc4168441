"""The consistency losses of CLLMs (Kou et al. 2024, arXiv 2403.00835), all in one packed forward.

For a record (prompt, fixed point = the base model's greedy answer, Jacobi states of some blocks):

* **AR loss**: cross-entropy of the answer given the prompt (teacher forcing on the fixed point), so
  the model keeps its answers.
* **global consistency**: for a state ``y`` of a block starting at answer token ``t``, at every block
  position ``i`` the model given the prompt, the prefix ``answer[:t]`` and ``y[:i]`` should predict
  the fixed point's token ``answer[t + i]``: any state maps to the fixed point in one iteration.
  ``ce``: cross-entropy to that token; ``kl``: KL from the model's own distribution at the fixed
  point (the AR forward's row for that position, gradient stopped) to the one at the state, as the
  paper writes it.
* **local consistency** (optional): the same toward the next state of the trajectory, ``y^{k+1}``
  (the model's distribution given ``y^{k+1}[:i]``, gradient stopped): consecutive states agree.

Position 0 of a block is the AR prediction itself (nothing of the state is visible yet), so a
state contributes its positions 1 to n-1: its tokens ``y[:-1]`` are fed (``packing``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from playground.training.packing import Doc, float_mask, pack


@dataclass(frozen=True)
class Weights:
    ar: float = 1.0
    consistency: float = 1.0
    local: float = 0.0
    kind: str = "kl"              # global loss: "kl" (paper) or "ce"
    trim: bool = False            # drop a state's leading tokens that already are the fixed point's
    rows: int = 0                 # with trim: keep only this many rows of a state after its first wrong token


def sample_states(record: dict, per_block: int, rng: random.Random, local: bool,
                  trim: bool = False, rows: int = 0) -> list[tuple[int, list, list]]:
    """``(t, state, next state or [])`` for up to ``per_block`` states of each block, never the fixed point.

    A trajectory's last state is the fixed point only when it converged; the AR loss covers that one.
    ``trim``: a state whose first ``m`` tokens already are the fixed point's is the same Jacobi input as
    the block starting ``m`` tokens later (those tokens are in the context there, at the same positions),
    so it is fed from there: the rows it drops only repeat AR rows. States right but for their last token
    (nothing left to learn) are not sampled then. ``rows`` (with ``trim``) keeps only the first ``rows``
    predictions after the first wrong token: the ones that make a block fast-forward (a right token after
    one or two wrong ones), not those after a long run of wrong tokens.
    """
    out = []
    answer = list(record["answer"])
    for block in record["blocks"]:
        states = block["states"].tolist()
        t = block["t"]
        fixed = answer[t:t + len(states[0])]
        pool = [k for k, s in enumerate(states) if s != fixed]
        if trim:
            pool = [k for k in pool if _common(states[k], fixed) < len(fixed) - 1]
        for k in rng.sample(pool, min(per_block, len(pool))):
            nxt = states[k + 1] if local and k + 1 < len(states) else []
            m = _common(states[k], fixed) if trim else 0
            end = m + rows + 1 if trim and rows else len(states[k])
            out.append((t + m, states[k][m:end], nxt[m:end]))
    return out


def _common(a: list, b: list) -> int:
    m = 0
    while m < min(len(a), len(b)) and a[m] == b[m]:
        m += 1
    return m


def layout(records: Sequence[dict], picks: Sequence[list]) -> tuple[list[Doc], list[list[tuple[int, int, int]]]]:
    """Documents (context + state blocks, then next-state blocks) and, per document, per state:
    ``(block index of the state, block index of its next state or -1, t)``."""
    docs, index = [], []
    for record, chosen in zip(records, picks):
        p = len(record["prompt"])
        doc = Doc(list(record["prompt"]) + list(record["answer"]))
        mine = []
        for t, state, nxt in chosen:
            doc.blocks.append((p + t - 1, state[:-1]))
            mine.append([len(doc.blocks) - 1, -1, t])
        for entry, (t, state, nxt) in zip(mine, chosen):
            if nxt:
                doc.blocks.append((p + t - 1, nxt[:-1]))
                entry[1] = len(doc.blocks) - 1
        docs.append(doc)
        index.append([tuple(e) for e in mine])
    return docs, index


def losses(model: Any, records: Sequence[dict], weights: Weights, per_block: int, rng: random.Random) -> dict:
    """One packed forward over ``records``: every loss (scalars, the total under ``loss``) and counts."""
    picks = [sample_states(r, per_block, rng, weights.local > 0, weights.trim, weights.rows) for r in records]
    docs, index = layout(records, picks)
    packed = pack(docs)
    dev = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    hidden = model.model(input_ids=packed.ids[None].to(dev), position_ids=packed.positions[None].to(dev),
                         attention_mask=float_mask(packed.allowed, dtype, dev)).last_hidden_state[0]   # [T, H]
    head = model.get_output_embeddings()
    # rows wanted: answer predictions (AR: context row p + j - 1 predicts answer[j]) and state rows
    ar_rows, ar_labels, st_rows, st_teacher, st_labels, nx_rows, nx_of = [], [], [], [], [], [], []
    hard = []                # state rows whose inputs are not the fixed point's: what Jacobi must guess
    for d, (record, doc) in enumerate(zip(records, docs)):
        p, answer, c0 = len(record["prompt"]), list(record["answer"]), packed.ctx_start[d]
        ar_rows += range(c0 + p - 1, c0 + p - 1 + len(answer))
        ar_labels += answer
        for blk, nxt, t in index[d]:
            inputs = doc.blocks[blk][1]
            start = packed.block_start[d][blk]
            for j in range(len(inputs)):      # state input j predicts answer[t + j + 1]
                hard.append(inputs[:j + 1] != answer[t:t + j + 1])
                st_rows.append(start + j)
                st_teacher.append(c0 + p + t + j)          # the AR row predicting the same token
                st_labels.append(answer[t + j + 1])
                if nxt >= 0 and j < len(doc.blocks[nxt][1]):
                    nx_rows.append(packed.block_start[d][nxt] + j)
                    nx_of.append(len(st_rows) - 1)
    logits = head(hidden[torch.tensor(ar_rows + st_rows + nx_rows, device=dev)]).float()
    n_ar, n_st = len(ar_rows), len(st_rows)
    ar_logits, st_logits, nx_logits = logits[:n_ar], logits[n_ar:n_ar + n_st], logits[n_ar + n_st:]
    labels = torch.tensor(ar_labels, device=dev)
    out = {"ar": F.cross_entropy(ar_logits, labels)}
    st_y = torch.tensor(st_labels, device=dev)
    log_student = st_logits.log_softmax(-1)
    if weights.kind == "ce":
        out["consistency"] = F.nll_loss(log_student, st_y)
    else:
        with torch.no_grad():
            teacher = head(hidden[torch.tensor(st_teacher, device=dev)]).float().log_softmax(-1)
        out["consistency"] = F.kl_div(log_student, teacher, log_target=True, reduction="batchmean")
    if weights.local > 0 and nx_rows:
        target = nx_logits.detach().log_softmax(-1)
        out["local"] = F.kl_div(log_student[torch.tensor(nx_of, device=dev)], target, log_target=True,
                                reduction="batchmean")
    total = weights.ar * out["ar"] + weights.consistency * out["consistency"]
    if "local" in out:
        total = total + weights.local * out["local"]
    with torch.no_grad():
        out_stats = {k: float(v) for k, v in out.items()}
        hit = st_logits.argmax(-1) == st_y
        mask = torch.tensor(hard, dtype=torch.bool, device=dev)
        out_stats["state_acc"] = float(hit.float().mean()) if n_st else 0.0
        out_stats["hard_acc"] = float(hit[mask].float().mean()) if mask.any() else 0.0
        out_stats["hard_rows"] = int(mask.sum())
        out_stats["states"] = n_st
        out_stats["tokens"] = int(packed.ids.numel())
    return {"loss": total, **out_stats}
