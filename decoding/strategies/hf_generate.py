"""transformers' own ``generate`` as columns of the race: what people would use instead of our loops.

``hf_greedy`` (``do_sample=False``, one beam), ``hf_prompt_lookup`` (``prompt_lookup_num_tokens``) and
``hf_assisted`` (``assistant_model``, same tokenizer only) call ``model.generate`` itself; nothing here
decodes. What the race needs is recorded around it, never by changing it:

1. a streamer (``_Tap``, a ``BaseStreamer``) hears every token ``generate`` commits and commits it to an
   ``Output`` (the same EOS and length rule as every strategy), so the live race advances and each token
   gets its event time;
2. forward hooks on the target (and the assistant) count and time every forward pass ``generate`` really
   runs (``ForwardPass`` events, ``target_forwards``, ``draft_forwards``), and keep the verify forward's
   input ids, so a drafted step's candidates, accepted tokens and correction or bonus are read from what
   the target was given and what ``generate`` then streamed, not inferred from counts;
3. Stop and the time limit work as for every strategy: the runner's tracer raises at the next event,
   which the hooks and the streamer emit from inside ``generate``; the hooks only hear the thread that
   called ``generate``.

The generation settings of the run (``RunContext.generation``) are passed as ``generate``'s own keyword
arguments, with repetition penalty, no-repeat n-gram size and min length switched off unless set, so the
model's own ``generation_config`` adds no processor our greedy lacks.
"""

from __future__ import annotations

import inspect
import threading
import time
from typing import Any, Callable, Optional, Sequence

import torch
from transformers.generation.streamers import BaseStreamer

from decoding.commit import Output
from decoding.context import EMPTY, RunContext
from decoding.drafting.universal import shares_tokenizer
from decoding.events import CorrectionToken, DraftProposed, ForwardPass, StepTiming, TokenVerified
from decoding.params import HFAssistedParams, HFEarlyExitParams, HFGreedyParams, HFPromptLookupParams
from decoding.result import Result
from decoding.runtime.layers import config_view
from decoding.runtime.pair import ModelPair
from decoding.strategies.stages import acceptance
from decoding.strategies.strategy import Strategy
from decoding.tracer import NULL_TRACER

PLAIN, DRAFTED = "plain", "drafted"


