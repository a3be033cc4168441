"""CPU linear kernels, chosen per weight shape and per number of rows.

Why this exists: on CPU, PyTorch sends a float32 ``nn.Linear`` to MKL's sgemm.
oneDNN can instead pack each weight once, at load time, into the blocked layout
its kernels read. Which of the two is faster depends on the machine and on the
number of rows (positions) a call multiplies:

* on the project's AMD EPYC machine, packed weights made a one-row forward
  (a greedy step) 1.42x faster, and a forward over 2-16 rows no dearer than
  one (MKL repacks the whole weight for every call of 2-16 rows);
* on an Intel Xeon, MKL's one-row path is 1.33x faster than oneDNN's, and
  oneDNN wins from 4 rows on.

So no single kernel is right everywhere. A ``PackedLinear`` holds both: the
layer's own ``weight``/``bias`` parameters (tied weights stay tied,
``state_dict`` keys do not change) for ``F.linear``, and a packed copy as a
plain attribute (out of ``parameters()``, ``buffers()`` and ``state_dict()``).
At every call the number of rows (the product of the input's leading
dimensions) picks one of the ``BUCKETS`` and the layer's ``choice`` for that
bucket says which kernel runs. ``decoding/runtime/kernel_choice.py`` fills the choices
by timing both kernels on the model's own layers, once per machine and model.

Arithmetic stays in the model's dtype with float32 accumulation: the packed
result differs from MKL's only by summation order (about 1e-4 on the bundled
model's logits). The oneDNN operators are PyTorch's own (the ones inductor uses
when it freezes a CPU model) but not public API, so every call falls back to
``F.linear`` when the ops are missing, when gradients are needed (training the
prophet through the frozen LM head), or when an input is not a CPU tensor of
the packed dtype. Applying a table checks one layer's packed output against
``F.linear`` before it swaps anything.

``HalfLinear`` (end of this file) is for draft-only modules such as the prophet
head: FBGEMM's float16-weight GEMM, half the bytes per draft step. Never for a
model whose logits decide a committed token.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from decoding.runtime import attention_kernels

PACKABLE_DTYPES = (torch.float32, torch.bfloat16)
KINDS = ("default", "packed")
# Row-count buckets (first, last; None = no limit): 1 is a greedy step, 2-9 a verify
# forward over a few drafted tokens, 10-64 a lookahead window or Jacobi block, 65+ a prefill.
BUCKETS: tuple[tuple[int, Any], ...] = ((1, 1), (2, 3), (4, 9), (10, 17), (18, 64), (65, None))
_OPEN = BUCKETS[-1][0]                  # every row count from here on is the last bucket
ALL_PACKED = ("packed",) * len(BUCKETS)
ALL_DEFAULT = ("default",) * len(BUCKETS)
LABELS = {"packed": "onednn-packed", "default": "default"}

Choice = tuple            # one kind per bucket
Shape = tuple             # (in_features, out_features)
Plan = Union[str, Choice, dict, Callable[[Shape], Choice]]


def bucket_of(rows: int) -> int:
    for index, (first, last) in enumerate(BUCKETS):
        if first <= rows and (last is None or rows <= last):
            return index
    return 0                             # 0 rows: nothing to multiply, either kernel


def bucket_label(index: int) -> str:
    first, last = BUCKETS[index]
    return f"{first}+" if last is None else str(first) if first == last else f"{first}-{last}"


def available() -> bool:
    """Whether this PyTorch build has the oneDNN linear ops."""
    ops = getattr(torch.ops, "mkldnn", None)
    try:
        return bool(torch.backends.mkldnn.is_available()
                    and hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise"))
    except (AttributeError, RuntimeError):
        return False


def _pack(weight: torch.Tensor) -> torch.Tensor:
    # [out, in] dense -> the same matrix in oneDNN's blocked layout (an opaque tensor)
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)


# An operator of the project's own (registered with the dispatcher directly, not through ``custom_op``, whose
# wrappers cost about 3 microseconds a call: some 200 calls a forward), opaque to the compiler.
_LIBRARY = torch.library.Library("decoding", "DEF")
_LIBRARY.define("onednn_linear(Tensor x, Tensor packed, Tensor? bias, SymInt out_features) -> Tensor")


def _onednn_linear_impl(x: torch.Tensor, packed: torch.Tensor, bias: Optional[torch.Tensor],
                        out_features: int) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


_LIBRARY.impl("onednn_linear", _onednn_linear_impl, "CompositeExplicitAutograd")


@torch.library.register_fake("decoding::onednn_linear", lib=_LIBRARY)
def _(x: torch.Tensor, packed: torch.Tensor, bias: Optional[torch.Tensor], out_features: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], out_features)


_onednn_linear = torch.ops.decoding.onednn_linear


def onednn_linear(rows: torch.Tensor, packed: torch.Tensor, bias: Optional[torch.Tensor],
                  out_features: int) -> torch.Tensor:
    """``[rows, in] -> [rows, out]`` on a packed weight. Under ``torch.compile`` (runtime/compiled.py) the call
    is an opaque custom op: inductor's own lowering of the oneDNN op only takes weights it froze itself."""
    if torch.compiler.is_compiling():
        return _onednn_linear(rows, packed, bias, out_features)
    return torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")


