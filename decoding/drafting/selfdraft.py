"""The target drafting for itself with some of its own layers (self-speculative decoding).

Two forms, one drafter:

* **early exit** (LayerSkip): the draft runs layers ``0 .. exit_layer - 1``, then the final norm and the LM
  head;
* **a skipped set** (SWIFT, Draft & Verify): every layer except ``skipped``. ``skip_layers=auto`` chooses the
  set on this prompt (:func:`search`): a few candidate sets are each run once over the prompt's last
  ``SEARCH_POSITIONS`` positions, and the one whose agreement with the full model and layer count predict
  the best speed-up drafts (``LayerSearch`` events record every candidate).

The draft is a :func:`runtime.layers.layer_view` of the target, run by a ``Session`` of its own on the
target's own KV cache: the committed context's keys and values of the layers it runs are the target's, so
the draft needs no cache and no prefill of its own. Its drafted positions are appended to those layers only;
before the verify forward they are cut off again (``kvcache.crop_each_layer``), and the full model's verify
forward recomputes every layer at the drafted positions. That keeps the loop's invariant (the target's cache
holds every committed token but the newest, at every layer) and the verification exactly the plain one, at
the price of recomputing the early layers at the drafted positions that LayerSkip's shared cache saves.

The chain itself (draft distributions, the confidence threshold, sampling from q) is the assistant
drafter's (:class:`AssistantDrafter`), the loop's verification is the one every drafter gets.
"""

from __future__ import annotations

import time
from typing import Any, Optional, Sequence

import torch

from decoding.drafting.assistant import AssistantDrafter
from decoding.drafting.base import Drafter, LayerForm, Proposal
from decoding.events import LayerSearch
from decoding.params import SKIP_AUTO, SelfSpeculativeParams
from decoding.runtime.kvcache import crop_each_layer
from decoding.runtime.layers import check_layers, layer_view
from decoding.runtime.session import Session
from decoding.tracer import NULL_TRACER

SEARCH_POSITIONS = 128     # the prompt's last positions the skipped-set search measures agreement on


