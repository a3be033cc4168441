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
  :data:`ROWS` (wider forwards run in chunks of it), every capacity, and chains, trees and windows alike. One
  row or twenty, the same code runs: a row gets the same bits whatever the width. Inductor's own cache keeps
  the graph on disk across restarts (:func:`cache_dir`); ``runtime/warmup.warm`` compiles it ahead of visitors.
* Attention is written out (:func:`_attend`) so that each step is either per key, per row, or a sum whose order
  a masked slot cannot change: a verify forward's rows equal the one-position forwards of compiled greedy, bit
  for bit for the bfloat16-weight model, which rounds between its layers and needs it, with a tree's or a
  window's holes in place (no per-row copy of the keys and values). The keys are kept a second time,
  transposed, beside the cache (``fastpath.StaticRunner``): the scores' vectors run over the slots. Compiled
  greedy is the reference in this mode ("greedy in the same mode").
* Linear layers stay the project's kernels (``kernels.onednn_linear`` is an opaque operator to the compiler);
  q/k/v and gate/up run as one product each (:class:`_Joined`); a float32 model's per-row-bucket kernel choice
  runs its one-row kernel in the graph.
* Prefill (long, variable length) runs eagerly, for greedy and every strategy alike; so does every model
  :func:`why_not` refuses, with the reason shown.

Only llama-shaped decoder-only models are compiled (the bundled SmolLM2 and its reduced-weight presets, and
the tiny random Llama of the tests); :func:`why_not` names what keeps any other model eager.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import threading
import time
import types
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch

from decoding.runtime import attention_kernels, kernels
from decoding.runtime.kernels import HalfLinear

ROWS = 32                                       # rows per call of the graph; wider forwards run in chunks
MODEL_TYPES = ("llama", "mistral", "qwen2")     # same layer shape: pre-norm, rotary q/k, GQA, gated MLP
ENV_SWITCH = "DECODING_COMPILE"                # "0" keeps every forward eager
_COMPILE_LOCK = threading.Lock()               # one compilation at a time (dynamo is not re-entrant)


cache_dir = attention_kernels.cache_dir        # where inductor and the project's kernels keep their builds


def use_cache_dir() -> Path:
    """Point inductor at :func:`cache_dir` (it reads the variable at every lookup), whatever set it before."""
    folder = cache_dir()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    return folder


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
    if any(isinstance(m, HalfLinear) and not m.own for m in lm.model.modules()):
        return ("float16-weight linears on FBGEMM (its prepacked weights are opaque to the compiler, and its rows "
                "change with the width; the project's kernel did not build here)")
    return None