def _check_choice(choice: Choice) -> Choice:
    choice = tuple(choice)
    if len(choice) != len(BUCKETS) or any(kind not in KINDS for kind in choice):
        raise ValueError(f"a kernel choice names one of {KINDS} for each of the {len(BUCKETS)} row buckets "
                         f"{[bucket_label(i) for i in range(len(BUCKETS))]}; got {choice!r}")
    return choice


class PackedLinear(nn.Module):
    """``nn.Linear`` that runs each row bucket on the kernel its ``choice`` names."""

    def __init__(self, linear: nn.Linear, choice: Choice = ALL_PACKED) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight            # the same Parameter: tied weights stay tied
        self.bias = linear.bias
        object.__setattr__(self, "packed", _pack(linear.weight))   # not a buffer: opaque, CPU only
        self.set_choice(choice)

    def set_choice(self, choice: Choice) -> None:
        self.choice = _check_choice(choice)
        # rows -> use the packed kernel? (index 0: an empty input; the last index: every larger count)
        self._packed_at = tuple(self.choice[bucket_of(rows)] == "packed" for rows in range(_OPEN + 1))

    def usable(self, x: torch.Tensor) -> bool:
        return (x.device.type == "cpu" and x.dtype == self.packed.dtype
                and not (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            # one compiled graph serves every row count (runtime/compiled.py): the one-row bucket's kernel
            packed = self._packed_at[1]
        else:
            rows = x.numel() // self.in_features
            packed = self._packed_at[rows if rows < _OPEN else _OPEN]
        if packed and self.usable(x):
            return self.run_packed(x)
        return F.linear(x, self.weight, self.bias)

    def run_packed(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        # [..., in] -> [rows, in] -> [rows, out] -> [..., out]
        y = onednn_linear(x.reshape(-1, self.in_features), self.packed, self.bias, self.out_features)
        return y.reshape(*lead, self.out_features)

    def run(self, kind: str, x: torch.Tensor) -> torch.Tensor:
        """One kernel, whatever the choice says (for timing both)."""
        return self.run_packed(x) if kind == "packed" else F.linear(x, self.weight, self.bias)

    def unpacked(self) -> nn.Linear:
        plain = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                          device="meta")
        plain.weight = self.weight
        plain.bias = self.bias
        return plain

    def extra_repr(self) -> str:
        kinds = ", ".join(f"{bucket_label(i)}: {k}" for i, k in enumerate(self.choice))
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN packed; rows {kinds}"


def linear_layers(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, attribute, layer) for every ``nn.Linear``/``PackedLinear``, in module order."""
    return [(parent, name, child) for parent in model.modules()
            for name, child in parent.named_children() if type(child) in (nn.Linear, PackedLinear)]


def shape_of(layer: nn.Module) -> Shape:
    return (layer.in_features, layer.out_features)


def _agrees(layer: nn.Linear) -> bool:
    """One layer's packed output against ``F.linear`` on random rows (1, 3 and 8 of them)."""
    try:
        packed = PackedLinear(layer)
        with torch.no_grad():
            for rows in (1, 3, 8):
                x = torch.randn(rows, layer.in_features, dtype=layer.weight.dtype)
                want = F.linear(x, layer.weight, layer.bias).float()
                got = packed(x).float()
                tol = 1e-3 if layer.weight.dtype == torch.float32 else 5e-2
                if not torch.allclose(got, want, rtol=tol, atol=tol * float(want.abs().max()) + 1e-6):
                    return False
        return True
    except (RuntimeError, TypeError):
        return False


def packable_dtype(model: nn.Module) -> Any:
    """The dtype the model's linears would be packed in, or None when they cannot be."""
    if not available():
        return None
    try:
        param = next(model.parameters())
    except StopIteration:
        return None
    if param.device.type != "cpu" or param.dtype not in PACKABLE_DTYPES:
        return None
    return param.dtype


def _resolver(plan: Plan) -> Callable[[Shape], Choice]:
    if isinstance(plan, str):
        if plan not in KINDS:
            raise ValueError(f"kernel plan must be one of {KINDS}, a choice per bucket or a table; got {plan!r}")
        whole = (plan,) * len(BUCKETS)
        return lambda shape: whole
    if isinstance(plan, dict):
        table = {tuple(shape): _check_choice(choice) for shape, choice in plan.items()}
        return lambda shape: table.get(tuple(shape), ALL_PACKED)
    if callable(plan):
        return plan
    whole = _check_choice(plan)
    return lambda shape: whole


def apply(model: nn.Module, plan: Plan) -> int:
    """Set every linear layer's kernel per row bucket; returns how many layers hold a packed copy.

    ``plan``: ``"packed"`` or ``"default"`` for every bucket, one choice tuple for every
    layer, a ``{(in, out): choice}`` table (shapes it lacks run packed), or a function of
    the shape. Layers whose choice is all ``default`` are plain ``nn.Linear`` (no packed
    copy, no dispatch); the others become ``PackedLinear``. Does nothing (returns 0) for a
    model that is not on the CPU, not float32/bfloat16, or on a build without the oneDNN
    ops. The model must be frozen from here on: packed copies do not follow later
    in-place changes to the weights.
    """
    choose = _resolver(plan)
    dtype = packable_dtype(model)
    found = [entry for entry in linear_layers(model) if entry[2].weight.dtype == dtype]
    if dtype is None or not found:
        return 0
    choices = [_check_choice(choose(shape_of(child))) for _, _, child in found]
    to_wrap = [child for (_, _, child), choice in zip(found, choices)
               if type(child) is nn.Linear and choice != ALL_DEFAULT]
    if to_wrap and not _agrees(to_wrap[0]):
        return 0
    for (parent, name, child), choice in zip(found, choices):
        if choice == ALL_DEFAULT:
            if isinstance(child, PackedLinear):
                setattr(parent, name, child.unpacked())
        elif isinstance(child, PackedLinear):
            child.set_choice(choice)
        else:
            setattr(parent, name, PackedLinear(child, choice))
    return sum(isinstance(child, PackedLinear) for _, _, child in linear_layers(model))


def pack_linears(model: nn.Module) -> int:
    """Every linear layer on packed oneDNN kernels, for every row count (see ``apply``)."""
    return apply(model, "packed")


def unpack_linears(model: nn.Module) -> int:
    """Every linear layer back on PyTorch's default kernel; returns how many were packed."""
    found = [entry for entry in linear_layers(model) if isinstance(entry[2], PackedLinear)]
    for parent, name, child in found:
        setattr(parent, name, child.unpacked())
    return len(found)


def is_packed(model: Any) -> bool:
    return packed_bytes(model) > 0


def packed_bytes(model: Any) -> int:
    """Memory held by the packed copies (outside ``parameters()``/``buffers()``)."""
    return sum(m.packed.numel() * m.packed.element_size()
               for m in getattr(model, "modules", lambda: [])() if isinstance(m, PackedLinear))


def bucket_kernels(model: nn.Module) -> list[dict]:
    """Per row bucket: the kernel that runs it and the share of linear weight bytes on packed kernels."""
    layers = [child for _, _, child in linear_layers(model)]
    total = sum(layer.weight.numel() * layer.weight.element_size() for layer in layers) or 1
    rows = []
    for index in range(len(BUCKETS)):
        packed = sum(layer.weight.numel() * layer.weight.element_size() for layer in layers
                     if isinstance(layer, PackedLinear) and layer.choice[index] == "packed")
        share = packed / total
        kernel = "onednn-packed" if share == 1 else "default" if share == 0 else "mixed"
        rows.append({"rows": bucket_label(index), "kernel": kernel, "packed_share": round(share, 3)})
    return rows


def label(model: nn.Module) -> str:
    """``default``, ``onednn-packed``, or e.g. ``mixed: default 1-3, onednn-packed 4+``."""
    kinds = [row["kernel"] if row["kernel"] != "mixed" else f"{round(100 * row['packed_share'])}% packed"
             for row in bucket_kernels(model)]
    if len(set(kinds)) == 1 and kinds[0] in LABELS.values():
        return kinds[0]
    runs: list[list] = []          # consecutive buckets on the same kernel: [kernel, first, last]
    for index, kind in enumerate(kinds):
        if runs and runs[-1][0] == kind:
            runs[-1][2] = index
        else:
            runs.append([kind, index, index])
    parts = []
    for kernel, first, last in runs:
        lo, hi = BUCKETS[first][0], BUCKETS[last][1]
        span = f"{lo}+" if hi is None else str(lo) if lo == hi else f"{lo}-{hi}"
        parts.append(f"{kernel} {span}")
    return "mixed: " + ", ".join(parts)


# --------------------------------------------------------------------------- half-precision weights for drafters

class _ReducedLinear(nn.Module):
    """What the reduced-weight linears share: the float32 ``weight``/``bias`` stay the module's parameters
    (``state_dict`` unchanged), a reduced copy sits outside them (``packed``), and a call that needs gradients,
    or an input that is not a float32 CPU tensor, runs ``F.linear`` on the float32 parameters."""

    def __init__(self, linear: nn.Module) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or x.dtype != torch.float32 or (
                torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)):
            return F.linear(x, self.weight.to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))
        lead = x.shape[:-1]
        return self.reduced(x.reshape(-1, self.in_features)).reshape(*lead, self.out_features)

    def reduced(self, rows: torch.Tensor) -> torch.Tensor:
        """``[rows, in]`` float32 -> ``[rows, out]`` float32 on the reduced weights."""
        raise NotImplementedError

    def unpacked(self) -> nn.Linear:
        plain = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        plain.weight, plain.bias = self.weight, self.bias
        return plain


