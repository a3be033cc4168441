"""A model's side of one generation: its KV cache, forward counter and timings.

``Session`` is the only place the decoding loops call a model. It hides the
difference between decoder-only models (the prompt is the decoder prefix) and
encoder-decoder models (the encoder runs once on the prompt; the decoder prefix
starts with ``decoder_start_token_id``), counts forwards, times them and emits
``ForwardPass`` events. It uses public transformers APIs only: cache objects
with ``crop``, explicit ``position_ids`` and 4D float attention masks.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional, Sequence

import torch

from decoding.events import ForwardPass
from decoding.runtime import fastpath
from decoding.runtime.kvcache import cache_kwarg, compact_cache, crop_cache, new_dynamic_cache
from decoding.runtime.models import LoadedModel
from decoding.tracer import NULL_TRACER


class Session:
    """One model, one generation.

    ``clock`` returns the replay step stamped on this session's events; the
    target session counts its own forwards, a draft session borrows the
    target's clock (its forwards belong to the *next* target step).
    """

    def __init__(self, lm: LoadedModel, role: str = "target", tracer: Any = NULL_TRACER,
                 clock: Optional[Callable[[], int]] = None, static_len: Optional[int] = None,
                 fast: bool = False, max_len: Optional[int] = None) -> None:
        self.lm = lm
        self.model = lm.model
        self.role = role
        self.tracer = tracer
        self._clock = clock
        self.cache: Any = None
        self.forwards = 0
        self.positions = 0          # query positions processed, summed over forwards
        self.ms = 0.0               # wall time spent in this model's forwards
        self.last_hidden: Optional[torch.Tensor] = None
        # hidden-state indices kept beside the last layer's in ``last_hidden`` (a layer-fusion prophet head)
        self.hidden_layers: tuple[int, ...] = ()
        self._encoder_kwargs: dict = {}
        self._sync = lm.device.type == "cuda"
        # Fast path (decoding/runtime/fastpath.py): a static KV cache with explicit positions and
        # masks, replayed as CUDA graphs on a GPU. ``max_len`` (prompt + new tokens) sizes
        # it; ``static_len`` asks for exactly that capacity. Same tokens either way.
        self.fast = bool(fast or static_len) and fastpath.supported(lm)
        self._want = static_len or max_len or 0
        self.runner: Optional[fastpath.StaticRunner] = None

    def clock(self) -> int:
        """The replay step stamped on this session's events."""
        return self._clock() if self._clock is not None else self.forwards

    # ------------------------------------------------------------------ state
    @property
    def length(self) -> int:
        """Positions held in the (self-attention) KV cache."""
        if self.runner is not None:
            return self.runner.length
        return 0 if self.cache is None else int(self.cache.get_seq_length())

    def crop(self, length: int) -> None:
        if self.runner is not None:
            self.runner.rewind(length)
            return
        crop_cache(self.cache, length)

    def keep(self, base: int, rows: Sequence[int]) -> None:
        """Keep cached positions ``base + r`` for ``r`` in ``rows`` (ascending) at ``base, base + 1, ...``.

        After a tree verify forward fed at ``base``, ``rows`` are the root and the
        accepted path; everything after them (other branches) is dropped.
        """
        rows = list(rows)
        if rows == list(range(len(rows))):       # a prefix of what was fed: a plain crop
            self.crop(base + len(rows))
        elif self.runner is not None:
            self.runner.keep(base, rows)
        else:
            compact_cache(self.cache, base, rows)

    def tensor(self, ids: Sequence[int] | Sequence[Sequence[int]]) -> torch.Tensor:
        t = torch.as_tensor(ids, dtype=torch.long, device=self.lm.device)
        return t if t.dim() == 2 else t.unsqueeze(0)

    def new_cache(self) -> Any:
        return new_dynamic_cache(self.lm.is_encoder_decoder)

    # ------------------------------------------------------------------ forwards
    def prefill(self, prompt_ids: Sequence[int], batch: int = 1, hidden: bool = False) -> torch.Tensor:
        """Start the generation. Returns next-token logits ``[batch, V]`` (float32).

        ``decoder_prefix()`` gives the ids that now sit in the decoder cache.
        """
        prompt = self.tensor([list(prompt_ids)] * batch)                 # [B, P]
        if self.fast and batch == 1:
            need = max(self._want, len(prompt_ids) + 1)
            self.runner = fastpath.checkout(self.lm, self, need)
        if self.runner is not None:
            self.runner.reset()
            self.cache = self.runner.cache
        else:
            self.cache = self.new_cache()
        if self.lm.is_encoder_decoder:
            start = self.lm.decoder_start_token_id
            encoder = self.model.get_encoder()
            with torch.inference_mode():
                enc = encoder(input_ids=prompt, attention_mask=torch.ones_like(prompt))
            self._encoder_kwargs = {"encoder_outputs": enc, "attention_mask": torch.ones_like(prompt)}
            self._prefix = [start]
            ids = self.tensor([[start]] * batch)
        else:
            self._prefix = list(prompt_ids)
            ids = prompt
        return self.forward(ids, last_only=True, hidden=hidden, kind="prefill")[:, -1]

    def decoder_prefix(self) -> list[int]:
        return list(self._prefix)

    def forward(self, ids: torch.Tensor, *, position_ids: Optional[torch.Tensor] = None,
                attention_mask: Optional[torch.Tensor] = None, last_only: bool = False,
                hidden: bool = False, kind: str = "decode") -> torch.Tensor:
        """Run ``ids [B, T]`` after the cached prefix; return float32 logits ``[B, T|1, V]``.

        ``attention_mask`` is an optional 4D float mask ``[B, 1, T, cache+T]``
        (0 = attend, -inf = blocked) for tree/window layouts; ``position_ids``
        ``[B, T]`` go with it. Without them the forward is plain causal.
        ``hidden=True`` keeps the last layer's hidden states in ``last_hidden``, followed by those of
        ``hidden_layers`` (concatenated on the last dimension) when that is set.
        """
        kwargs: dict = {cache_kwarg(self.model): self.cache, "use_cache": True}
        if hidden:
            kwargs["output_hidden_states"] = True
        if last_only and self.lm.supports_logits_to_keep:
            kwargs["logits_to_keep"] = 1
        if self.lm.is_encoder_decoder:
            kwargs.update(self._encoder_kwargs, decoder_input_ids=ids)
            if attention_mask is not None:
                kwargs["decoder_attention_mask"] = attention_mask
            if position_ids is not None:
                kwargs["decoder_position_ids"] = position_ids
        else:
            kwargs["input_ids"] = ids
            if attention_mask is not None:
                kwargs["attention_mask"] = attention_mask
            if position_ids is not None:
                kwargs["position_ids"] = position_ids
        traced = self.tracer.enabled
        if self._sync and traced:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fast = self.runner is not None and ids.shape[0] == 1 and (
            attention_mask is None or isinstance(attention_mask, torch.Tensor))
        with torch.inference_mode():
            if fast:
                self._room(ids.shape[-1])
                logits, states = self.runner.forward(ids, position_ids=position_ids, mask=attention_mask,
                                                     last_only=last_only,
                                                     hidden=(self.hidden_layers or True) if hidden else False,
                                                     capture=kind != "prefill")
            else:
                out = self.model(**kwargs)
                logits = out.logits[:, -1:] if last_only else out.logits
                logits = logits.float()
                if hidden:
                    states = fastpath.pick_states(
                        out.decoder_hidden_states if self.lm.is_encoder_decoder else out.hidden_states,
                        self.hidden_layers or True)
        self._account(ids, t0, kind, states if hidden else None)
        return logits

    def _account(self, ids: torch.Tensor, t0: float, kind: str, states: Optional[torch.Tensor]) -> None:
        """A forward's time, counts, hidden states (``states``, when asked for) and trace event."""
        traced = self.tracer.enabled
        if self._sync and traced:
            torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1000.0
        self.forwards += 1
        self.positions += ids.numel()
        self.ms += ms
        if states is not None:
            self.last_hidden = states
        if traced:
            self.tracer.emit(ForwardPass(step=self.clock(), model=self.role,
                                         positions=int(ids.numel()), ms=round(ms, 3), kind=kind))

    def forward_tree(self, ids: torch.Tensor, parents: tuple[int, ...], layout: tuple[torch.Tensor, torch.Tensor], *,
                     hidden: bool = False, kind: str = "verify") -> Optional[torch.Tensor]:
        """A tree's forward on the fast path's static runner (``StaticRunner.forward_tree``: the layout made on
        the device once per tree shape); None when this session has no runner (then the caller masks it)."""
        if self.runner is None or ids.shape[0] != 1:
            return None
        traced = self.tracer.enabled
        if self._sync and traced:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.inference_mode():
            self._room(ids.shape[-1])
            logits, states = self.runner.forward_tree(ids, parents, layout,
                                                      hidden=(self.hidden_layers or True) if hidden else False)
        self._account(ids, t0, kind, states if hidden else None)
        return logits

    def _room(self, t: int) -> None:
        """Grow the static cache when a forward would overflow it (keeps the cached prefix)."""
        runner = self.runner
        if runner.length + t > runner.capacity:
            bigger = runner.grow_to(fastpath.capacity_for(runner.length + t + fastpath.BUCKET))
            fastpath.replace(self.lm, runner, bigger, self)
            self.runner, self.cache = bigger, bigger.cache