class Engine:
    """One model's compiled forwards: one graph per kind of hidden states asked for (in practice one)."""

    def __init__(self, lm: Any) -> None:
        self.lm = lm
        use_cache_dir()
        self.calls = 0                     # forwards that ran compiled (the tests' counter)
        self.published = True              # seen by every thread's fast path (enable(publish=False): not yet)
        self.compile_s: dict[Any, float] = {}
        self._graphs: dict[Any, Callable] = {}
        self.guards: dict[Any, GuardFilter] = {}     # per graph: which of dynamo's guards it checks per call
        self._threads: dict[Any, set] = {}           # per graph: the thread counts it has been compiled for
        self._joined: Optional[list] = None
        # the attention's reductions in the project's C++ kernel (None), or why inductor's loops run them
        self.attention: Optional[str] = (attention_kernels.load(cache_dir() / "decoding-attention")
                                         if lm.dtype == torch.float32 else "a model computing in "
                                         f"{str(lm.dtype).replace('torch.', '')} (the kernel is float32)")
        body = lm.model.model
        self._body, self._head = body, lm.model.lm_head
        config = lm.model.config
        self._head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

    def joined(self) -> list[tuple[Optional["_Joined"], Optional["_Joined"]]]:
        """Per layer: the q/k/v projections and the MLP's gate/up projections as one product each (None where
        the layers' kernels do not allow it), built once."""
        if self._joined is None:
            self._joined = []
            for layer in self._body.layers:
                attn, mlp = layer.self_attn, layer.mlp
                self._joined.append((_Joined.of([attn.q_proj, attn.k_proj, attn.v_proj]),
                                     _Joined.of([mlp.gate_proj, mlp.up_proj]) if hasattr(mlp, "gate_proj") else None))
        return self._joined

    def ready(self, hidden: Any = False) -> bool:
        return _hidden_key(hidden) in self._graphs

    def run(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, write: torch.Tensor,
            order: torch.Tensor, keys: list, values: list, keys_t: list,
            hidden: Any = False) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """``ids``/``pos`` ``[1, B]``, ``mask [B, span]`` over the cache's first ``span`` slots (0 attend, -inf
        not), ``write [B]`` cache slots, ``order [B, span]`` each row's seen slots first in position order (see
        :func:`_attend`); ``keys``/``values`` the cache's layers ``[1, kv, capacity, d]`` and ``keys_t`` the keys
        again, transposed ``[kv, d, capacity]`` (the scores' layout) -> (float32 logits ``[1, B, V]``, hidden
        states ``[1, B, H']`` or None). Writes each row's keys (both layouts) and values first."""
        key = _hidden_key(hidden)
        graph = self._graphs.get(key)
        if graph is None:
            return self._compile(key, ids, pos, mask, write, order, keys, values, keys_t, hidden)
        self.calls += 1
        seen = self._threads[key]
        if torch.get_num_threads() not in seen:
            # dynamo compiles this thread count's graph now (its loops are built for a count), from this call's
            # tensors: they carry the same size marks as the first call's, or that graph would special-case one row
            # and a wider forward compile a third, other code (a busy run's rows then rounded apart from greedy's)
            _mark_sizes(ids, pos, mask, write, order, keys, values, keys_t)
            seen.add(torch.get_num_threads())
        logits, states = graph(ids, pos, mask, write, order, keys, values, keys_t)
        return logits, (states if hidden else None)

    def entries(self) -> int:
        """Compiled entries dynamo holds for this engine's graphs (1 per graph: a second would be a recompile,
        with other code, which could round a row differently)."""
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list
        return sum(len(_debug_get_cache_entry_list(fn._torchdynamo_orig_callable.__code__))
                   for fn in self._graphs.values())

    def _compile(self, key: Any, *args: Any) -> tuple:
        """Compile ``key``'s graph with its first call (the call's result is returned)."""
        hidden = args[-1]
        with _COMPILE_LOCK:
            ready = self._graphs.get(key)
            if ready is not None:       # another thread compiled it while this one waited
                self.calls += 1
                logits, states = ready(*args[:-1])
                return logits, (states if hidden else None)
            use_cache_dir()
            import torch._dynamo.config as dynamo_config
            dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 16)
            dynamo_config.accumulated_recompile_limit = max(dynamo_config.accumulated_recompile_limit, 256)
            _mark_sizes(*args[:-1])
            self._threads[key] = {torch.get_num_threads()}
            body = _forward_fn(self, key)
            guards = self.guards[key] = GuardFilter(frozenset(body.__code__.co_freevars))
            fn = torch.compile(body, dynamic=None, fullgraph=True, options={"guard_filter_fn": guards})
            t0 = time.perf_counter()
            logits, states = fn(*args[:-1])
            out = (logits, states if hidden else None)
            self.compile_s[key] = round(time.perf_counter() - t0, 2)
            self._graphs[key] = fn
        self.calls += 1
        return out

    def stats(self) -> dict:
        return {"graphs": len(self._graphs), "compiled_forwards": self.calls,
                "compile_s": round(sum(self.compile_s.values()), 1),
                "attention": "C++ kernel" if self.attention is None else f"inductor ({self.attention})"}