def default_exit(layers: int) -> int:
    """Half the layers, rounded down (at least 1)."""
    return max(1, layers // 2)


def candidate_sets(layers: int) -> list[tuple[int, ...]]:
    """The skipped sets ``skip_layers=auto`` measures: every other layer, the later half, the middle half and
    every other layer of the later half, each within layers 1 .. L-2 (the first and the last always run; a
    2-layer model can only skip layer 1). Distinct and non-empty, in that order."""
    inner = range(1, layers - 1) if layers > 2 else range(1, 2)
    shapes = [[i for i in inner if i % 2 == 1],
              [i for i in inner if i >= layers // 2],
              [i for i in inner if layers // 4 <= i < layers // 4 + layers // 2],
              [i for i in inner if i >= layers // 2 and (i - layers // 2) % 2 == 0]]
    out: list[tuple[int, ...]] = []
    for shape in shapes:
        if shape and tuple(shape) not in out:
            out.append(tuple(shape))
    return out


def resolve_form(params: SelfSpeculativeParams, layers: int) -> Optional[LayerForm]:
    """The draft's layers from the parameters, checked against the model's ``layers``; None for ``auto``
    (chosen per prompt). ValueError naming the parameter and its range for this model."""
    if params.skip_layers == SKIP_AUTO:
        return None
    skipped = params.skipped
    if skipped:
        bad = [i for i in skipped if not 1 <= i < layers]
        if bad:
            raise ValueError(f"skip_layers must name layers in [1, {layers - 1}] for this model ({layers} "
                             f"decoder layers; layer 0 always runs), got {', '.join(map(str, bad))}")
        return LayerForm(layers, layers, skipped)
    exit_layer = params.exit_layer or default_exit(layers)
    if not 1 <= exit_layer < layers:
        raise ValueError(f"exit_layer must be in [1, {layers - 1}] for this model ({layers} decoder layers; "
                         f"0 = half of them), got {exit_layer}")
    return LayerForm(layers, exit_layer)


def kept_layers(form: LayerForm) -> list[int]:
    return [i for i in range(form.exit_layer) if i not in set(form.skipped)]


class SelfDrafter(AssistantDrafter):
    """Drafts a chain with a layer view of the target on the target session's own cache."""
    source = "self"

    def __init__(self, lm: Any, target: Session, params: SelfSpeculativeParams, tracer: Any = NULL_TRACER,
                 clock: Any = None, rng: Optional[torch.Generator] = None) -> None:
        Drafter.__init__(self)
        self.lm, self.target, self.params, self.rng, self.tracer = lm, target, params, rng, tracer
        self.layers = check_layers(lm.model)
        self.chosen = resolve_form(params, self.layers)       # None: chosen per prompt (begin)
        self.session = Session(lm, "draft", tracer, clock=clock)
        self.cached: list[int] = []
        self.search_ms = 0.0
        self.searched: list[dict] = []
        if self.chosen is not None:
            self._use(self.chosen)

    def _use(self, form: LayerForm) -> None:
        self.form = form
        self.session.model = layer_view(self.lm.model, kept_layers(form))

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self.cached = []
        if self.chosen is None:                             # skip_layers=auto: measured on this prompt
            t0 = time.perf_counter()
            self._use(search(self.lm, prompt_ids, self.layers, self.params.draft_tokens, self.tracer,
                             self.searched))
            self.search_ms = (time.perf_counter() - t0) * 1e3

    def propose(self, context: Sequence[int], k: int) -> Proposal:
        base = self.target.length
        if base != len(context) - 1:
            raise RuntimeError(f"the target's cache holds {base} positions, the context {len(context)} tokens; "
                               f"a self-draft continues a cache that holds all but the newest")
        self.session.cache, self.cached = self.target.cache, []
        try:
            logits = self.session.forward(self.session.tensor([[context[-1]]]), last_only=True,
                                          kind="draft")[0, -1]
            proposal = self._chain(logits, k)
        finally:                                            # the verify forward recomputes every layer there
            crop_each_layer(self.target.cache, base)
        proposal.layers = self.form
        return proposal

    def feedback(self, proposal: Proposal, accepted: Sequence[int]) -> None:
        """Nothing to crop: the draft keeps no cache of its own."""

    def stats(self) -> dict:
        out = {"layers": self.layers, "exit_layer": self.form.exit_layer, "skipped": list(self.form.skipped),
               "draft_layers": len(kept_layers(self.form))}
        if self.searched:
            out.update(skip_search=self.searched, search_ms=round(self.search_ms, 3))
        return out


def predicted_speedup(agreement: float, gamma: int, cost: float) -> float:
    """Leviathan et al.: expected tokens per step over (gamma draft forwards of relative cost ``cost`` + 1)."""
    expected = gamma + 1 if agreement >= 1 else (1 - agreement ** (gamma + 1)) / (1 - agreement)
    return expected / (gamma * cost + 1)


@torch.inference_mode()
def search(lm: Any, prompt_ids: Sequence[int], layers: int, gamma: int, tracer: Any = NULL_TRACER,
           record: Optional[list] = None) -> LayerForm:
    """The skipped set of :func:`candidate_sets` with the best predicted speed-up on ``prompt_ids``.

    One full forward and one forward per candidate over the prompt's last ``SEARCH_POSITIONS`` tokens (no
    cache); agreement = the share of positions whose argmax matches the full model's; cost = the share of
    layers the candidate runs. Every candidate is recorded (``LayerSearch`` at step 0, and ``record``)."""
    ids = torch.as_tensor([list(prompt_ids)[-SEARCH_POSITIONS:]], dtype=torch.long, device=lm.device)
    n = ids.shape[1]
    full = lm.model(input_ids=ids, use_cache=False).logits[0].argmax(-1)                # [n]
    rows = []
    for skipped in candidate_sets(layers):
        form = LayerForm(layers, layers, skipped)
        draft = layer_view(lm.model, kept_layers(form))(input_ids=ids, use_cache=False).logits[0].argmax(-1)
        agreement = float((draft == full).float().mean()) if n else 0.0
        cost = (layers - len(skipped)) / layers
        rows.append((predicted_speedup(agreement, gamma, cost), skipped, agreement, cost))
    best = max(rows, key=lambda r: r[0])
    for score, skipped, agreement, cost in rows:
        chosen = skipped == best[1]
        if record is not None:
            record.append({"skipped": list(skipped), "agreement": round(agreement, 4), "cost": round(cost, 4),
                           "score": round(score, 4), "chosen": chosen})
        if tracer.enabled:
            tracer.emit(LayerSearch(step=0, skipped=skipped, layers=layers, agreement=round(agreement, 4),
                                    positions=n, cost=round(cost, 4), score=round(score, 4), chosen=chosen))
    return LayerForm(layers, layers, best[1])
