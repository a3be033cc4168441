"""The stages the decoding loops are made of, each written once (EAGLE's loop is the picture:
``generate_candidates`` / ``tree_decoding`` / ``evaluate_posterior`` / ``update_inference_inputs``).

1. ``first_token``: prefill the prompt, apply the run's logits processors, choose the first token and
   commit it at the prefill's step. Every loop starts with it: the first token is the target's own.
2. ``choose_and_commit``: one position's logits through the processors, the choice, the commit (greedy and
   sampling run it for every later token too).
3. ``verify``: the rows of a verify forward through the processors (each row continues the output plus its
   draft path), then the tree verified: the longest argmax-matching path at temperature 0, recursive
   rejection sampling above (``decoding.verify``); or, when the run's ``acceptance`` is ``lenient`` or
   ``typical``, the lossy rules of ``decoding.relaxed``. Speculative decoding (every drafter: assistant,
   prompt lookup, suffix, prophet) and lookahead call it, so the acceptance parameter reaches all of them here.
4. ``trace_width``: the width a lookahead or Jacobi run uses and where it came from (``runtime/widths.py``).
5. ``acceptance``: a drafting loop's acceptance statistics and Leviathan's predicted speed-up, for our loop and
   for ``generate``'s assisted one alike.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from decoding.relaxed import verify_relaxed
from decoding.commit import Output
from decoding.events import WidthChosen
from decoding.params import SamplingParams
from decoding.runtime.session import Session
from decoding.runtime.widths import WidthChoice
from decoding.sampling import probs as filtered_probs
from decoding.tree import TokenTree
from decoding.verify import Verdict, verify_tree_greedy, verify_tree_sampling

Observe = Callable[[torch.Tensor, int, int, int], None]   # (processed logits [V], token, step, position)


def choose_and_commit(logits: torch.Tensor, out: Output, proc: Any, choose: Callable[[torch.Tensor], int],
                      step: int, source: str, observe: Optional[Observe] = None) -> int:
    """Process one position's logits ``[V]`` with the output so far, choose a token and commit it at ``step``."""
    if proc is not None:
        logits = proc(out.tokens, logits)
    token = choose(logits)
    traced = out.tracer.enabled
    if observe is not None and traced:
        observe(logits, token, step, len(out))
    out.commit([token], step, source, [float(logits.softmax(-1)[token])] if traced else None)
    return token


def first_token(target: Session, prompt_ids: Sequence[int], out: Output, proc: Any,
                choose: Callable[[torch.Tensor], int], source: str, *, hidden: bool = False,
                observe: Optional[Observe] = None) -> int:
    """Prefill ``prompt_ids`` (keeping the last hidden state when ``hidden``) and commit the first token."""
    logits = target.prefill(list(prompt_ids), hidden=hidden)[0]                        # [V]
    return choose_and_commit(logits, out, proc, choose, target.forwards, source, observe)


def verify(logits: torch.Tensor, tree: TokenTree, output: Sequence[int], proc: Any, params: SamplingParams,
           rng: Optional[torch.Generator], q: Optional[torch.Tensor] = None,
           replacement: bool = False) -> tuple[Verdict, Optional[torch.Tensor], torch.Tensor]:
    """Verify ``tree`` from the rows ``[1 + n, V]`` of one forward (the root's row, then one per node).

    Returns (verdict, the target's filtered probabilities when sampling else None, the processed rows).
    ``q`` and ``replacement`` describe the drafter's proposal for rejection sampling (None: deterministic
    candidates, whose q is one-hot).
    """
    if proc is not None:
        paths = [[tree.tokens[k] for k in tree.path(i)] for i in range(len(tree))]
        logits = proc.rows([list(output)] + [list(output) + p for p in paths], logits)
    if getattr(params, "lossy", False):      # lenient or typical acceptance: decoding/relaxed.py
        verdict, p_target = verify_relaxed(logits, tree, params, rng, q, replacement)
        return verdict, p_target, logits
    if params.is_greedy:
        return verify_tree_greedy(logits, tree), None, logits
    p_target = filtered_probs(logits, params)                                           # [1 + n, V]
    return verify_tree_sampling(p_target, tree, q, rng, replacement), p_target, logits


def trace_width(tracer: Any, chosen: WidthChoice) -> None:
    """Record the run's width and where it came from (``WidthChosen`` at step 0, before the prefill)."""
    if tracer.enabled:
        tracer.emit(WidthChosen(step=0, name=chosen.name, value=chosen.value, source=chosen.source,
                                tokens_per_forward=round(chosen.tokens_per_forward, 4),
                                cost_ratio=round(chosen.cost_ratio, 4),
                                predicted_speedup=round(chosen.predicted_speedup, 4)))


def acceptance(drafted: int, accepted: int, steps: int, draft_ms: float, target_ms: float,
               target_forwards: int) -> dict:
    """Acceptance per drafted depth (alpha), drafted depth per step (gamma) and Leviathan et al.'s prediction.

    ``cost_ratio`` c is the drafting time per drafted depth (one draft token of a chain, one tree level) over the
    mean target forward time, for every drafter (model-free ones included). Expected tokens per step
    E = (1 - a^(g+1)) / (1 - a) (g + 1 when every draft is accepted), predicted speed-up E / (g c + 1).
    """
    alpha = accepted / drafted if drafted else 0.0
    gamma = drafted / steps if steps else 0.0
    t_ms = target_ms / target_forwards if target_forwards else 0.0
    c = (draft_ms / drafted) / t_ms if drafted and t_ms else 0.0
    expected = (gamma + 1) if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return {"alpha": round(alpha, 4), "drafted": drafted, "accepted": accepted, "steps": steps,
            "gamma": round(gamma, 3), "mean_accepted_length": round(accepted / max(steps, 1), 4),
            "draft_ms_per_step": round(draft_ms / max(steps, 1), 3), "cost_ratio": round(c, 4),
            "expected_tokens_per_step": round(expected, 4), "predicted_speedup": round(expected / (gamma * c + 1), 4)}