class _Joined:
    """Linear layers that read the same input, run as one product on their weights side by side.

    A oneDNN call costs some 15 microseconds before any arithmetic on a small model; a llama layer makes seven,
    and joining q/k/v and gate/up makes it four. Each output is the dot product its own layer computes (the
    same weights, the same kernel, the same reduction), so the bits are those of the separate calls; the
    compiled forward of every width uses it, greedy's included. Only layers of one kind are joined: float16- or
    bfloat16-weight layers on the project's kernels (``kernels.HalfLinear``/``Bf16Linear`` with ``own``), bfloat16-
    weight layers on oneDNN (``kernels.Bf16Linear``), int8-weight-and-activation layers (``kernels.W8A8Linear``) or
    float32 layers on oneDNN's packed kernel; any other mix
    keeps its separate calls. Costs the joined weights once more in memory (in the reduced type: about 140 MB
    for the bundled model in bfloat16)."""

    def __init__(self, packed: torch.Tensor, bias: Optional[torch.Tensor], sizes: list[int], reduced: bool) -> None:
        self.packed, self.bias, self.sizes, self.reduced = packed, bias, sizes, reduced
        self.scales: Optional[torch.Tensor] = None      # int8 weights: each output's scale
        self.out_features = sum(sizes)

    @classmethod
    def of(cls, layers: list) -> Optional["_Joined"]:
        sizes = [m.out_features for m in layers]
        if all(type(m) is HalfLinear and m.own for m in layers):       # float16 weights on the project's kernel
            return cls(torch.cat([m.packed for m in layers]), _joined_bias(layers, "packed_bias"), sizes, "half")
        if all(type(m) is kernels.Bf16Linear and m.own and m.out_features % 4 == 0 for m in layers):
            # bfloat16 weights on the project's kernel: whole tiles of 4 outputs, so the packs join as half's do
            return cls(torch.cat([m.packed for m in layers]), _joined_bias(layers, "bias16"), sizes, "bf16")
        if all(type(m) is kernels.W8A8Linear and m.out_features % attention_kernels.I8_TILE == 0 for m in layers):
            # int8 weights and activations: whole tiles of 48 outputs, each output's scale beside it; every output
            # reads the same quantized row, so the joined product is the separate ones side by side
            joined = cls(torch.cat([m.packed for m in layers]), _joined_bias(layers, "bias32"), sizes, "w8a8")
            joined.scales = torch.cat([m.scales for m in layers])
            return joined
        if any(type(m) is kernels.W8A8Linear for m in layers):
            return None
        if any(type(m) is kernels.Bf16Linear and m.own for m in layers):
            return None
        if all(type(m) is kernels.Bf16Linear for m in layers):
            reduced, dtype = True, torch.bfloat16
        elif all(type(m) is kernels.PackedLinear and m._packed_at[1] and m.packed.dtype == torch.float32
                 for m in layers):
            reduced, dtype = False, torch.float32
        else:
            return None
        with torch.no_grad():
            weight = torch.cat([m.weight.detach().to(dtype) for m in layers])
            bias = _joined_bias(layers, "bias")
            packed = kernels._pack(weight)
        return cls(packed, None if bias is None else bias.to(dtype), sizes, reduced)

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        if self.reduced == "half":  # as HalfLinear.reduced on the project's kernel: each output its own sum
            return attention_kernels.half_linear(rows, self.packed, self.bias)
        if self.reduced == "bf16":  # as Bf16Linear.reduced on the project's kernel: each output its own sum
            return attention_kernels.bf16_linear(rows, self.packed, self.bias, self.out_features)
        if self.reduced == "w8a8":  # as W8A8Linear.reduced: each output its own integer sums and scales
            return attention_kernels.i8_linear(rows, self.packed, self.scales, self.bias, self.out_features)
        if self.reduced:            # as Bf16Linear.reduced: bfloat16 in, float32 accumulation, bfloat16 out
            return kernels.onednn_linear(rows.to(torch.bfloat16), self.packed, self.bias, self.out_features).float()
        return kernels.onednn_linear(rows, self.packed, self.bias, self.out_features)