class HalfLinear(_ReducedLinear):
    """``nn.Linear`` whose weights are read as float16, float32 in and out: on the project's kernel (``own``) or on
    FBGEMM's prepacked fp16 GEMM.

    For drafters: a draft token never decides what is committed (the target's
    verification does), so a draft head may round its weights to float16. A target
    runs on it only as a preset that says so (``weights: fp16``): another model. Half the
    bytes matter on a CPU: the prophet's layer and draft-vocabulary head are ~36 MB
    in float32, more than a 32 MB L3 holds, and the target's forward evicts them
    between steps; in float16 they stay cached across a tree's expansions. Like
    ``PackedLinear``, the float32 ``weight``/``bias`` stay the module's parameters
    (``state_dict`` unchanged) and every call falls back to ``F.linear`` when
    gradients are needed or the input is not a float32 CPU tensor.
    """

    def __init__(self, linear: nn.Module, own: bool = False) -> None:
        super().__init__(linear)
        weight = linear.weight.detach().float()
        # ``own``: the project's kernel (attention_kernels.half_linear: a row's bits the same at any row count, which
        # FBGEMM's are not on an AVX2 CPU; what a float16-weight *target* needs, compiled or not), else FBGEMM's
        self.own = bool(own) and weight.shape[0] % 4 == 0 and weight.shape[1] % 8 == 0
        if self.own:
            object.__setattr__(self, "packed", attention_kernels.pack_half(weight))
            object.__setattr__(self, "packed_bias", None if linear.bias is None else linear.bias.detach().float())
        else:
            object.__setattr__(self, "packed", torch.ops.quantized.linear_prepack_fp16(
                weight, None if linear.bias is None else linear.bias.detach().float()))

    def reduced(self, rows: torch.Tensor) -> torch.Tensor:
        if self.own:
            return attention_kernels.half_linear(rows, self.packed, self.packed_bias)
        return torch.ops.quantized.linear_dynamic_fp16(rows, self.packed)