class _Tap(BaseStreamer):
    """The streamer handed to ``generate`` and the forward hooks around it, for one call.

    ``prefix`` is the decoder's context before the first new token (the prompt, or the decoder start
    token of an encoder-decoder model): the first verify forward of a drafted run holds it and the
    candidates; every later one holds the newest token and the candidates.
    """

    def __init__(self, out: Output, tracer: Any, mode: str, prefix: int, draft_source: str,
                 target: Any, assistant: Any = None, drafting: Optional[Callable[[], bool]] = None,
                 draft_fields: Optional[dict] = None) -> None:
        self.out, self.tracer, self.mode, self.prefix, self.draft_source = out, tracer, mode, prefix, draft_source
        # the target drafting for itself (early exit): which of its forwards are drafts, and how they drafted
        self.drafting = drafting or (lambda: False)
        self.draft_fields = draft_fields or {}
        self.traced = tracer.enabled
        self.sync = next(target.parameters()).device.type == "cuda" and self.traced
        self.thread = threading.get_ident()
        self.streamed: list[int] = []
        self.started = False
        self.forwards = self.draft_forwards = 0
        self.target_ms = self.draft_ms = 0.0
        self.t_start: dict[str, float] = {}
        self.verify: dict = {}           # the newest target forward: its candidates and logits rows
        self.assistant_rows: list[torch.Tensor] = []   # the assistant's last logits row per forward this step
        self.step_end = time.perf_counter()
        self.steps: list[tuple[int, int]] = []         # (drafted, accepted) per verify step
        self.outside_ms = 0.0            # time between verify forwards (drafting and generate's own work)
        self.handles = [target.register_forward_pre_hook(self._before("target"), with_kwargs=True),
                        target.register_forward_hook(self._after_target, with_kwargs=True)]
        if assistant is not None:
            self.handles += [assistant.register_forward_pre_hook(self._before("draft"), with_kwargs=True),
                             assistant.register_forward_hook(self._after_draft, with_kwargs=True)]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()

    # ------------------------------------------------------------------ forward hooks
    def _mine(self) -> bool:
        return threading.get_ident() == self.thread

    def _before(self, role: str) -> Any:
        def hook(module: Any, args: tuple, kwargs: dict) -> None:
            if self._mine():
                if self.sync:
                    torch.cuda.synchronize()
                self.t_start["draft" if self.drafting() else role] = time.perf_counter()
        return hook

    def _timed(self, role: str) -> float:
        if self.sync:
            torch.cuda.synchronize()
        return (time.perf_counter() - self.t_start.pop(role, time.perf_counter())) * 1e3

    @staticmethod
    def _ids(args: tuple, kwargs: dict) -> Optional[torch.Tensor]:
        for key in ("decoder_input_ids", "input_ids"):
            if kwargs.get(key) is not None:
                return kwargs[key]
        return args[0] if args and isinstance(args[0], torch.Tensor) else None

    @staticmethod
    def _positions(ids: Optional[torch.Tensor], kwargs: dict) -> int:
        if ids is not None:
            return int(ids.numel())
        embeds = kwargs.get("decoder_inputs_embeds", kwargs.get("inputs_embeds"))
        return int(embeds.shape[0] * embeds.shape[1]) if embeds is not None else 0

    def _after_target(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        if not self._mine():
            return
        if self.drafting():                 # the target's own early-exit forward drafts
            self._after_draft(module, args, kwargs, output)
            return
        ms = self._timed("target")
        t_begin = time.perf_counter() - ms / 1e3
        self.forwards += 1
        self.target_ms += ms
        ids = self._ids(args, kwargs)
        positions = self._positions(ids, kwargs)
        logits = getattr(output, "logits", None)
        kind = "prefill" if self.forwards == 1 else ("verify" if self.mode == DRAFTED else "decode")
        if self.mode == DRAFTED:
            # 1. the candidates: what the target was given after the committed context
            k = max(0, positions - (self.prefix if self.forwards == 1 else 1))
            candidates = ids[0, ids.shape[-1] - k:].tolist() if ids is not None and k else []
            self.outside_ms += (t_begin - self.step_end) * 1e3
            self.verify = {"candidates": candidates, "ms": ms, "draft_ms": (t_begin - self.step_end) * 1e3,
                           "end": time.perf_counter(),
                           "rows": logits[0, -(len(candidates) + 1):] if self.traced and logits is not None
                           else None}
        else:
            self.verify = {"rows": logits[0, -1:] if self.traced and logits is not None else None}
        if self.traced:
            self.tracer.emit(ForwardPass(step=self.forwards, model="target", positions=positions,
                                         ms=round(ms, 3), kind=kind))

    def _after_draft(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        if not self._mine():
            return
        ms = self._timed("draft")
        self.draft_forwards += 1
        self.draft_ms += ms
        logits = getattr(output, "logits", None)
        if self.traced and logits is not None:
            self.assistant_rows.append(logits[0, -1])
        if self.traced:
            self.tracer.emit(ForwardPass(step=self.forwards + 1, model="draft",
                                         positions=self._positions(self._ids(args, kwargs), kwargs),
                                         ms=round(ms, 3), kind="draft"))

    # ------------------------------------------------------------------ the streamer
    def put(self, value: torch.Tensor) -> None:
        tokens = [int(t) for t in value.reshape(-1).tolist()]
        if not self.started:          # generate streams the prompt (or the decoder start) first
            self.started = True
            return
        self.streamed += tokens
        if self.mode == PLAIN:
            rows = self.verify.get("rows")
            probs = [float(rows[-1].float().softmax(-1)[t]) for t in tokens] if rows is not None else None
            self.out.commit(tokens, self.forwards, "greedy", probs)
        else:
            self._drafted_step(tokens)
        self.step_end = time.perf_counter()

    def end(self) -> None:
        pass

    def _drafted_step(self, tokens: list[int]) -> None:
        """One verify step: the candidates, how many the target accepted, its correction or bonus."""
        step, pos0, v = self.forwards, len(self.out), self.verify
        candidates = v.get("candidates", [])
        n = 0
        while n < min(len(candidates), len(tokens)) and tokens[n] == candidates[n]:
            n += 1
        extra = len(tokens) > n                       # generate's own token after the accepted ones
        sources = ["accepted"] * n + (["bonus" if n == len(candidates) else "correction"] if extra else [])
        self.steps.append((len(candidates), n))
        probs = None
        if self.traced:
            rows = v.get("rows")
            p = rows.float().softmax(-1) if rows is not None else None          # [k + 1, V]
            probs = [float(p[i, t]) if p is not None and i < p.shape[0] else None for i, t in enumerate(tokens)]
            self._trace_step(step, pos0, candidates, tokens, n, extra, p)
        self.out.commit(tokens, step, sources, probs)
        if self.traced:
            now = time.perf_counter()
            self.tracer.emit(StepTiming(step=step, draft_ms=round(v.get("draft_ms", 0.0), 3),
                                        verify_ms=round(v.get("ms", 0.0), 3),
                                        overhead_ms=round((now - v.get("end", now)) * 1e3, 3),
                                        drafted=len(candidates), accepted=n))
        self.assistant_rows = []

    def _trace_step(self, step: int, pos0: int, candidates: list[int], tokens: list[int], n: int, extra: bool,
                    p: Optional[torch.Tensor]) -> None:
        """DraftProposed, the candidates the target checked (TokenVerified) and its correction or bonus."""
        rows = self.assistant_rows[-len(candidates):] if candidates else []
        if self.draft_source in ("assistant", "self") and len(rows) == len(candidates):
            q = [round(float(r.float().softmax(-1)[c]), 6) for r, c in zip(rows, candidates)]
        elif self.draft_source == "prompt_lookup":
            q = [1.0] * len(candidates)               # copied tokens: a deterministic proposal
        else:
            q = []
        if candidates:
            self.tracer.emit(DraftProposed(step=step, position=pos0, tokens=tuple(candidates), q=tuple(q),
                                           source=self.draft_source, **self.draft_fields))

        def p_of(i: int, t: int) -> float:
            return round(float(p[i, t]), 6) if p is not None and i < p.shape[0] else 0.0
        checked = min(len(candidates), n + (1 if extra else 0))
        for i in range(checked):
            self.tracer.emit(TokenVerified(step=step, position=pos0 + i, token=candidates[i], accepted=i < n,
                                           p_target=p_of(i, candidates[i]), q_draft=q[i] if q else 0.0))
        if extra:
            self.tracer.emit(CorrectionToken(step=step, position=pos0 + n, token=tokens[n],
                                             kind="bonus" if n == len(candidates) else "correction",
                                             p_target=p_of(n, tokens[n])))

    # ------------------------------------------------------------------ statistics
    def stats(self, n_out: int) -> dict:
        per_forward = round(n_out / self.forwards, 4) if self.forwards else 0.0
        if self.mode == PLAIN:
            return {"mean_tokens_per_target_forward": per_forward}
        return {**acceptance(sum(d for d, _ in self.steps), sum(a for _, a in self.steps), len(self.steps),
                             self.outside_ms, self.target_ms, self.forwards),
                "mean_tokens_per_target_forward": per_forward, "accepted_lengths": [a for _, a in self.steps]}


def _generate_kwargs(pair: ModelPair, max_new_tokens: int, context: Optional[RunContext]) -> dict:
    """``generate``'s keyword arguments for a greedy run under the run's generation settings."""
    lm = pair.target
    eos = list(lm.eos_token_ids)
    pad = lm.pad_token_id
    kwargs: dict = {"max_new_tokens": int(max_new_tokens), "do_sample": False, "num_beams": 1,
                    "num_return_sequences": 1, "return_dict_in_generate": False,
                    "eos_token_id": eos or None, "pad_token_id": pad,
                    "repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "min_new_tokens": 0}
    settings = (context or EMPTY).generation
    if settings is not None:
        settings.check_for(lm)
        kwargs.update(settings.generate_kwargs())
    return kwargs


def _run(prompt_ids: Sequence[int], pair: ModelPair, max_new_tokens: int, tracer: Any,
         context: Optional[RunContext], mode: str, draft_source: str = "", tap_options: Optional[dict] = None,
         model: Any = None, **extra: Any) -> Result:
    """Call ``generate`` once with the tap attached; the result's tokens are what ``generate`` returned.
    ``tap_options``: the tap's ``drafting`` and ``draft_fields`` (a target drafting for itself); ``model``: the
    module to call ``generate`` on (a view of the target's, sharing its weights), else the target's own."""
    lm = pair.target
    model = lm.model if model is None else model
    assistant = extra.get("assistant_model")
    out = Output(lm.eos_token_ids, max_new_tokens, tracer)
    prefix = 1 if lm.is_encoder_decoder else len(prompt_ids)
    kwargs = {**_generate_kwargs(pair, max_new_tokens, context), **extra}
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=lm.device)              # [1, T]
    tap = _Tap(out, tracer, mode, prefix, draft_source, model, assistant, **(tap_options or {}))
    try:
        with torch.inference_mode():
            sequences = model.generate(ids, attention_mask=torch.ones_like(ids), streamer=tap, **kwargs)
    finally:
        tap.remove()
    new = sequences[0, (1 if lm.is_encoder_decoder else len(prompt_ids)):].tolist()
    eos = set(lm.eos_token_ids)
    cut = next((i + 1 for i, t in enumerate(new) if t in eos), len(new))
    tokens = [int(t) for t in new[:cut]]
    if tokens != out.tokens:
        raise RuntimeError(f"generate returned {len(tokens)} tokens but streamed {len(out.tokens)} different ones")
    stats = tap.stats(len(tokens))
    return Result(tokens, tap.forwards, tap.draft_forwards, stats=stats, stop_reason=out.stop_reason)


def hf_greedy(prompt_ids: Sequence[int], pair: ModelPair, params: HFGreedyParams, *, max_new_tokens: int,
              tracer: Any = NULL_TRACER, rng: Optional[torch.Generator] = None,
              context: Optional[RunContext] = None) -> Result:
    """``model.generate(do_sample=False)``: transformers' greedy search."""
    return _run(prompt_ids, pair, max_new_tokens, tracer, context, PLAIN)


def hf_prompt_lookup(prompt_ids: Sequence[int], pair: ModelPair, params: HFPromptLookupParams, *,
                     max_new_tokens: int, tracer: Any = NULL_TRACER, rng: Optional[torch.Generator] = None,
                     context: Optional[RunContext] = None) -> Result:
    """``model.generate(prompt_lookup_num_tokens=...)``: transformers' prompt lookup decoding, greedy."""
    return _run(prompt_ids, pair, max_new_tokens, tracer, context, DRAFTED, "prompt_lookup",
                prompt_lookup_num_tokens=params.prompt_lookup_num_tokens,
                max_matching_ngram_size=params.max_matching_ngram_size)


def check_assistant(pair: ModelPair) -> None:
    """Raise ``ValueError`` unless ``pair`` has an assistant model of its own with the target's tokenizer."""
    if pair.assistant is None or pair.assistant is pair.target:
        held = "the prophet head (ours, not a model transformers can run)" if pair.prophet is not None else \
            "none" if pair.assistant is None else "the target itself"
        raise ValueError(f"transformers' assisted generation needs an assistant model; the run has {held}. "
                         f"Pick an assistant model (CLI: --assistant NAME)")
    if not shares_tokenizer(pair.target, pair.assistant):
        raise ValueError(f"transformers' assisted generation is run here with a same-tokenizer assistant only; "
                         f"{pair.assistant.name!r} has a different tokenizer from {pair.target.name!r}")
    if pair.assistant.device != pair.target.device:
        raise ValueError(f"the assistant is on {pair.assistant.device}, the target on {pair.target.device}")


def hf_assisted(prompt_ids: Sequence[int], pair: ModelPair, params: HFAssistedParams, *, max_new_tokens: int,
                tracer: Any = NULL_TRACER, rng: Optional[torch.Generator] = None,
                context: Optional[RunContext] = None) -> Result:
    """``model.generate(assistant_model=...)``: transformers' assisted generation, greedy.

    transformers reads the draft length, its schedule and the confidence threshold from the assistant's
    ``generation_config``; they are set there for this call and put back after it.
    """
    check_assistant(pair)
    config = pair.assistant.model.generation_config
    names = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
    with pair.assistant.state.hf_assisted_lock:   # one run's settings at a time
        saved = {name: getattr(config, name, None) for name in names}
        for name in names:
            setattr(config, name, getattr(params, name))
        try:
            return _run(prompt_ids, pair, max_new_tokens, tracer, context, DRAFTED, "assistant",
                        assistant_model=pair.assistant.model)
        finally:
            for name, value in saved.items():
                setattr(config, name, value)


def early_exit_layers(lm: Any) -> int:
    """The decoder layers of a model whose forward honours ``generate``'s ``assistant_early_exit``; ValueError
    for the others. transformers' early exit lowers ``config.num_hidden_layers`` during its drafts, which only
    models whose decoder loops over ``self.layers[: self.config.num_hidden_layers]`` obey (Llama, Mistral,
    Qwen2, Gemma, ...); GPT-2 and GPT-NeoX loop over every layer, so their "drafts" would be the full model."""
    model = lm.model
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    try:
        source = inspect.getsource(type(base).forward)
    except (TypeError, OSError):
        source = ""
    if lm.is_encoder_decoder or "[: self.config.num_hidden_layers]" not in source:
        raise ValueError(f"transformers' assistant_early_exit does not cut {type(model).__name__}'s layers (its "
                         f"decoder runs every layer whatever config.num_hidden_layers says), so hf_early_exit "
                         f"would draft with the full model; it runs on Llama-style models (use self_speculative "
                         f"for this one)")
    return int(base.config.num_hidden_layers)


def hf_early_exit(prompt_ids: Sequence[int], pair: ModelPair, params: HFEarlyExitParams, *, max_new_tokens: int,
                  tracer: Any = NULL_TRACER, rng: Optional[torch.Generator] = None,
                  context: Optional[RunContext] = None) -> Result:
    """``model.generate(assistant_early_exit=exit_layer)``: transformers' self-speculative decoding, greedy.

    The draft length settings go on the target's ``generation_config`` for this call (it is its own assistant),
    as ``hf_assisted`` does. transformers lowers ``config.num_hidden_layers`` while it drafts: ``generate`` runs on
    a view of the target with a config of its own (``layers.config_view``, every weight shared), so the shared
    model's config is never lowered, whoever else reads it meanwhile (a background compile, another run).
    """
    lm = pair.target
    layers = early_exit_layers(lm)
    exit_layer = params.exit_layer or max(1, layers // 2)
    if not 1 <= exit_layer < layers:
        raise ValueError(f"exit_layer must be in [1, {layers - 1}] for this model ({layers} decoder layers; "
                         f"0 = half of them), got {exit_layer}")
    view = config_view(lm.model)
    config, base = lm.model.generation_config, getattr(view, view.base_model_prefix)
    names = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
    options = {"drafting": lambda: base.config.num_hidden_layers < layers,
               "draft_fields": {"layers": layers, "exit_layer": exit_layer}}
    with lm.state.hf_assisted_lock:   # one run's settings at a time
        saved = {name: getattr(config, name, None) for name in names}
        for name in names:
            setattr(config, name, getattr(params, name))
        try:
            return _run(prompt_ids, pair, max_new_tokens, tracer, context, DRAFTED, "self", tap_options=options,
                        model=view, assistant_early_exit=exit_layer)
        finally:
            for name, value in saved.items():
                setattr(config, name, value)


LIBRARY_NOTE = "transformers' own generate, called as is (a library baseline, not our loop). "

STRATEGIES = [
    Strategy("hf_greedy", HFGreedyParams, hf_greedy, lossless=True, label="transformers generate: greedy",
             description=LIBRARY_NOTE + "model.generate(do_sample=False)."),
    Strategy("hf_prompt_lookup", HFPromptLookupParams, hf_prompt_lookup, lossless=True,
             label="transformers generate: prompt lookup",
             description=LIBRARY_NOTE + "model.generate(prompt_lookup_num_tokens=...)."),
    Strategy("hf_assisted", HFAssistedParams, hf_assisted, lossless=True, needs_assistant=True,
             label="transformers generate: assisted (needs an assistant model)",
             description=LIBRARY_NOTE + "model.generate(assistant_model=...); the assistant must share the "
                                        "target's tokenizer."),
    Strategy("hf_early_exit", HFEarlyExitParams, hf_early_exit, lossless=True,
             label="transformers generate: early exit (self-speculative)",
             description=LIBRARY_NOTE + "model.generate(assistant_early_exit=exit_layer): the target's first "
                                        "layers draft (Llama-style models)."),
]