def _joined_bias(layers: list, name: str) -> Optional[torch.Tensor]:
    """The layers' biases (attribute ``name``) side by side, zeros for a layer without one; None where none has one."""
    biases = [getattr(m, name) for m in layers]
    if all(b is None for b in biases):
        return None
    return torch.cat([b.detach() if b is not None else torch.zeros(m.out_features) for m, b in zip(layers, biases)])


CACHE_ARGS = ("keys", "values", "keys_t")      # the graph's arguments that are the runner's KV cache, per layer


def _guard_root(name: str) -> str:
    """The variable a dynamo guard's source starts from: ``body`` for ``type(body.layers[0]).forward``."""
    while True:
        for wrapper in ("type(", "dict("):
            if name.startswith(wrapper):
                name = name[len(wrapper):]
                break
        else:
            return re.split(r"[.\[\]()]", name, maxsplit=1)[0]


def _mark_sizes(ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, write: torch.Tensor,
                order: torch.Tensor, keys: list, values: list, keys_t: list) -> None:
    """Every size that varies a symbol, so one graph serves every capacity, position and number of rows (1 included:
    unbacked, no special case for one row): every width runs the same code, and a row gets the same bits whatever
    the width, which a model that rounds between its layers needs. Dynamo reads the marks off the tensors of the call
    it traces."""
    for tensor in (*keys, *values, *keys_t):
        torch._dynamo.mark_dynamic(tensor, 2)
    torch._dynamo.mark_dynamic(mask, 1)
    torch._dynamo.mark_dynamic(order, 1)
    for tensor, dim in ((ids, 1), (pos, 1), (mask, 0), (write, 0), (order, 0)):
        torch._dynamo.decorators.mark_unbacked(tensor, dim)


class GuardFilter:
    """The guards dynamo keeps on an engine's graph (``torch.compile``'s ``guard_filter_fn``).

    Checked before every compiled forward, all of them took ~1.2 ms of a 6-7 ms one-position forward of the
    int8 version (AMD EPYC Zen 5, 2 threads): some 3,600 guards, nearly all on the model's modules and
    parameters, which the traced function reaches through its closure (``fixed``: its free variables), and 90
    on the KV cache's tensors. Neither can change between calls: each engine traces a code object of its own
    (:func:`_forward_fn`), whose closure holds that model and nothing else for the engine's life, and the cache
    lists are the engine's own runner's (one tensor per layer, its dtype the model's; their lengths stay
    guarded, and their varying sizes stay in the shape guards). Kept: the per-call arguments (``ids``,
    ``pos``, ``mask``, ``write``, ``order``), the module globals, and the global state (grad mode, threads:
    a run on one thread still gets a graph of its own), ~190 guards, ~0.2 ms. ``kept`` / ``total``: the last
    trace's counts."""

    def __init__(self, fixed: frozenset) -> None:
        self.fixed, self.kept, self.total = fixed, 0, 0

    def __call__(self, entries: list) -> list:
        keep = []
        for entry in entries:
            root = _guard_root(entry.name)
            cache = root in CACHE_ARGS and entry.guard_type != "SEQUENCE_LENGTH"
            keep.append(root not in self.fixed and not cache)
        self.kept, self.total = sum(keep), len(keep)
        return keep


def _hidden_key(hidden: Any) -> Any:
    # the last layer's states cost nothing extra, so a forward without them shares the graph that has them
    return tuple(hidden) if isinstance(hidden, (tuple, list)) else True


def _stored(x: torch.Tensor) -> torch.Tensor:
    """``x`` written to a buffer of its own in the compiled graph, not recomputed inside each consumer's loops
    (inductor's ``force_stride_order`` prim; where a PyTorch lacks it, ``x`` as it is: slower, equally exact)."""
    force = getattr(getattr(torch.ops, "prims", None), "inductor_force_stride_order", None)
    return x if force is None else force(x, x.stride())