_HALF_OK: list = []


def half_available() -> bool:
    """Whether this build runs FBGEMM's fp16 linear (x86 CPUs), checked once against ``F.linear``."""
    if not _HALF_OK:
        try:
            layer = nn.Linear(64, 48)
            x = torch.randn(3, 64)
            with torch.no_grad():
                got, want = HalfLinear(layer)(x), F.linear(x, layer.weight, layer.bias)
            _HALF_OK.append(bool(torch.allclose(got, want, atol=1e-2, rtol=1e-2)))
        except (RuntimeError, AttributeError, NotImplementedError):
            _HALF_OK.append(False)
    return _HALF_OK[0]


def own_half() -> bool:
    """Whether float16 weights run on the project's kernel here (``attention_kernels.half_linear``, built on first
    use): rows independent of the width, and 1.2-1.4x faster than FBGEMM's at 1 to 16 rows on an Intel Xeon, with
    and without the AVX2 caps (BENCHMARKS.md, "The float16-weight product, second version")."""
    return attention_kernels.load_default() is None


def half_linears(model: nn.Module) -> int:
    """Every float32 CPU linear layer of ``model`` on float16 weights (``HalfLinear``); how many were swapped.

    On the project's kernel where it builds here (:func:`own_half`), else on FBGEMM's. For draft-only modules (see
    ``HalfLinear``), and for a target only as a preset that says so (``weights: fp16``, ``models.WEIGHTS``): that
    makes it another model, its own reference, exact against its own greedy at every width only on the project's
    kernel (FBGEMM's rows change with the width on an AVX2 CPU). Does nothing on other devices or dtypes, or on a
    build without FBGEMM. The model must stay frozen afterwards.
    """
    return _swap_float32_linears(model, half_wrapper()) if half_available() else 0


def half_wrapper() -> Callable[[nn.Module], "HalfLinear"]:
    """``HalfLinear`` of a plain linear layer, on the project's kernel where it builds here (:func:`own_half`),
    else on FBGEMM's: what :func:`half_linears` swaps in, and what a module wraps a product of its own with."""
    own = own_half()
    return lambda linear: HalfLinear(linear, own=own)


