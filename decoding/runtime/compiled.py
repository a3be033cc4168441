"""The compiled CPU path: the fast path's static cache, with the forward compiled by PyTorch's inductor.

Why: on a small model a CPU forward is mostly per-operator overhead, not weight traffic. On an Intel Xeon
(2 vCPUs) the bundled model's one-position forward spends about 17 ms of 30-55 in its matrix products; the
rest is some 40 small operators per layer (casts, norms, rotary, the attention's glue) and transformers'
Python. Inductor fuses the elementwise work into a few C++ loops per layer and calls the products as they
are (oneDNN/MKL), so a forward costs little more than its products.

How, and why it stays exact:

* The fast path (``fastpath.StaticRunner``) keeps a static KV cache, one tensor per layer. The compiled graph
  takes a forward's rows, their positions, a mask over the cache's first ``span`` slots and the slots to write,
  and writes the rows' keys and values into the cache itself.
* Every size that varies is a symbol (rows, span, capacity), so one graph serves every width up to
  :data:`ROWS` (wider forwards run in chunks of it) and every capacity. One row or twenty, the same code runs:
  a row gets the same bits whatever the width. Inductor's own cache keeps the graph on disk across restarts
  (:func:`cache_dir`); ``runtime/warmup.warm`` compiles it ahead of visitors.
* Attention runs row by row: each query row is its own batch element, over the cache as a one-position forward
  would read it (its visible keys first, in position order, over a key length rounded up to 16). A chain row
  reads the cache in slot order; a tree or window row reads a gathered layout, the cache and then its own
  ancestors. So a verify forward's rows equal the one-position forwards of compiled greedy, bit for bit for
  the bfloat16-weight model, which rounds between its layers and needs it. Compiled greedy is the reference
  in this mode ("greedy in the same mode").
* Linear layers stay the project's kernels (``kernels.onednn_linear`` is an opaque custom op to the compiler);
  a float32 model's per-row-bucket kernel choice runs its one-row kernel in the graph.
* Prefill (long, variable length) runs eagerly, for greedy and every strategy alike; so does every model
  :func:`why_not` refuses, with the reason shown.

Only llama-shaped decoder-only models are compiled (the bundled SmolLM2 and its reduced-weight presets, and
the tiny random Llama of the tests); :func:`why_not` names what keeps any other model eager.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
import types
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

from decoding.runtime.kernels import HalfLinear

ROWS = 32                                       # rows per call of the graph; wider forwards run in chunks
MODEL_TYPES = ("llama", "mistral", "qwen2")     # same layer shape: pre-norm, rotary q/k, GQA, gated MLP
ENV_SWITCH = "DECODING_COMPILE"                # "0" keeps every forward eager
_COMPILE_LOCK = threading.Lock()               # one compilation at a time (dynamo is not re-entrant)


def cache_dir() -> Path:
    """Where inductor keeps compiled graphs across restarts (``TORCHINDUCTOR_CACHE_DIR`` wins)."""
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen:
        return Path(chosen)
    root = Path(os.environ.get("DECODING_CACHE_DIR") or Path.home() / ".cache" / "decoding-playground")
    return root / "inductor"


def compiler_missing() -> Optional[str]:
    """Why this machine cannot compile at all (None if it can)."""
    if os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "off", "no"):
        return f"turned off ({ENV_SWITCH}=0)"
    try:
        import torch._inductor.config as inductor_config   # noqa: F401
    except Exception as exc:           # a build without inductor
        return f"this PyTorch has no inductor ({type(exc).__name__})"
    cxx = os.environ.get("CXX") or "g++"
    if not any(shutil.which(c) for c in (cxx, "g++", "c++", "clang++")):
        return "no C++ compiler on this machine (inductor needs g++ or clang++)"
    return None


def why_not(lm: Any) -> Optional[str]:
    """Why ``lm``'s forwards stay eager (None: they can be compiled)."""
    missing = compiler_missing()
    if missing:
        return missing
    if lm.device.type != "cpu":
        return "not a CPU model (a GPU uses CUDA graphs)"
    if lm.is_encoder_decoder:
        return "an encoder-decoder model"
    config = lm.model.config
    kind = getattr(config, "model_type", "?")
    if kind not in MODEL_TYPES:
        return f"architecture {kind!r} (the compiled path takes {', '.join(MODEL_TYPES)})"
    if any(t != "full_attention" for t in (getattr(config, "layer_types", None) or [])):
        return "sliding-window layers"
    body = getattr(lm.model, "model", None)
    layers = getattr(body, "layers", None)
    if body is None or not layers or not hasattr(body, "rotary_emb") or not hasattr(lm.model, "lm_head"):
        return "an unexpected module layout"
    attn = layers[0].self_attn
    if hasattr(attn, "q_norm") or not all(hasattr(attn, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj")):
        return "an unexpected attention layout"
    if any(isinstance(m, HalfLinear) for m in lm.model.modules()):
        return "float16-weight linears (FBGEMM's prepacked weights are opaque to the compiler)"
    return None


class Engine:
    """One model's compiled forwards: one graph per (hidden states asked for, gathered layout or not)."""

    def __init__(self, lm: Any) -> None:
        self.lm = lm
        self.calls = 0                     # forwards that ran compiled (the tests' counter)
        self.compile_s: dict[tuple, float] = {}
        self._graphs: dict[tuple, Callable] = {}
        body = lm.model.model
        self._body, self._head = body, lm.model.lm_head
        config = lm.model.config
        self._head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

    def _key(self, hidden: Any, gathered: bool = False) -> tuple:
        return (_hidden_key(hidden), gathered)

    def ready(self, hidden: Any = False, gathered: bool = False) -> bool:
        return self._key(hidden, gathered) in self._graphs

    def run(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, write: torch.Tensor,
            keys: list, values: list, hidden: Any = False,
            gather: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """``ids``/``pos`` ``[1, B]``, ``mask [B, 1, 1, span]`` over the cache's first ``span`` slots (0 attend,
        -inf not), ``write [B]`` cache slots -> (float32 logits ``[1, B, V]``, hidden states ``[1, B, H']`` or
        None). Writes each row's keys and values first. ``gather [B, span]``: row ``r`` reads the cache's slots
        ``gather[r]`` in that order instead of the slots themselves (a tree row: the cache, then its ancestors,
        laid out as greedy cached them)."""
        key = self._key(hidden, gather is not None)
        graph = self._graphs.get(key)
        if graph is None:
            return self._compile(key, ids, pos, mask, write, gather, keys, values, hidden)
        self.calls += 1
        logits, states = graph(ids, pos, mask, write, gather, keys, values)
        return logits, (states if hidden else None)

    def _compile(self, key: tuple, *args: Any) -> tuple:
        """Compile ``key``'s graph with its first call (the call's result is returned)."""
        hidden = args[-1]
        with _COMPILE_LOCK:
            ready = self._graphs.get(key)
            if ready is not None:       # another thread compiled it while this one waited
                self.calls += 1
                logits, states = ready(*args[:-1])
                return logits, (states if hidden else None)
            os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir()))
            import torch._dynamo.config as dynamo_config
            dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 16)
            dynamo_config.accumulated_recompile_limit = max(dynamo_config.accumulated_recompile_limit, 256)
            # every size that varies is a symbol, so one graph serves every capacity, position and number of rows
            # (1 included: unbacked, no special case for one row): every width runs the same code, and a row gets
            # the same bits whatever the width, which a model that rounds between its layers needs
            ids, pos, mask, write, gather = args[:5]
            for tensor in (*args[5], *args[6]):
                torch._dynamo.mark_dynamic(tensor, 2)
            torch._dynamo.mark_dynamic(mask, 3)
            if gather is not None:
                torch._dynamo.mark_dynamic(gather, 1)
            for tensor, dim in ((ids, 1), (pos, 1), (mask, 0), (write, 0), (gather, 0)):
                if tensor is not None:
                    torch._dynamo.decorators.mark_unbacked(tensor, dim)
            fn = torch.compile(_forward_fn(self, _hidden_key(hidden)), dynamic=None, fullgraph=True)
            t0 = time.perf_counter()
            logits, states = fn(*args[:-1])
            out = (logits, states if hidden else None)
            self.compile_s[key] = round(time.perf_counter() - t0, 2)
            self._graphs[key] = fn
        self.calls += 1
        return out

    def stats(self) -> dict:
        return {"graphs": len(self._graphs), "compiled_forwards": self.calls,
                "compile_s": round(sum(self.compile_s.values()), 1)}


