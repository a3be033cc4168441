"""Prophet: a small draft head that drafts from the target's own last hidden state.

The prophet is a 1-2 layer causal transformer at the target's width (the idea
of EAGLE and Medusa, our own code). Draft position 0 fuses the target's
last-layer state ``h`` at the position that predicted the newest committed
token with that token's embedding; each later position fuses the prophet's own
output feature at the previous position with the embedding of the token it
just drafted. Causal self-attention runs over these few draft positions only
(a KV cache of at most k entries, rebuilt every step). Features pass through
the target's FROZEN embedding and LM head, which are read from the target at
runtime and never stored; the LM head is restricted to a "draft vocabulary" of
the most frequent tokens (an index tensor in the weights file), because the
49152 x 576 head would otherwise dominate the draft cost on a CPU.
Verification always uses the target's full vocabulary, so greedy output is
exactly greedy, whatever the prophet's weights.

Strategy ``prophet`` runs the shared propose -> verify -> accept loop of
``decoding/speculative.py``; the hidden state comes from the verify forward the
loop already runs (``needs_hidden``), never from an extra target forward.
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .events import ForwardPass
from .models import PRESETS_DIR, LoadedModel
from .params import SamplingParams
from .result import ModelPair, Result
from .sampling import probs as filtered_probs
from .sampling import sample
from .speculative import Draft, SpeculativeParams
from .strategies import Strategy
from .tracer import NULL_TRACER

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

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def for_target(cls, lm: LoadedModel, layers: int = 1) -> "ProphetConfig":
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
                   target=lm.name)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate(x: torch.Tensor, pos: int, theta: float) -> torch.Tensor:
    """RoPE (rotate-half layout, as Llama) for one position; ``x [B, heads, 1, d]``."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)   # [d/2]
    ang = torch.cat([pos * inv, pos * inv]).to(x.dtype)                                   # [d]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * ang.cos() + torch.cat([-x2, x1], dim=-1) * ang.sin()


class ProphetLayer(nn.Module):
    """A pre-norm decoder layer (GQA attention + SwiGLU MLP), one position at a time."""

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

    def forward(self, x: torch.Tensor, cache: list, pos: int) -> torch.Tensor:
        """``x [B, H]`` at draft position ``pos``; ``cache`` (k, v lists) grows by one entry."""
        c, B = self.c, x.shape[0]
        a = self.input_norm(x)
        q = self.q(a).view(B, c.heads, 1, c.head_dim)
        k = self.k(a).view(B, c.kv_heads, 1, c.head_dim)
        v = self.v(a).view(B, c.kv_heads, 1, c.head_dim)
        cache[0].append(_rotate(k, pos, c.rope_theta))
        cache[1].append(v)
        keys, values = torch.cat(cache[0], dim=2), torch.cat(cache[1], dim=2)   # [B, kv, pos+1, d]
        rep = c.heads // c.kv_heads
        keys, values = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)
        att = F.scaled_dot_product_attention(_rotate(q, pos, c.rope_theta), keys, values)   # [B, heads, 1, d]
        x = x + self.o(att.reshape(B, c.hidden))
        m = self.post_norm(x)
        return x + self.down(F.silu(self.gate(m)) * self.up(m))