def _swap_float32_linears(model: nn.Module, wrap: Callable[[nn.Module], nn.Module]) -> int:
    """Every float32 CPU ``nn.Linear``/``PackedLinear`` of ``model`` replaced by ``wrap(plain linear)``."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) in (nn.Linear, PackedLinear) and child.weight.device.type == "cpu" \
                    and child.weight.dtype == torch.float32:
                setattr(parent, name, wrap(child.unpacked() if isinstance(child, PackedLinear) else child))
                swapped += 1
    return swapped


# --------------------------------------------------------------------------- bfloat16 weights (AMX)

# Rows up to this many are computed exactly as one row is (checked on the machine by ``bf16_available``): a
# verify forward, a lookahead window or a Jacobi block inside it gives each position the logits a greedy step
# gives. oneDNN's bfloat16 kernels switch their blocking past 32 rows on an AMX Xeon (a one-ulp difference in
# some outputs); a prefill is shared by greedy and every strategy, so that width never parts them.
BF16_EXACT_ROWS = 32
# The widest forward whose rows a reduced-weight model computes exactly as it computes one row: linears in
# chunks of BF16_EXACT_ROWS, attention row by row (gqa_attention.rows_sdpa_forward). Wider forwards are
# prefills, which greedy and every strategy share.
EXACT_WIDTH = 64


class Bf16Linear(_ReducedLinear):
    """``nn.Linear`` on bfloat16 weights, float32 in and out: on the project's kernel (``own``:
    ``attention_kernels.bf16_linear``, AVX-512 BF16's pair products where the CPU has them) or prepacked for oneDNN
    (AMX tiles on an Intel Xeon); :func:`bf16_route` measures which one runs here.

    The input is rounded to bfloat16, the product accumulates in float32 and its result is rounded to
    bfloat16 before it comes back as float32; everything between the linear layers (norms, rotary,
    attention, the residual stream) stays float32. Like a float16-weight preset it is another model (its own
    greedy is the reference), and unlike a bfloat16 model its rows do not depend on how many are computed
    together (oneDNN's up to ``BF16_EXACT_ROWS``, the project's at any width), so the lossless strategies stay
    token-identical to its greedy. Why: where the CPU multiplies bfloat16 natively (AMX's tiles, AVX-512 BF16's
    ``vdpbf16ps``) a product over 16 rows costs far less than float32's or float16's per row, on half the weight
    bytes of float32. The float32 ``weight``/``bias`` stay the module's parameters (``state_dict`` unchanged); a
    call that needs gradients, or an input that is not a float32 CPU tensor, falls back to ``F.linear`` on them.
    """

    def __init__(self, linear: nn.Module, own: Optional[bool] = None) -> None:
        super().__init__(linear)
        self.own = bf16_route() == "own" if own is None else bool(own)
        weight = linear.weight.detach()
        if self.own:
            object.__setattr__(self, "packed", attention_kernels.pack_bf16(weight))
            object.__setattr__(self, "bias16", None if linear.bias is None else
                               linear.bias.detach().to(torch.bfloat16).float())
        else:
            object.__setattr__(self, "packed", _pack(weight.to(torch.bfloat16)))
            object.__setattr__(self, "bias16", None if linear.bias is None else linear.bias.detach().to(torch.bfloat16))

    def reduced(self, rows: torch.Tensor) -> torch.Tensor:
        # [rows, in] f32 -> bf16 -> [rows, out] bf16 (f32 accumulation) -> f32
        if self.own:
            return attention_kernels.bf16_linear(rows, self.packed, self.bias16, self.out_features)
        rows = rows.to(torch.bfloat16)
        if BF16_EXACT_ROWS < rows.shape[0] <= EXACT_WIDTH:      # a wide verify forward: row-exact chunks
            y = torch.cat([self._product(part) for part in rows.split(BF16_EXACT_ROWS)])
        else:
            y = self._product(rows)
        return y.to(torch.float32)

    def _product(self, rows: torch.Tensor) -> torch.Tensor:
        return onednn_linear(rows, self.packed, self.bias16, self.out_features)


_BF16_ROUTE: list = []
BF16_ROUTE_SWITCH = "DECODING_BF16_ROUTE"        # "own" or "onednn": that route where it passes its checks, unmeasured


def bf16_route() -> Optional[str]:
    """Which kernel runs bfloat16-weight linears here: ``"own"`` (the project's, ``attention_kernels.bf16_linear``),
    ``"onednn"``, or None where neither passes :func:`_bf16_checks` on this machine. Where both pass, the faster
    one, measured once (a 3072 x 576 product over 1 and 16 rows, a greedy step's and a verify forward's widths);
    ``DECODING_BF16_ROUTE`` picks one unmeasured. Each route's checks are measured, never assumed: oneDNN's rows
    change with the width on an AMD EPYC Zen 5, and the project's kernel may not build."""
    if not _BF16_ROUTE:
        passing = [route for route in ("own", "onednn") if _bf16_checks(route)]
        forced = os.environ.get(BF16_ROUTE_SWITCH, "").strip().lower()
        if forced in passing:
            passing = [forced]
        _BF16_ROUTE.append(passing[0] if len(passing) == 1 else _faster_bf16_route(passing) if passing else None)
    return _BF16_ROUTE[0]


BF16_ROUTE_MARGIN = 0.10     # oneDNN must be this much faster than the project's kernel to run instead of it


def _faster_bf16_route(routes: list) -> str:
    """Of routes that both pass their checks, the faster: a 3072 x 576 product over 1 and 16 rows, interleaved,
    medians of 7. The project's kernel keeps the route unless oneDNN's is ``BF16_ROUTE_MARGIN`` faster: its
    width-independence is by construction, oneDNN's only measured on random layers."""
    gen = torch.Generator().manual_seed(1)
    layer = _check_layer(576, 3072, 1)
    fast = {route: Bf16Linear(layer, own=route == "own") for route in routes}
    inputs = [torch.randn(rows, 576, generator=gen) for rows in (1, 16)]
    chosen = [routes[0]]
    with torch.inference_mode():
        _, ms = attention_kernels._fastest(tuple(routes), lambda r: chosen.__setitem__(0, r),
                                           lambda: [fast[chosen[0]](x) for x in inputs for _ in range(4)], 7)
    _BF16_TIMES.update(ms)
    if "own" in ms and "onednn" in ms:
        return "onednn" if ms["onednn"] < ms["own"] * (1 - BF16_ROUTE_MARGIN) else "own"
    return min(ms, key=ms.get)


_BF16_TIMES: dict = {}


def bf16_note() -> str:
    """One line for the start's log: which kernel runs the bfloat16-weight products here, and why ('' where none)."""
    route = bf16_route()
    if route is None:
        return ""
    if route == "own":
        how = ("AVX-512 BF16 pair products" if attention_kernels.bf16_info()["dot"]
               else "float32 multiply-adds on widened pairs")
        line = f"bfloat16 products on the project's kernel ({how})"
    else:
        line = "bfloat16 products on oneDNN's kernel"
    if len(_BF16_TIMES) == 2:
        line += " (measured: " + ", ".join(f"{r} {ms:.2f} ms" for r, ms in sorted(_BF16_TIMES.items())) + ")"
    elif os.environ.get(BF16_ROUTE_SWITCH, "").strip().lower() == route:
        line += f" ({BF16_ROUTE_SWITCH}={route})"
    else:
        line += " (the only route whose rows keep their bits at every width here)"
    return line


def bf16_available() -> bool:
    """Whether bfloat16-weight linears run here with rows independent of the width (:func:`bf16_route` found a
    kernel that passes its checks on this machine). Whether the route is also *faster* than another version is
    the caller's measurement."""
    return bf16_route() is not None


# The layers the checks multiply: the bundled model's shapes (q|k|v joined, gate|up joined, down, and a small odd one),
# each drawn with a few seeds of its own: oneDNN's bfloat16 product on an AMD EPYC Zen 5 keeps a row's bits at every
# width for some random layers and not for others (7 of 40 draws of the three first shapes passed), so one draw
# from the process's random state made the route a coin toss between processes.
BF16_CHECK_SHAPES = ((576, 960), (576, 3072), (1536, 576), (96, 200))
BF16_CHECK_SEEDS = (0, 1, 2, 3)
BF16_CHECK_WIDTHS = (2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 24, 31, 32, 33, 48, EXACT_WIDTH)


def _check_layer(width: int, out: int, seed: int) -> nn.Linear:
    gen = torch.Generator().manual_seed(seed)
    layer = nn.Linear(width, out)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(out, width, generator=gen) * width ** -0.5)
        layer.bias.copy_(torch.randn(out, generator=gen) * 0.1)
    return layer