def _hidden_key(hidden: Any) -> Any:
    # the last layer's states cost nothing extra, so a forward without them shares the graph that has them
    return tuple(hidden) if isinstance(hidden, (tuple, list)) else True


def _forward_fn(engine: Engine, hidden: Any) -> Callable:
    """The traced body: the model's own modules, laid out so every row stands alone."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    body, head, d = engine._body, engine._head, engine._head_dim
    config = engine.lm.model.config
    gqa = config.num_attention_heads != config.num_key_value_heads       # a Python bool, not a traced one
    fused = hidden is not True           # a layer-fusion head's tuple of hidden-state indices

    def forward(ids, pos, mask, write, gather, keys, values):
        b = ids.shape[1]
        # the row count is a symbol: what the linears' row rules need to know of it, and that the inputs agree
        torch._check(b >= 1)
        torch._check(b <= ROWS)
        torch._check(pos.shape[1] == b)
        torch._check(mask.shape[0] == b)
        torch._check(write.shape[0] == b)
        if gather is not None:
            torch._check(gather.shape[0] == b)
            torch._check(gather.shape[1] == mask.shape[-1])
            flat = gather.reshape(-1)
        x = body.embed_tokens(ids)                                         # [1, B, H]
        cos, sin = body.rotary_emb(x, pos)
        states = [x] if fused else None      # transformers' hidden_states: the embeddings, then each layer's
        for i, layer in enumerate(body.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(1, b, -1, d).transpose(1, 2)              # [1, heads, B, d]
            k = attn.k_proj(h).view(1, b, -1, d).transpose(1, 2)              # [1, kv, B, d]
            v = attn.v_proj(h).view(1, b, -1, d).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            keys[i].index_copy_(2, write, k)
            values[i].index_copy_(2, write, v)
            kv_heads, span = keys[i].shape[1], mask.shape[-1]
            rows = q.transpose(0, 2)                                          # [B, heads, 1, d]
            if gather is None:          # every row reads the cache in slot order, up to the mask's span
                seen_k = keys[i][:, :, :span].expand(b, kv_heads, span, d)
                seen_v = values[i][:, :, :span].expand(b, kv_heads, span, d)
            else:                       # each row its own layout: [kv, B * span, d] -> [B, kv, span, d]
                seen_k = keys[i][0].index_select(1, flat).view(kv_heads, b, span, d).transpose(0, 1)
                seen_v = values[i][0].index_select(1, flat).view(kv_heads, b, span, d).transpose(0, 1)
            # (written out as matmuls and a softmax instead, 17 rows cost 1.31x one rather than 1.65x, but a tree
            # forward got dearer and the prophet fell from 1.50x to 1.23x on the Xeon: BENCHMARKS.md)
            o = F.scaled_dot_product_attention(rows, seen_k, seen_v, attn_mask=mask, scale=attn.scaling,
                                               enable_gqa=gqa)
            x = x + attn.o_proj(o.reshape(1, b, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            if fused:
                states.append(x)
        y = body.norm(x)
        logits = head(y).float()
        if not fused:
            return logits, y
        states[-1] = y                       # as transformers reports them: the last is the final norm's output
        return logits, torch.cat([y] + [states[j] for j in hidden], dim=-1)

    # a code object of its own per engine: dynamo keeps its graphs and its "this dimension varies" notes per code
    # object, so two models (another size, another head count) never turn each other's shapes dynamic
    code = forward.__code__.replace(co_name=f"compiled_forward_{engine.lm.uid}")
    return types.FunctionType(code, forward.__globals__, code.co_name, forward.__defaults__, forward.__closure__)


# --------------------------------------------------------------------------- per model

def engine(lm: Any) -> Optional[Engine]:
    """``lm``'s engine when its compiled path is switched on (:func:`enable`), else None."""
    return lm.state.compiled if isinstance(lm.state.compiled, Engine) else None


def enable(lm: Any) -> Optional[str]:
    """Switch ``lm``'s fast path to compiled forwards; the reason it stays eager, or None when switched on."""
    reason = why_not(lm)
    if reason is None and engine(lm) is None:
        lm.state.compiled = Engine(lm)
    return reason


def disable(lm: Any) -> None:
    lm.state.compiled = None
