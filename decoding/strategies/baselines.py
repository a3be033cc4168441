"""Baselines: greedy, sampling and beam search as our own KV-cached loops.

Greedy and beam search reproduce ``transformers``' ``generate`` token for token
(tests check this on several architectures); they never call ``generate``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from decoding.commit import Output
from decoding.context import RunContext, processors
from decoding.events import BeamStep, SamplingFilter
from decoding.params import BeamParams, GreedyParams, SampleParams
from decoding.result import Result
from decoding.runtime.pair import ModelPair
from decoding.runtime.session import Session
from decoding.sampling import chooser
from decoding.sampling import probs as sampling_probs
from decoding.strategies.stages import choose_and_commit, first_token
from decoding.strategies.strategy import Strategy
from decoding.tracer import NULL_TRACER

NEG = -1.0e9  # transformers' "impossible" score in beam search


def _autoregressive(prompt_ids: Sequence[int], pair: ModelPair, max_new_tokens: int,
                    tracer: Any, choose: Callable[[torch.Tensor], int], source: str,
                    fast: bool = False, context: Optional[RunContext] = None,
                    observe: Optional[Callable[[torch.Tensor, int, int, int], None]] = None) -> Result:
    """One target forward per token; ``choose`` maps last-position logits ``[V]`` to a token.

    ``observe(logits, token, step, position)`` is called after each choice when tracing.
    """
    target = Session(pair.target, "target", tracer, fast=fast, max_len=len(prompt_ids) + max_new_tokens)
    out = Output(pair.target.eos_token_ids, max_new_tokens, tracer)
    proc = processors(context, pair.target, prompt_ids, max_new_tokens)
    # 1. prefill; the first token
    token = first_token(target, prompt_ids, out, proc, choose, source, observe=observe)
    while not out.done:
        # 2. feed the newest token back through the cache, 3. choose and commit the next (stops on EOS or length)
        logits = target.forward(target.tensor([[token]]), last_only=True)[0, -1]      # [V]
        token = choose_and_commit(logits, out, proc, choose, target.forwards, source, observe)
    return Result(out.tokens, target.forwards, stop_reason=out.stop_reason)


def greedy(prompt_ids: Sequence[int], pair: ModelPair, params: GreedyParams, *,
           max_new_tokens: int, tracer: Any = NULL_TRACER,
           rng: Optional[torch.Generator] = None, context: Optional[RunContext] = None) -> Result:
    return _autoregressive(prompt_ids, pair, max_new_tokens, tracer,
                           lambda logits: int(torch.argmax(logits)), "greedy", fast=params.fast, context=context)


def sample(prompt_ids: Sequence[int], pair: ModelPair, params: SampleParams, *,
           max_new_tokens: int, tracer: Any = NULL_TRACER,
           rng: Optional[torch.Generator] = None, context: Optional[RunContext] = None) -> Result:
    choose = chooser(params, rng)

    def observe(logits: torch.Tensor, token: int, step: int, position: int) -> None:
        if not params.is_greedy:
            tracer.emit(sampling_filter(logits, token, params, step, position))
    return _autoregressive(prompt_ids, pair, max_new_tokens, tracer, choose, "sample", fast=params.fast,
                           context=context, observe=observe)


SHOWN_TOKENS = 12   # tokens a SamplingFilter event records (the most probable, plus the sampled one)


def sampling_filter(logits: torch.Tensor, token: int, params: SampleParams, step: int, position: int
                    ) -> SamplingFilter:
    """The distribution at one position before and after temperature, top-k and top-p (no rng used)."""
    logits = logits.float()                                                   # [V]
    raw = logits.softmax(-1)                                                  # [V]
    warm = (logits / params.temperature).softmax(-1)                          # [V]
    final = sampling_probs(logits, params)                                    # [V]
    top = torch.topk(raw, min(SHOWN_TOKENS, raw.numel())).indices.tolist()
    ids = top if token in top else top + [int(token)]

    def at(p: torch.Tensor) -> tuple[float, ...]:
        return tuple(round(float(p[i]), 6) for i in ids)
    return SamplingFilter(step=step, position=position, tokens=tuple(int(i) for i in ids), p_raw=at(raw),
                          p_temperature=at(warm), p_final=at(final), chosen=int(token),
                          temperature=float(params.temperature), top_k=int(params.top_k),
                          top_p=float(params.top_p), kept=int((final > 0).sum()))


def beam(prompt_ids: Sequence[int], pair: ModelPair, params: BeamParams, *,
         max_new_tokens: int, tracer: Any = NULL_TRACER,
         rng: Optional[torch.Generator] = None, context: Optional[RunContext] = None) -> Result:
    """Beam search with transformers' rules (batch of one prompt).

    Each step keeps the best ``keep = max(2, 1 + n_eos) * num_beams`` continuations
    of all beams; those that end (EOS or length) compete for the ``num_beams``
    finished slots with score ``sum log p / generated_len ** length_penalty``;
    the best unfinished ``num_beams`` keep running. Stops when the early-stop
    heuristic says no running beam can beat the worst finished one.
    """
    k, lp, early = params.num_beams, params.length_penalty, params.early_stopping
    target = Session(pair.target, "target", tracer)
    device = pair.target.device
    eos = torch.tensor(pair.target.eos_token_ids, dtype=torch.long, device=device)
    keep = max(2, 1 + eos.numel()) * k
    in_top_k = torch.arange(keep, device=device) < k                    # [keep]

    running = torch.zeros((k, max_new_tokens), dtype=torch.long, device=device)
    running_scores = torch.full((k,), NEG, device=device)
    running_scores[0] = 0.0                                              # identical beams: use one
    done_seqs = running.clone()
    done_scores = torch.full((k,), NEG, device=device)
    done_flags = torch.zeros(k, dtype=torch.bool, device=device)
    done_lens = torch.zeros(k, dtype=torch.long, device=device)
    improvable = True

    proc = processors(context, pair.target, prompt_ids, max_new_tokens)
    logits = target.prefill(prompt_ids, batch=k)                         # [k, V]
    vocab = logits.shape[-1]
    for t in range(max_new_tokens):
        # 1. best `keep` continuations over all beams x vocab (processors see each beam's own tokens)
        logp = torch.log_softmax(logits, dim=-1)                                      # [k, V]
        if proc is not None:
            logp = proc.rows([r[:t].tolist() for r in running], logp)
        logp = logp + running_scores[:, None]
        top_scores, top_idx = torch.topk(logp.reshape(-1), keep)            # [keep]
        src, tok = top_idx // vocab, top_idx % vocab
        cand = running[src].clone()                                         # [keep, max_new]
        cand[:, t] = tok
        ends = torch.isin(tok, eos) | (t + 1 >= max_new_tokens)             # [keep]

        # 2. the best num_beams unfinished continuations keep running
        masked = top_scores + ends.to(torch.float32) * NEG
        nxt = torch.topk(masked, k).indices
        running, running_scores, parents = cand[nxt], masked[nxt], src[nxt]

        # 3. finished ones (among the top num_beams) compete for the finished slots
        just_done = ends & in_top_k
        scored = top_scores / ((t + 1) ** lp)
        scored = scored + float(bool(done_flags.all()) and early is True) * NEG
        scored = scored + float(not improvable) * NEG
        scored = scored + (~just_done).to(torch.float32) * NEG
        merged = torch.cat((done_scores, scored))
        best = torch.topk(merged, k).indices
        done_seqs = torch.cat((done_seqs, cand))[best]
        done_scores = merged[best]
        done_flags = torch.cat((done_flags, just_done))[best]
        done_lens = torch.cat((done_lens, torch.full((keep,), t + 1, device=device)))[best]

        if tracer.enabled:
            tracer.emit(BeamStep(step=target.forwards,
                                 tokens=tuple(tuple(r[: t + 1].tolist()) for r in running),
                                 scores=tuple(round(float(s), 5) for s in running_scores),
                                 finished=int(done_flags.sum())))

        # 4. stop when no running beam can still beat the worst finished hypothesis
        best_possible = running_scores[0] / ((t + 1) ** lp)
        worst_done = torch.where(done_flags, done_scores.min(), torch.tensor(NEG, device=device))
        improvable = improvable and bool((best_possible > worst_done).any())
        open_beams = not (bool(done_flags.all()) and early is True)
        if not (improvable and open_beams and not bool(ends.all())):
            break

        # 5. reorder the cache to follow the surviving beams, then extend them
        target.cache.reorder_cache(parents)
        logits = target.forward(running[:, t:t + 1], last_only=True)[:, -1]   # [k, V]

    # 6. the best finished hypothesis is the output
    out = Output(pair.target.eos_token_ids, max_new_tokens, tracer)
    out.commit(done_seqs[0, :int(done_lens[0])].tolist(), target.forwards, "beam")
    return Result(out.tokens, target.forwards, stats={"beam_score": round(float(done_scores[0]), 6)},
                  stop_reason=out.stop_reason)


STRATEGIES = [
    Strategy("greedy", GreedyParams, greedy, lossless=True, label="Greedy",
             description="One target forward per token, argmax. The reference every lossless method must match."),
    Strategy("sample", SampleParams, sample, lossless=False, label="Sampling",
             description="Temperature, top-k and top-p sampling with a seeded generator."),
    Strategy("beam", BeamParams, beam, lossless=False, label="Beam search",
             description="Beam search with transformers' scoring and stopping rules."),
]