def _attend(q: torch.Tensor, keys_t: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
            order: torch.Tensor, scale: float, kernel: bool = False) -> torch.Tensor:
    """Attention written out, so that a row's bits do not depend on the other rows or on where its keys sit.

    ``q [1, heads, B, d]``; ``keys_t`` the layer's keys ``[kv, d, capacity]`` and ``values`` its values
    ``[1, kv, capacity, d]``; ``mask [B, span]`` over the cache's first ``span`` slots (0 seen, -inf not);
    ``order [B, span]``: each row's seen slots first, in position order (then the rest) -> ``[B, heads * d]``.

    Each step is one of three kinds, none of which a hole in a row's keys (a tree's sibling, a window's other
    branch) or extra masked slots at the end can change:

    * per-key and per-row values: a score is its own sum over ``d`` (one lane of a vector over the slots, the
      transposed keys' layout, ``d`` after ``d``); the row's maximum is exact in any order; ``exp`` is
      elementwise;
    * the weighted sum of values, reduced over the slots one after another (inductor keeps the slot loop
      sequential and vectorizes over ``d``), so a masked slot adds an exact zero between the same terms;
    * the softmax's denominator, summed over the row's keys gathered into ``order``: the layout a one-position
      forward has (its keys in slots 0..p), so the same lanes add the same terms.

    ``kernel``: the scores, the weighted sum and the denominator in the project's C++ kernel
    (``attention_kernels.cpp``: the same orders, with several accumulators, where inductor's loops wait on one
    per output vector; the denominator summed in slot order beside the weighted sum, which a hole cannot change
    either, so ``order`` goes unused) - float32 only.

    So a row of a verify forward gets the bits of compiled greedy's one-position forward at its position, for a
    chain, a tree or a window alike, without gathering the keys and values (``runtime/gqa_attention.py``'s
    eager path needs the layout copied; here only a row of weights is)."""
    _, heads, b, d = q.shape
    kv, span = keys_t.shape[0], mask.shape[1]
    rep = heads // kv
    rows = q[0].transpose(0, 1).reshape(b, heads * d) * scale
    if kernel:                 # the two reductions in the project's C++ kernel (runtime/attention_kernels.cpp)
        scores = torch.ops.decoding_attention.scores(rows, keys_t, span)                  # [B, kv, rep, span]
    else:                      # the rows stored once (inlined, the rotary embedding is recomputed for every key)
        rows = _stored(rows).view(b, kv, rep, d, 1)
        scores = (rows * keys_t[:, :, :span].unsqueeze(0).unsqueeze(2)).sum(-2)
    scores = scores + mask.view(b, 1, 1, span)
    weights = torch.exp(scores - scores.amax(-1, keepdim=True))
    if kernel:                 # the weighted sum and its denominator, both in slot order, divided: [B, kv, rep, d]
        return torch.ops.decoding_attention.values(weights, values, span).to(q.dtype).reshape(b, heads * d)
    total = (weights.unsqueeze(-1) * values[0, :, :span].unsqueeze(0).unsqueeze(2)).sum(-2)
    norm = weights.gather(-1, order.view(b, 1, 1, span).expand(b, kv, rep, span)).sum(-1, keepdim=True)
    return (total / norm).to(q.dtype).reshape(b, heads * d)