class Prophet(nn.Module):
    """Trainable: ``fuse``, ``layers``, ``norm``. Frozen, borrowed from the target: embeddings, LM head rows."""

    def __init__(self, config: ProphetConfig, target: LoadedModel, vocab: torch.Tensor) -> None:
        super().__init__()
        self.config = config
        self.fuse = nn.Linear(2 * config.hidden, config.hidden, bias=False)
        with torch.no_grad():   # start as "feature + embedding"
            self.fuse.weight.copy_(torch.cat([torch.eye(config.hidden)] * 2, dim=1))
        self.layers = nn.ModuleList(ProphetLayer(config) for _ in range(config.layers))
        self.norm = RMSNorm(config.hidden, config.eps)
        device = target.device
        self.to(device)
        # frozen target pieces: not parameters, not in the state dict, never saved
        self.embed = target.model.get_input_embeddings().weight.detach()          # [V, H]
        self.vocab = vocab.to(device=device, dtype=torch.long)                      # [Vd] full-vocab ids
        self.head = target.model.get_output_embeddings().weight.detach()[self.vocab].clone()   # [Vd, H]
        full_to_draft = torch.full((target.vocab_size,), -1, dtype=torch.long, device=device)
        full_to_draft[self.vocab] = torch.arange(len(self.vocab), device=device)
        self.full_to_draft = full_to_draft

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
        return feature @ self.head.to(feature.dtype).T

    def new_cache(self) -> list:
        return [([], []) for _ in self.layers]

    def step(self, g: torch.Tensor, token: torch.Tensor, cache: list, pos: int) -> torch.Tensor:
        """One draft position: feature ``g [B, H]`` + token ``[B]`` -> output feature ``[B, H]``."""
        x = self.fuse(torch.cat([g.to(self.dtype), self.embed[token].to(self.dtype)], dim=-1))
        for layer, layer_cache in zip(self.layers, cache):
            x = layer(x, layer_cache, pos)
        return self.norm(x)

    def forward_train(self, h0: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Unrolled with teacher tokens: ``h0 [B, H]``, ``tokens [B, D]`` -> logits ``[B, D, Vd]``, feats ``[B, D, H]``."""
        cache = self.new_cache()
        g, feats = h0, []
        for pos in range(tokens.shape[1]):
            g = self.step(g, tokens[:, pos], cache, pos)
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

    def load_trainable(self, state: dict) -> None:
        self.load_state_dict({k: v.to(self.dtype) for k, v in state.items()})

    def num_trainable(self) -> int:
        return sum(p.numel() for p in self.parameters())


def save_prophet(prophet: Prophet, path: Path, metadata: Optional[dict] = None) -> None:
    """fp16 safetensors (trainable weights + the draft vocabulary) and a config.json beside it."""
    from safetensors.torch import save_file
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.to(torch.float16).contiguous() for k, v in prophet.trainable_state().items()}
    tensors["draft_vocab"] = prophet.vocab.cpu().contiguous()
    meta = {"config": json.dumps(prophet.config.to_dict()), "format": "decoding-playground-prophet-1",
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
    return prophet.to(dtype).eval()


_LOADED: dict[tuple, Prophet] = {}
_LOCK = threading.Lock()


def prophet_for(pair: ModelPair) -> Prophet:
    """``pair.extras["prophet"]`` if given, else the shipped weights for the target's name (cached)."""
    given = pair.extras.get("prophet")
    if given is not None:
        return given
    target = pair.target
    path = PROPHET_DIR / f"{target.name}.safetensors"
    if not path.is_file():
        raise ValueError(f"no prophet weights for target {target.name!r} (looked for {path}); train them with "
                         f"python -m decoding.train_prophet --target {target.name} --export {path}")
    key = (str(path), id(target.model), str(target.device))
    with _LOCK:
        if key not in _LOADED:
            _LOADED[key] = load_prophet(path, target)
        return _LOADED[key]


PROPHET = "prophet"   # the assistant name that selects the target's trained prophet head


def has_prophet(target_name: str) -> bool:
    return (PROPHET_DIR / f"{target_name}.safetensors").is_file()


def make_pair(target: LoadedModel, assistant: Optional[str], load: Any) -> ModelPair:
    """The model pair for an assistant choice: ``None``, ``"prophet"`` (the shipped head) or a model name."""
    if assistant is None:
        return ModelPair(target)
    if assistant == PROPHET:
        return ModelPair(target, None, extras={"prophet": prophet_for(ModelPair(target))})
    return ModelPair(target, load(assistant))


# --------------------------------------------------------------------------- the drafter

class ProphetDrafter:
    """Drafts k tokens from the target's hidden state; q_draft is zero outside the draft vocabulary."""

    source = "prophet"
    needs_hidden = True

    def __init__(self, prophet: Prophet, params: SamplingParams, *, tracer: Any = NULL_TRACER,
                 clock: Any = None, rng: Optional[torch.Generator] = None) -> None:
        self.prophet, self.params, self.rng, self.tracer = prophet, params, rng, tracer
        self.clock = clock or (lambda: 0)
        self.greedy = params.is_greedy
        self.keep_q = not self.greedy or tracer.enabled
        self.threshold = float(getattr(params, "confidence_threshold", 0.0) or 0.0)
        self.forwards = 0
        self.ms = 0.0
        self.hidden: Optional[torch.Tensor] = None

    def observe(self, hidden: torch.Tensor) -> None:
        """The target's last-layer state ``[H]`` at the position that predicted the newest committed token."""
        self.hidden = hidden

    def _full_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        full = torch.full((self.prophet.full_to_draft.shape[0],), float("-inf"), device=draft_logits.device)
        full[self.prophet.vocab] = draft_logits.float()
        return full                                                                # [V]

    @torch.inference_mode()
    def propose(self, context: Sequence[int], k: int) -> Draft:
        h = self.hidden
        if k <= 0 or h is None:
            return Draft([])
        p = self.prophet
        cache = p.new_cache()
        g, token = h[None].to(p.dtype), torch.tensor([context[-1]], device=p.device)
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        q_token: list[float] = []
        for pos in range(k):
            # 1. one prophet position -> draft-vocabulary logits
            t0 = time.perf_counter()
            g = p.step(g, token, cache, pos)                                        # [1, H]
            logits = p.draft_logits(g)[0]                                            # [Vd]
            # 2. a token: argmax, or a sample from the filtered q_draft over the full vocabulary
            if self.greedy:
                tok = int(p.vocab[int(logits.argmax())])
                q = self._full_logits(logits).softmax(-1) if self.keep_q else None
            else:
                q = filtered_probs(self._full_logits(logits), self.params)          # [V]
                tok = sample(q, self.rng)
            ms = (time.perf_counter() - t0) * 1e3
            self.forwards += 1
            self.ms += ms
            if self.tracer.enabled:
                self.tracer.emit(ForwardPass(step=self.clock(), model="draft", positions=1, ms=round(ms, 3),
                                             kind="draft"))
            # 3. an unsure head stops early: every drafted token costs a verified position
            if tokens and self.threshold and float(logits.softmax(-1).max()) < self.threshold:
                break
            tokens.append(tok)
            if q is not None:
                rows.append(q)
                q_token.append(float(q[tok]))
            token = torch.tensor([tok], device=p.device)
        return Draft(tokens, torch.stack(rows) if rows else None, q_token)

    def feedback(self, drafted: int, accepted: int) -> None:
        pass   # nothing cached across steps: the next draft starts from the new hidden state


# --------------------------------------------------------------------------- strategy

@dataclass(frozen=True)
class ProphetParams(SpeculativeParams):
    """Prophet head drafting; temperature 0 = greedy verification (lossless).

    The same knobs as ``speculative`` (and validated the same way):
    ``draft_tokens``, ``adaptive``, and ``confidence_threshold``, below which
    the head stops drafting (the first token is always drafted).
    """


def prophet(prompt_ids: Sequence[int], pair: ModelPair, params: ProphetParams, *, max_new_tokens: int,
            tracer: Any = NULL_TRACER, rng: Optional[torch.Generator] = None) -> Result:
    """Speculative decoding with the target's prophet head drafting."""
    from .lm import Session
    from .speculative import speculative_loop
    if pair.target.is_encoder_decoder:
        raise ValueError("strategy 'prophet' supports decoder-only targets")
    head = prophet_for(pair)
    target = Session(pair.target, "target", tracer, fast=params.fast,
                     max_len=len(prompt_ids) + max_new_tokens + 40)
    drafter = ProphetDrafter(head, params, tracer=tracer, clock=lambda: target.forwards + 1, rng=rng)
    return speculative_loop(prompt_ids, pair, params, drafter, draft_tokens=params.draft_tokens,
                            adaptive=params.adaptive, max_new_tokens=max_new_tokens, tracer=tracer, rng=rng,
                            target=target)


STRATEGIES = [
    Strategy("prophet", ProphetParams, prophet, lossless=True, needs_assistant=False, label="Prophet head",
             description="A 1-layer head trained on the target's own hidden states drafts k tokens; "
                         "the target verifies them in one forward."),
]