def _layer_checks(shapes: tuple, wrap: Callable[[nn.Module], nn.Module], widths: tuple,
                  want: Callable[[nn.Module, nn.Module, torch.Tensor], torch.Tensor], tolerance: Any,
                  seeds: Optional[tuple] = None, widest: int = EXACT_WIDTH) -> bool:
    """Each layer of ``shapes`` x ``seeds`` (None: one layer a shape, seeded by the shape; either way the same layers
    in every process) wrapped by ``wrap``: every width of ``widths`` up to ``widest`` gives each row the bits of the
    row computed alone, and the rows are within ``tolerance`` (absolute and relative: one number, or a pair) of
    ``want(layer, wrapped, x)``."""
    atol, rtol = tolerance if isinstance(tolerance, tuple) else (tolerance, tolerance)
    gen = torch.Generator().manual_seed(0)
    for width, out in shapes:
        for seed in seeds or (width + out,):
            layer = _check_layer(width, out, seed=seed)
            fast = wrap(layer)
            x = torch.randn(widest, width, generator=gen)
            with torch.inference_mode():
                rows = torch.cat([fast(x[i:i + 1]) for i in range(widest)])
                if any(n <= widest and not torch.equal(fast(x[:n]), rows[:n]) for n in widths):
                    return False
                target = want(layer, fast, x)
            if not torch.allclose(rows, target, atol=atol, rtol=rtol):
                return False
    return True