def _forward_fn(engine: Engine, hidden: Any) -> Callable:
    """The traced body: the model's own modules, laid out so every row stands alone."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    body, head, d = engine._body, engine._head, engine._head_dim
    fused = hidden is not True           # a layer-fusion head's tuple of hidden-state indices
    joined = engine.joined()
    kernel = engine.attention is None    # the C++ attention kernel is built and loaded

    def forward(ids, pos, mask, write, order, keys, values, keys_t):
        b = ids.shape[1]
        # the row count is a symbol: what the linears' row rules need to know of it, and that the inputs agree
        torch._check(b >= 1)
        torch._check(b <= ROWS)
        torch._check(pos.shape[1] == b)
        torch._check(mask.shape[0] == b)
        torch._check(write.shape[0] == b)
        torch._check(order.shape[0] == b)
        torch._check(order.shape[1] == mask.shape[1])
        x = body.embed_tokens(ids)                                         # [1, B, H]
        # computed once and stored (inlined, every layer's kernels would compute them again for every head)
        cos, sin = (_stored(t) for t in body.rotary_emb(x, pos))
        states = [x] if fused else None      # transformers' hidden_states: the embeddings, then each layer's
        for i, layer in enumerate(body.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            qkv, gate_up = joined[i]
            if qkv is not None:          # one product for the three projections (the same bits, one call)
                q, k, v = qkv(h.reshape(b, -1)).split(qkv.sizes, dim=-1)
            else:
                q, k, v = attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
            q = q.reshape(1, b, -1, d).transpose(1, 2)                         # [1, heads, B, d]
            k = k.reshape(1, b, -1, d).transpose(1, 2)                         # [1, kv, B, d]
            v = v.reshape(1, b, -1, d).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            keys[i].index_copy_(2, write, k)
            values[i].index_copy_(2, write, v)
            keys_t[i].index_copy_(2, write, k[0].transpose(1, 2))
            o = _attend(q, keys_t[i], values[i], mask, order, attn.scaling, kernel)
            x = x + attn.o_proj(o.reshape(1, b, -1))
            h = layer.post_attention_layernorm(x)
            if gate_up is not None:
                gate, up = gate_up(h.reshape(b, -1)).split(gate_up.sizes, dim=-1)
                x = x + layer.mlp.down_proj((layer.mlp.act_fn(gate) * up).reshape(1, b, -1))
            else:
                x = x + layer.mlp(h)
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

_BUILDING = threading.local()        # the engine this thread compiles and times before it is published


def engine(lm: Any) -> Optional[Engine]:
    """``lm``'s engine when its compiled path is switched on (:func:`enable`) and published, else None. An engine
    enabled unpublished (``enable(lm, publish=False)``: the app compiles it in the background) is seen only by the
    thread inside :func:`building`; every other thread's forwards stay eager until :func:`publish`."""
    found = lm.state.compiled
    if not isinstance(found, Engine):
        return None
    return found if found.published or getattr(_BUILDING, "engine", None) is found else None


def enable(lm: Any, publish: bool = True) -> Optional[str]:
    """Switch ``lm``'s fast path to compiled forwards; the reason it stays eager, or None when switched on.
    ``publish=False``: the engine exists, but only :func:`building` sees it until :func:`publish`."""
    reason = why_not(lm)
    if reason is None and not isinstance(lm.state.compiled, Engine):
        lm.state.compiled = Engine(lm)
        lm.state.compiled.published = publish
    return reason


@contextlib.contextmanager
def building(lm: Any) -> Iterator[Optional[Engine]]:
    """In this thread only, ``lm``'s unpublished engine runs its fast path (to compile and time it)."""
    found = lm.state.compiled if isinstance(lm.state.compiled, Engine) else None
    before, _BUILDING.engine = getattr(_BUILDING, "engine", None), found
    try:
        yield found
    finally:
        _BUILDING.engine = before


def publish(lm: Any) -> bool:
    """Every thread's fast path on ``lm`` runs compiled from now on (whether an engine was there to publish).
    Curves timed on the fast path before (eager) are dropped: they are the other mode's."""
    found = lm.state.compiled
    if not isinstance(found, Engine):
        return False
    found.published = True
    lm.state.forward_cost.pop(True, None)
    return True


def disable(lm: Any) -> None:
    if isinstance(lm.state.compiled, Engine):
        lm.state.forward_cost.pop(True, None)
    lm.state.compiled = None
