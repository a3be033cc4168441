"""Prophet: a small draft head that drafts from the target's own last hidden states.

The prophet is a 1-2 layer causal transformer at the target's width (the idea
of EAGLE and Medusa, our own code). Each committed answer token ``t[i]`` gives
one input pair: the target's last-layer state ``h[i]`` at the position that
predicted it, fused with ``t[i]``'s embedding; the output feature at that pair
predicts ``t[i+1]``. The pairs of every committed answer position stay in the
prophet's own KV cache (``config.context``; heads trained before it kept only
the newest pair), so a new draft attends to the whole answer so far. Draft
step ``j`` fuses the prophet's own previous output feature with the token it
just drafted and attends to the committed pairs plus the earlier steps of the
same draft, which are thrown away after verification. Features pass through
the target's FROZEN embedding and LM head, which are read from the target at
runtime and never stored; the LM head is restricted to a "draft vocabulary" of
the most frequent tokens (an index tensor in the weights file), because the
49152 x 576 head would otherwise dominate the draft cost on a CPU.
Verification always uses the target's full vocabulary, so greedy output is
exactly greedy, whatever the prophet's weights.

Drafting (``decoding/drafting/prophet.py``, a chain or an EAGLE-2-style
dynamic tree) runs inside the shared propose -> verify -> accept loop of
``decoding/strategies/speculative.py`` (strategy ``prophet``); the hidden states come from
the verify forward the loop already runs (``needs_hidden``), never from an
extra target forward.
Training (``playground/train_prophet.py``) runs every anchor of whole answers in
one parallel forward whose attention masks give each anchor and draft step
exactly what the drafter sees (a test checks they agree).
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from decoding.runtime import kernels
from decoding.runtime.models import PRESETS_DIR, LoadedModel, load_presets

PROPHET_DIR = PRESETS_DIR / "prophet"


# --------------------------------------------------------------------------- the model

@dataclass(frozen=True)
class ProphetConfig:
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    layers: int = 1
    rope_theta: float = 10000.0
    eps: float = 1e-5
    target_vocab: int = 0
    target: str = ""
    context: bool = False      # attend to every committed answer pair (EAGLE-style), not just the newest
    # EAGLE-3-style fusion: indices into the target's hidden-state tuple (0 = embeddings, i = output of
    # decoder layer i) whose states join the last-layer state of each committed pair; () = last layer only
    feature_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:   # from JSON the indices arrive as a list
        object.__setattr__(self, "feature_layers", tuple(int(i) for i in self.feature_layers))

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def for_target(cls, lm: LoadedModel, layers: int = 1, context: bool = True,
                   feature_layers: tuple[int, ...] = ()) -> "ProphetConfig":
        """The target's own layer shape (so its last layers can initialize ours)."""
        c = lm.model.config
        hidden = int(c.hidden_size)
        heads = int(getattr(c, "num_attention_heads", max(1, hidden // 64)))
        rope = getattr(c, "rope_parameters", None) or {}
        theta = float(rope.get("rope_theta", getattr(c, "rope_theta", 10000.0)) if isinstance(rope, dict)
                      else getattr(c, "rope_theta", 10000.0))
        return cls(hidden=hidden, heads=heads, kv_heads=int(getattr(c, "num_key_value_heads", None) or heads),
                   intermediate=int(getattr(c, "intermediate_size", None) or 4 * hidden), layers=layers,
                   rope_theta=theta, eps=float(getattr(c, "rms_norm_eps", 1e-5)), target_vocab=lm.vocab_size,
                   target=lm.name, context=context, feature_layers=tuple(feature_layers))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _angles(pos: torch.Tensor, d: int, theta: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE's cos and sin ``[T, d]`` (float32) at absolute positions ``pos [T]``."""
    inv = theta ** (-torch.arange(0, d, 2, device=device, dtype=torch.float32) / d)     # [d/2]
    ang = pos.to(device=device, dtype=torch.float32)[:, None] * inv[None]               # [T, d/2]
    ang = torch.cat([ang, ang], dim=-1)                                                 # [T, d]
    # cos/sin in float32 first: a bfloat16 angle is off by up to 0.25 rad at position 100
    return ang.cos(), ang.sin()


def _rotate(x: torch.Tensor, pos: torch.Tensor, theta: float,
            angles: Optional[tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
    """RoPE (rotate-half layout, as Llama); ``x [B, heads, T, d]``, ``pos [T]`` absolute positions; ``angles``:
    :func:`_angles` for them, when the caller rotates more than one tensor at the same positions."""
    d = x.shape[-1]
    cos, sin = angles if angles is not None else _angles(pos, d, theta, x.device)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def _joined_linear(parts: tuple) -> nn.Linear:
    """One bias-free linear whose output is the outputs of ``parts`` side by side (frozen weights)."""
    weight = torch.cat([p.weight.detach() for p in parts])
    joined = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    joined.weight = nn.Parameter(weight, requires_grad=False)
    return joined


class ProphetLayer(nn.Module):
    """A pre-norm decoder layer (GQA attention + SwiGLU MLP); the caller assembles the keys."""

    def __init__(self, c: ProphetConfig) -> None:
        super().__init__()
        self.c = c
        d = c.head_dim
        self.input_norm = RMSNorm(c.hidden, c.eps)
        self.q = nn.Linear(c.hidden, c.heads * d, bias=False)
        self.k = nn.Linear(c.hidden, c.kv_heads * d, bias=False)
        self.v = nn.Linear(c.hidden, c.kv_heads * d, bias=False)
        self.o = nn.Linear(c.heads * d, c.hidden, bias=False)
        self.post_norm = RMSNorm(c.hidden, c.eps)
        self.gate = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.up = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.down = nn.Linear(c.intermediate, c.hidden, bias=False)

    def project(self, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x [B, T, H]`` at positions ``pos [T]`` -> rotated q ``[B, heads, T, d]``, rotated k and v ``[B, kv, T, d]``."""
        c, (B, T) = self.c, x.shape[:2]
        a = self.input_norm(x)
        q = self.q(a).view(B, T, c.heads, c.head_dim).transpose(1, 2)
        k = self.k(a).view(B, T, c.kv_heads, c.head_dim).transpose(1, 2)
        v = self.v(a).view(B, T, c.kv_heads, c.head_dim).transpose(1, 2)
        angles = _angles(pos, c.head_dim, c.rope_theta, x.device)      # once for q and k
        return _rotate(q, pos, c.rope_theta, angles), _rotate(k, pos, c.rope_theta, angles), v

    def attend(self, x: torch.Tensor, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               mask: Optional[torch.Tensor]) -> torch.Tensor:
        """Attention of ``q`` over ``keys``/``values`` (``mask [T, K]`` bool, True = visible), then the MLP."""
        B, T = x.shape[:2]
        att = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                             enable_gqa=self.c.heads != self.c.kv_heads)   # [B, heads, T, d]
        x = x + self.o(att.transpose(1, 2).reshape(B, T, self.c.hidden))
        m = self.post_norm(x)
        return x + self.down(F.silu(self.gate(m)) * self.up(m))

    # ------------------------------------------------------------------ inference rows (no batch axis)
    def qkv_rows(self, a: torch.Tensor) -> torch.Tensor:
        """``a [K, H]`` (normalized) -> ``[K, (heads + 2 kv) d]``: q, k and v side by side, as one product when
        ``Prophet.pack`` joined them (weights frozen from then on)."""
        joined = self.__dict__.get("joined_qkv")
        if joined is not None and not torch.is_grad_enabled():
            return joined(a)
        return torch.cat([self.q(a), self.k(a), self.v(a)], dim=-1)

    def mlp_rows(self, m: torch.Tensor) -> torch.Tensor:
        """SwiGLU on ``m [K, H]``; gate and up as one product when ``Prophet.pack`` joined them."""
        joined = self.__dict__.get("joined_gate_up")
        if joined is not None and not torch.is_grad_enabled():
            gu = joined(m)
            return self.down(F.silu(gu[:, :self.c.intermediate]) * gu[:, self.c.intermediate:])
        return self.down(F.silu(self.gate(m)) * self.up(m))


class ProphetState:
    """The drafter's per-generation cache: each layer's keys/values over the committed pairs it has seen.

    Kept in buffers ``[1, kv, capacity, d]`` per layer, grown by doubling: the committed pairs' rows first
    (``length`` of them), then the current draft's scratch rows, which the next ``extend`` overwrites. A draft
    step writes its rows in place and attends to a view: no per-call concatenation of the whole cache."""

    def __init__(self, layers: int) -> None:
        self.key_buf: list[Optional[torch.Tensor]] = [None] * layers
        self.value_buf: list[Optional[torch.Tensor]] = [None] * layers
        self.length = 0     # committed pairs held in the cache (all of them with context, else the newest)
        self.n = 0          # committed pairs seen (the next pair's absolute position)

    @property
    def keys(self) -> list[Optional[torch.Tensor]]:
        """Each layer's keys ``[1, kv, length, d]`` over the committed pairs (views)."""
        return [None if b is None or not self.length else b[:, :, :self.length] for b in self.key_buf]

    @property
    def values(self) -> list[Optional[torch.Tensor]]:
        return [None if b is None or not self.length else b[:, :, :self.length] for b in self.value_buf]

    def room(self, need: int, filled: int, like: torch.Tensor) -> None:
        """Buffers of at least ``need`` rows, keeping the first ``filled``; ``like``: a ``[1, kv, 1, d]`` row."""
        cap = 0 if self.key_buf[0] is None else self.key_buf[0].shape[2]
        if need <= cap:
            return
        cap = max(need, 2 * cap, 64)
        for bufs in (self.key_buf, self.value_buf):
            for i, old in enumerate(bufs):
                new = like.new_empty(like.shape[0], like.shape[1], cap, like.shape[3])
                if old is not None and filled:
                    new[:, :, :filled].copy_(old[:, :, :filled])
                bufs[i] = new


class DraftScratch:
    """One draft's rows in the state's buffers, after the committed ones: how many are filled."""

    def __init__(self) -> None:
        self.used = 0


class Prophet(nn.Module):
    """Trainable: ``fuse``, ``layers``, ``norm``. Frozen, borrowed from the target: embeddings, LM head rows.

    Input pair ``i`` fuses the target's state ``h[i]`` (the one that predicted
    committed token ``t[i]``) with ``t[i]``'s embedding; its output feature
    predicts ``t[i+1]``. With ``config.context`` the pairs of every committed
    answer position stay in a KV cache that each new pair and each draft step
    attends to (as EAGLE); without it only the newest pair is kept. Draft step
    ``j`` fuses the head's own previous output feature with the token it just
    drafted and attends to the committed pairs plus the earlier draft steps.
    """

    def __init__(self, config: ProphetConfig, target: LoadedModel, vocab: torch.Tensor) -> None:
        super().__init__()
        self.config = config
        self.fuse = nn.Linear(2 * config.hidden, config.hidden, bias=False)
        with torch.no_grad():   # start as "feature + embedding"
            self.fuse.weight.copy_(torch.cat([torch.eye(config.hidden)] * 2, dim=1))
        self.layers = nn.ModuleList(ProphetLayer(config) for _ in range(config.layers))
        self.norm = RMSNorm(config.hidden, config.eps)
        k = len(config.feature_layers)
        if k:   # each intermediate state normalized, then [last, low, mid, ...] -> H; starts as "last only"
            self.feature_norms = nn.ModuleList(RMSNorm(config.hidden, config.eps) for _ in range(k))
            self.reduce = nn.Linear((k + 1) * config.hidden, config.hidden, bias=False)
            with torch.no_grad():
                self.reduce.weight.zero_()
                self.reduce.weight[:, :config.hidden].copy_(torch.eye(config.hidden))
        device = target.device
        self.to(device)
        # frozen target pieces: not parameters, not in the state dict, never saved
        self.embed = target.model.get_input_embeddings().weight.detach()          # [V, H]
        self.vocab = vocab.to(device=device, dtype=torch.long)                      # [Vd] full-vocab ids
        self.head = target.model.get_output_embeddings().weight.detach()[self.vocab].clone()   # [Vd, H]
        full_to_draft = torch.full((target.vocab_size,), -1, dtype=torch.long, device=device)
        full_to_draft[self.vocab] = torch.arange(len(self.vocab), device=device)
        self.full_to_draft = full_to_draft
        self._packed_head: Optional[nn.Module] = None
        self.kernels = "default"                # how the inference linears run (``pack``)

    @property
    def device(self) -> torch.device:
        return self.fuse.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.fuse.weight.dtype

    def to_draft_ids(self, full_ids: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary ids -> draft-vocabulary indices (-1 when outside it or negative)."""
        return torch.where(full_ids >= 0, self.full_to_draft[full_ids.clamp_min(0)], -1)

    def draft_logits(self, feature: torch.Tensor) -> torch.Tensor:
        if self._packed_head is not None and not torch.is_grad_enabled():
            return self._packed_head(feature)
        return feature @ self.head.to(feature.dtype).T

    def pack(self, half: bool = True, int8: bool = False) -> int:
        """Inference kernels on the CPU (see ``decoding/runtime/kernels.py``); how many layers were swapped (0: none).

        ``half``: float16 weights (``kernels.HalfLinear``, on the project's kernel where it builds) where the
        build has FBGEMM. ``int8``: int8 weights and activations (``kernels.W8A8Linear``) where the project's int8
        kernel passes its checks: a quarter of float32's bytes. The head only drafts, so rounding its weights
        changes at most which tokens are proposed, never what is committed; it cuts the bytes a draft step reads.
        Otherwise oneDNN's packed float32 kernels.
        """
        cpu32 = self.dtype == torch.float32 and self.device.type == "cpu"
        use_int8 = int8 and cpu32 and kernels.w8a8_available()
        use_half = not use_int8 and half and cpu32 and kernels.half_available()
        if use_int8:
            swapped = kernels.w8a8_linears(self)
        else:
            swapped = kernels.half_linears(self) if use_half else kernels.pack_linears(self)
        if swapped:
            head = nn.Linear(self.config.hidden, len(self.vocab), bias=False, device="meta")
            head.weight = nn.Parameter(self.head.to(self.dtype), requires_grad=False)
            # a plain attribute, as PackedLinear.packed: a submodule would add its weight to state_dict()
            wrap = (kernels.W8A8Linear if use_int8 else kernels.half_wrapper() if use_half
                    else kernels.PackedLinear)
            object.__setattr__(self, "_packed_head", wrap(head))
            for layer in self.layers:   # q|k|v and gate|up as one product each (plain attributes, as above)
                for name, parts in (("joined_qkv", (layer.q, layer.k, layer.v)),
                                    ("joined_gate_up", (layer.gate, layer.up))):
                    object.__setattr__(layer, name, wrap(_joined_linear(parts)))
            self.kernels = ("int8-weights-and-activations" if use_int8 else "fp16-weights" if use_half
                            else "onednn-packed")
        return swapped

    def features(self, hidden: torch.Tensor, extra: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The state a committed pair feeds: the last-layer state ``hidden [..., H]``, fused with the
        intermediate layers' states ``extra [..., k, H]`` (``config.feature_layers``) when the head uses them."""
        k = len(self.config.feature_layers)
        if not k:
            return hidden
        if extra is None or extra.shape[-2] != k:
            raise ValueError(f"this prophet head fuses the target's layers {self.config.feature_layers}; "
                             f"their states were not given")
        parts = [hidden.to(self.dtype)] + [norm(extra[..., i, :].to(self.dtype))
                                           for i, norm in enumerate(self.feature_norms)]
        return self.reduce(torch.cat(parts, dim=-1))

    def _fuse(self, g: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self.fuse(torch.cat([g.to(self.dtype), self.embed[tokens].to(self.dtype)], dim=-1))

    # ------------------------------------------------------------------ inference
    def new_state(self) -> ProphetState:
        return ProphetState(len(self.layers))

    def extend(self, state: ProphetState, hidden: torch.Tensor, tokens: torch.Tensor,
               extra: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Add committed pairs (``hidden [m, H]``, ``tokens [m]``; ``extra [m, k, H]``: the fused layers'
        states, for a head with ``config.feature_layers``); the newest pair's output feature ``[1, H]``."""
        if not self.config.context:      # only the newest pair is ever attended to
            state.n += hidden.shape[0] - 1
            hidden, tokens = hidden[-1:], tokens[-1:]
            extra = None if extra is None else extra[-1:]
            state.length = 0
        m = hidden.shape[0]
        x = self._fuse(self.features(hidden, extra), tokens)                        # [m, H]
        old = state.length
        # the new pairs see every older pair and, causally, each other
        mask = torch.ones(m, old + m, dtype=torch.bool, device=self.device).tril(old) if m > 1 else None
        x = self._rows_through(state, x, state.n, old, mask)
        state.n += m
        state.length = old + m
        return self.norm(x[-1:])

    def new_scratch(self) -> DraftScratch:
        """One draft's scratch: its positions' keys/values go after the committed pairs', thrown away after."""
        return DraftScratch()

    def draft_nodes(self, state: ProphetState, scratch: DraftScratch, g: torch.Tensor, tokens: torch.Tensor,
                    pos: torch.Tensor | int, visible: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``K`` draft positions at once: parents' features ``g [K, H]`` + their tokens ``[K]`` -> features ``[K, H]``.

        Each position sits at absolute position ``pos [K]`` (an int: ``pos .. pos + K - 1``) and attends to every
        committed pair, to the draft positions already in ``scratch`` that
        ``visible [K, S]`` marks (its ancestors; all of them when ``visible`` is
        None) and to itself. Its keys/values are added to ``scratch``, which is
        thrown away after the draft. A chain is ``K = 1`` with ``visible`` None.
        """
        K = g.shape[0]
        x = self._fuse(g, tokens)                                                   # [K, H]
        n, old = state.length, scratch.used
        mask = None
        if K > 1 or (visible is not None and not bool(visible.all())):
            mask = torch.zeros(K, n + old + K, dtype=torch.bool, device=self.device)
            mask[:, :n] = True
            if old:
                mask[:, n:n + old] = True if visible is None else visible
            mask[:, n + old:] = torch.eye(K, dtype=torch.bool, device=self.device)
        x = self._rows_through(state, x, pos, n + old, mask)
        scratch.used = old + K
        return self.norm(x)

    def _rope(self, pos: torch.Tensor | int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE's cos and sign-folded sin ``[rows, d]`` at absolute positions ``pos [rows]`` (or ``pos ..
        pos + rows - 1`` for an int), from a table grown on demand: the same values ``_angles`` computes."""
        top = (pos + rows) if isinstance(pos, int) else int(pos.max()) + 1
        table = self.__dict__.get("_rope_table")
        if table is None or table[0].shape[0] < top:
            d = self.config.head_dim
            cos, sin = _angles(torch.arange(max(top, 2 * (0 if table is None else table[0].shape[0]), 256),
                                            device=self.device), d, self.config.rope_theta, self.device)
            # rotate_half(x) * sin == roll(x, d/2) * [-sin_1, sin_2]: one roll instead of slices, neg and cat
            sin = torch.cat([-sin[:, :d // 2], sin[:, d // 2:]], dim=-1)
            table = self.__dict__["_rope_table"] = (cos, sin)
        if isinstance(pos, int):
            return table[0][pos:pos + rows], table[1][pos:pos + rows]
        return table[0][pos], table[1][pos]

    def _rows_through(self, state: ProphetState, x: torch.Tensor, pos: torch.Tensor | int, start: int,
                      mask: Optional[torch.Tensor]) -> torch.Tensor:
        """``x [K, H]`` through every layer at positions ``pos``; each layer's new keys/values are written at
        rows ``start .. start + K`` of the state's buffers, and the rows attend to rows ``0 .. start + K``
        (``mask [K, start + K]``, True = visible; None: all)."""
        c, K = self.config, x.shape[0]
        h, kv, d = c.heads, c.kv_heads, c.head_dim
        cos, sin = self._rope(pos, K)
        cos, sin = cos.to(x.dtype)[:, None], sin.to(x.dtype)[:, None]                 # [K, 1, d]
        state.room(start + K, start, x.new_empty(1, kv, 1, d))
        for i, layer in enumerate(self.layers):
            y = layer.qkv_rows(layer.input_norm(x)).view(K, h + 2 * kv, d)
            qk = y[:, :h + kv]
            qk = qk * cos + qk.roll(d // 2, -1) * sin                                   # RoPE on q and k at once
            keys, values = state.key_buf[i], state.value_buf[i]
            keys[0, :, start:start + K] = qk[:, h:].transpose(0, 1)
            values[0, :, start:start + K] = y[:, h + kv:].transpose(0, 1)
            att = F.scaled_dot_product_attention(qk[:, :h].transpose(0, 1)[None], keys[:, :, :start + K],
                                                 values[:, :, :start + K], attn_mask=mask,
                                                 enable_gqa=h != kv)                    # [1, h, K, d]
            x = x + layer.o(att[0].transpose(0, 1).reshape(K, h * d))
            x = x + layer.mlp_rows(layer.post_norm(x))
        return x

    def draft_step(self, state: ProphetState, scratch: DraftScratch, g: torch.Tensor, token: torch.Tensor,
                   j: int) -> torch.Tensor:
        """Chain draft step ``j >= 1``: own feature ``g [1, H]`` + drafted token ``[1]`` -> feature ``[1, H]``."""
        return self.draft_nodes(state, scratch, g, token, state.n - 1 + j)

    # ------------------------------------------------------------------ training
    def forward_train(self, hidden: torch.Tensor, tokens: torch.Tensor, depth: int,
                      extra: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Every anchor of whole answers at once, unrolled ``depth`` draft steps with teacher tokens.

        ``hidden [B, S, H]``, ``tokens [B, S]`` (>= 0; padding after each answer); ``extra [B, S, k, H]``
        the fused layers' states for a head with ``config.feature_layers``.
        Returns logits ``[B, D, S, Vd]`` and features ``[B, D, S, H]``: step ``j``
        at anchor ``i`` predicts ``tokens[i + j + 1]``, seeing exactly what the
        drafter would see (committed pairs ``<= i``, or only ``i`` without
        context, plus draft steps ``1..j`` of the same anchor).
        """
        B, S = tokens.shape
        dev = hidden.device
        pos = torch.arange(S, device=dev)
        eye = torch.eye(S, dtype=torch.bool, device=dev)
        base = torch.ones(S, S, dtype=torch.bool, device=dev).tril() if self.config.context else eye
        x = self._fuse(self.features(hidden, extra), tokens)
        keys: list[list[torch.Tensor]] = []
        values: list[list[torch.Tensor]] = []
        for layer in self.layers:
            q, k, v = layer.project(x, pos)
            keys.append([k])
            values.append([v])
            x = layer.attend(x, q, k, v, base)
        g = self.norm(x)
        feats = [g]
        for j in range(1, depth):
            shifted = torch.cat([tokens[:, j:], tokens.new_zeros(B, min(j, S))], dim=1)[:, :S]
            x = self._fuse(g, shifted)
            mask = torch.cat([base] + [eye] * j, dim=1)                              # [S, S * (j + 1)]
            for i, layer in enumerate(self.layers):
                q, k, v = layer.project(x, pos + j)
                keys[i].append(k)
                values[i].append(v)
                x = layer.attend(x, q, torch.cat(keys[i], dim=2), torch.cat(values[i], dim=2), mask)
            g = self.norm(x)
            feats.append(g)
        f = torch.stack(feats, dim=1)
        return self.draft_logits(f), f

    # ------------------------------------------------------------------ weights
    def init_from_target(self, lm: LoadedModel) -> None:
        """Copy the target's last decoder layers (and final norm) when their shapes match ours."""
        decoder = getattr(lm.model, "model", None)
        blocks = getattr(decoder, "layers", None)
        if blocks is None or len(blocks) < len(self.layers):
            return
        names = {"input_norm.weight": "input_layernorm.weight", "post_norm.weight": "post_attention_layernorm.weight",
                 "q.weight": "self_attn.q_proj.weight", "k.weight": "self_attn.k_proj.weight",
                 "v.weight": "self_attn.v_proj.weight", "o.weight": "self_attn.o_proj.weight",
                 "gate.weight": "mlp.gate_proj.weight", "up.weight": "mlp.up_proj.weight",
                 "down.weight": "mlp.down_proj.weight"}
        with torch.no_grad():
            for ours, theirs in zip(self.layers, list(blocks)[-len(self.layers):]):
                src = theirs.state_dict()
                for mine, name in names.items():
                    if name in src and src[name].shape == ours.state_dict()[mine].shape:
                        ours.get_parameter(mine).copy_(src[name])
            if getattr(decoder, "norm", None) is not None and decoder.norm.weight.shape == self.norm.weight.shape:
                self.norm.weight.copy_(decoder.norm.weight)

    def trainable_state(self) -> dict:
        return {k: v.detach().cpu().clone() for k, v in self.state_dict().items()}

    def load_trainable(self, state: dict, fresh_fusion: bool = False) -> None:
        """Load trainable weights; ``fresh_fusion``: a head without layer fusion may start a fusion head
        (its fusion weights keep their "last layer only" start)."""
        result = self.load_state_dict({k: v.to(self.dtype) for k, v in state.items()}, strict=not fresh_fusion)
        if fresh_fusion:
            wrong = [k for k in result.missing_keys if not k.startswith(("reduce.", "feature_norms."))]
            if wrong or result.unexpected_keys:
                raise ValueError(f"weights do not fit this head: missing {wrong}, unexpected {result.unexpected_keys}")

    def num_trainable(self) -> int:
        return sum(p.numel() for p in self.parameters())


def save_prophet(prophet: Prophet, path: Path, metadata: Optional[dict] = None) -> None:
    """fp16 safetensors (trainable weights + the draft vocabulary) and a config.json beside it."""
    from safetensors.torch import save_file
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.to(torch.float16).contiguous() for k, v in prophet.trainable_state().items()}
    tensors["draft_vocab"] = prophet.vocab.cpu().contiguous()
    meta = {"config": json.dumps(prophet.config.to_dict()), "format": "decoding-playground-prophet-2",
            **(metadata or {})}
    save_file(tensors, str(path), metadata=meta)
    (path.parent / "config.json").write_text(json.dumps(prophet.config.to_dict(), indent=2) + "\n")


def load_prophet(path: Path, target: LoadedModel) -> Prophet:
    """A prophet for ``target`` from a weights file written by :func:`save_prophet`."""
    from safetensors import safe_open
    from safetensors.torch import load_file
    with safe_open(str(path), framework="pt") as fh:
        config = ProphetConfig(**json.loads(fh.metadata()["config"]))
    if config.hidden != target.model.config.hidden_size or config.target_vocab != target.vocab_size:
        raise ValueError(f"prophet weights {path} were trained for {config.target!r} (hidden {config.hidden}, "
                         f"vocab {config.target_vocab}); target {target.name!r} does not match")
    tensors = load_file(str(path))
    vocab = tensors.pop("draft_vocab")
    prophet = Prophet(config, target, vocab)
    prophet.load_trainable(tensors)
    dtype = target.dtype if target.device.type == "cuda" else torch.float32
    prophet = prophet.to(dtype).eval()
    if prophet.device.type == "cpu":       # a target on int8 weights and activations drafts on them too: its
        # greedy step is short enough that the head's float16 reads were a tenth of a prophet step (bundled model,
        # AMD EPYC Zen 5: a prophet step 2.10 -> 1.91 greedy steps, 1.25x -> 1.33x greedy on unseen prompts)
        prophet.pack(int8=getattr(target, "weights", "full") == "w8a8")
    return prophet


_LOCK = threading.Lock()


def head_file(name: str) -> Path:
    """Where the shipped head for the model named ``name`` is (it may not exist): by that name, or, for a preset
    that only rounds another's weights (``weights: fp16``, no adapter), by the name of that base preset: the
    same model to float16 precision, so the same head applies."""
    path = PROPHET_DIR / f"{name}.safetensors"
    preset = load_presets().get(name)
    if not path.is_file() and preset is not None and preset.base and not preset.adapter:
        return PROPHET_DIR / f"{preset.base}.safetensors"
    return path


def shipped_head(target: LoadedModel) -> Path:
    """``head_file`` of a loaded target."""
    return head_file(target.name)


def prophet_for(target: LoadedModel) -> Prophet:
    """The shipped prophet weights for ``target`` (``shipped_head``), loaded once per loaded model."""
    with _LOCK:   # kept on the target: evicting the target frees its head (which borrows its embeddings)
        head = target.state.prophet_head
        if head is None:                       # only then is the file looked up (it reads the presets)
            path = shipped_head(target)
            if not path.is_file():
                raise ValueError(f"no prophet head is shipped for target {target.name!r}; train one with "
                                 f"python -m playground.train_prophet --target {target.name}")
            head = target.state.prophet_head = load_prophet(path, target)
        return head