def _bf16_checks(route: str = "onednn") -> bool:
    """Three checks of a route on :data:`BF16_CHECK_SHAPES` x :data:`BF16_CHECK_SEEDS` (layers of their own seeds,
    so the verdict is the same in every process): its ops exist, every width of :data:`BF16_CHECK_WIDTHS` (to
    ``BF16_EXACT_ROWS`` for oneDNN, whose wider products run in chunks of it) gives each row the bits of the row
    computed alone (the property the lossless strategies rest on; it depends on the CPU's kernels, so it is
    measured, not assumed), and the rows agree with ``F.linear`` on bfloat16-rounded operands."""
    if route == "own" and attention_kernels.load_default() is not None:
        return False
    if route == "onednn" and not available():
        return False
    try:
        return _layer_checks(BF16_CHECK_SHAPES, lambda layer: Bf16Linear(layer, own=route == "own"), BF16_CHECK_WIDTHS,
                             lambda layer, fast, x: F.linear(x.bfloat16().float(), layer.weight.bfloat16().float(),
                                                             layer.bias.bfloat16().float()),
                             tolerance=(3e-2, 2e-2), seeds=BF16_CHECK_SEEDS,
                             widest=EXACT_WIDTH if route == "own" else BF16_EXACT_ROWS)
    except (RuntimeError, TypeError, AttributeError, NotImplementedError):
        return False


def bf16_linears(model: nn.Module) -> int:
    """Every float32 CPU linear layer of ``model`` on bfloat16 weights (``Bf16Linear``); how many were swapped.

    For a target only as a preset that says so (``weights: bf16``): another model, its own reference.
    Does nothing on other devices or dtypes, or where ``bf16_available`` fails. The model must stay frozen.
    """
    return _swap_float32_linears(model, Bf16Linear) if bf16_available() else 0


# --------------------------------------------------------------------------- int8 weights for a target

class Int8Linear(_ReducedLinear):
    """``nn.Linear`` on int8 weights, one float32 scale per output (symmetric, the row's largest magnitude over
    127), float32 in and out: PyTorch's weight-only int8 product (``torch._weight_int8pack_mm``).

    A quarter of float32's weight bytes, half of float16's: where a one-position forward is memory-bound (every
    CPU here), greedy streams less. Rounding the weights makes it another model, its own reference (a
    ``weights: int8`` preset). Its rows must not depend on how many are computed together, which is a property
    of the CPU's kernels: :func:`int8_available` measures it on this machine before any preset uses it."""

    def __init__(self, linear: nn.Module) -> None:
        super().__init__(linear)
        q, scales = int8_rows(linear.weight)
        object.__setattr__(self, "q", q)
        object.__setattr__(self, "scales", scales)
        object.__setattr__(self, "bias32", None if linear.bias is None else linear.bias.detach().float())

    def reduced(self, rows: torch.Tensor) -> torch.Tensor:
        y = torch._weight_int8pack_mm(rows.contiguous(), self.q, self.scales)
        return y if self.bias32 is None else y + self.bias32


def int8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, K]`` weights as int8 with one float32 scale per output (the row's largest magnitude over 127, rounded to
    the nearest integer): ``(q, scales)``, what both int8 linears multiply."""
    weight = weight.detach().float()
    scales = (weight.abs().amax(dim=1) / 127.0).clamp_min(torch.finfo(torch.float32).tiny)
    return torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8), scales.contiguous()


_INT8_OK: list = []
INT8_CHECK_WIDTHS = (*range(2, 18), 24, 31, 32, 33, 48, EXACT_WIDTH)


def int8_available() -> bool:
    """Whether the int8-weight product runs here and keeps each row's bits at every width up to ``EXACT_WIDTH``,
    checked once on random layers (the property the lossless strategies rest on; measured, not assumed), and
    agrees with ``F.linear`` on the dequantized weights."""
    if not _INT8_OK:
        _INT8_OK.append(_int8_checks())
    return _INT8_OK[0]


def _int8_checks() -> bool:
    try:
        return _layer_checks(((576, 1536), (1536, 576), (576, 4096), (96, 200)), Int8Linear, INT8_CHECK_WIDTHS,
                             lambda layer, fast, x: F.linear(x, fast.q.float() * fast.scales[:, None], layer.bias),
                             tolerance=1e-3)
    except (RuntimeError, TypeError, AttributeError, NotImplementedError):
        return False



_INT8_FAST: list = []


def int8_fast() -> bool:
    """Whether this CPU's int8 product is a vectorized one: one row through a 1536 x 576 layer takes no longer
    than float32's ``F.linear`` (a quarter of the bytes; PyTorch 2.13 vectorizes it for AVX-512 only, and on an
    AVX2 Zen 3 it measured ~45x float16's time). Measured once (minimum of 5); an int8 preset loads (and the
    start times it, and the page offers it) only where this holds: a scalar kernel costs seconds a forward."""
    if not _INT8_FAST:
        layer = nn.Linear(576, 1536)
        fast, x = Int8Linear(layer), torch.randn(1, 576)

        def best(fn: Callable[[], Any]) -> float:
            fn()
            times = []
            for _ in range(5):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            return min(times)
        with torch.inference_mode():
            _INT8_FAST.append(int8_available() and best(lambda: fast(x)) <= best(lambda: F.linear(x, layer.weight)))
    return _INT8_FAST[0]


def int8_linears(model: nn.Module) -> int:
    """Every float32 CPU linear layer of ``model`` on int8 weights (``Int8Linear``); how many were swapped. For a
    target only as a preset that says so (``weights: int8``). Nothing where ``int8_available`` fails."""
    return _swap_float32_linears(model, Int8Linear) if int8_available() else 0


# --------------------------------------------------------------------------- int8 weights and int8 activations

# Weight modes (models.WEIGHTS) whose linears round their *inputs* (to bfloat16, to int8 per group): a last-bit
# difference in a row (an attention that sums a wide forward's row in another order) can move a rounding and so a
# token, so only bit-equal rows keep the lossless strategies exact: these models run the row-exact attention
# (gqa_attention.ROWS_NAME), which needs this CPU's attention to keep a row's bits at every key block
# (gqa_attention.key_blocks_exact, measured).
ROUNDED_INPUTS = ("bf16", "w8a8")

class W8A8Linear(_ReducedLinear):
    """``nn.Linear`` on int8 weights and int8 activations, float32 in and out, on the project's kernel
    (``attention_kernels.i8_linear``: AVX-512 VNNI's byte products where the CPU has them, AVX2's elsewhere).

    The weights: one float32 scale per output (the row's largest magnitude over 127), rounded to the nearest
    integer. The activations: each input row, per group of ``attention_kernels.I8_GROUP`` (64) inputs, scaled by
    127 over the group's largest magnitude and rounded to the nearest integer (ties to even). Each group's dot
    product is an exact integer; the groups' scales are applied in order in float32, then the weight's scale, then
    the bias. So a row's bits never depend on how many rows are computed together, nor on the CPU's path (an AVX2
    CPU gives the bits an AVX-512 one gives). Another model (a ``weights: w8a8`` preset, its own reference), whose
    tokens stay close to float32's: per 64 inputs rather than per row, so one large input does not flatten its row's
    other inputs: on the bundled model, the loss on 24 human-written prompts rises 0.45 % over float32's
    (``benchmarks/bench_quality.py``), where a draft of this arithmetic with one scale per row lost 4 % of float32's
    own greedy text's likelihood against 1 % per group (BENCHMARKS.md, "Int8 weights and activations").

    Why: a quarter of float32's weight bytes for a memory-bound greedy step, and four byte products per lane an
    instruction where a verify forward's many rows make the product compute-bound."""

    def __init__(self, linear: nn.Module) -> None:
        super().__init__(linear)
        q, scales = int8_rows(linear.weight)
        object.__setattr__(self, "q", q)
        object.__setattr__(self, "scales", scales)
        object.__setattr__(self, "packed", attention_kernels.pack_int8(q))
        object.__setattr__(self, "bias32", None if linear.bias is None else linear.bias.detach().float().contiguous())

    def reduced(self, rows: torch.Tensor) -> torch.Tensor:
        return attention_kernels.i8_linear(rows, self.packed, self.scales, self.bias32, self.out_features)


_W8A8_OK: list = []
W8A8_CHECK_SHAPES = ((576, 960), (576, 3072), (1536, 576), (96, 200), (70, 50))


def w8a8_available() -> bool:
    """Whether int8-weight-and-activation linears run here: the project's kernel builds, and on seeded layers of
    :data:`W8A8_CHECK_SHAPES` every width of :data:`BF16_CHECK_WIDTHS` gives each row the bits of the row computed
    alone, close to ``F.linear`` on the float32 weights. By construction on every path; checked once per process
    all the same (a miscompiled kernel must not serve a model whose strategies would then part from its greedy)."""
    if not _W8A8_OK:
        _W8A8_OK.append(_w8a8_checks())
    return _W8A8_OK[0]


def _w8a8_checks() -> bool:
    if attention_kernels.load_default() is not None:
        return False
    try:          # int8 activations: within a tenth of the float product (rows of unit size)
        return _layer_checks(W8A8_CHECK_SHAPES, W8A8Linear, BF16_CHECK_WIDTHS, lambda layer, fast, x: layer(x),
                             tolerance=0.1)
    except (RuntimeError, TypeError, AttributeError, NotImplementedError, ValueError):
        return False


def w8a8_linears(model: nn.Module) -> int:
    """Every float32 CPU linear layer of ``model`` on int8 weights and activations (``W8A8Linear``); how many were
    swapped. For a target only as a preset that says so (``weights: w8a8``). Nothing where ``w8a8_available``
    fails. The model must stay frozen."""
    return _swap_float32_linears(model, W8A8Linear) if w8a8_available() else 0


def w8a8_note() -> str:
    """One line for the start's log: which path runs the int8 products here ('' where the kernel did not build)."""
    if not w8a8_available():
        return ""
    how = "AVX-512 VNNI byte products" if attention_kernels.i8_info()["dot"] else "AVX2 byte products"
    return f"int8 x int8 products on the project's kernel ({how}; the same bits on either path)"
