"""Prepacked oneDNN linear layers for CPU inference.

Why this exists: on CPU, PyTorch sends a float32 ``nn.Linear`` to MKL's sgemm.
For one row (a greedy step) that is a matrix-vector product, but for 2-16 rows
(a verify forward over drafted tokens, a lookahead window) MKL repacks the
whole weight matrix on every call, so a 4-position forward costs about twice a
1-position one (BENCHMARKS.md, "The cost of a wide forward"). oneDNN can pack each
weight once, at load time, into the blocked layout its kernels read; after
that a forward over 1-16 positions costs about the same as over one, and even
the one-row case gets faster (the bundled model's LM head: 12 ms -> 6 ms on
the project's 2-vCPU machine).

``pack_linears(model)`` swaps every ``nn.Linear`` of a loaded model for a
``PackedLinear`` that keeps the same ``weight``/``bias`` parameters (tied
weights stay tied, ``state_dict`` keys do not change) and adds the packed copy
as a plain attribute, out of ``parameters()``, ``buffers()`` and
``state_dict()``. Both the baseline and every strategy run through the same
packed layers, so "identical to greedy" keeps its meaning. Arithmetic stays in
the model's dtype with float32 accumulation: the packed result differs from
MKL's only by summation order (about 1e-4 on the bundled model's logits).

The two operators are PyTorch's own oneDNN ops (the ones inductor uses when it
freezes a CPU model). They are not public API, so every call site falls back
to ``F.linear``: when the ops are missing, when gradients are needed (training
the prophet through the frozen LM head), or when an input is not a CPU tensor
of the packed dtype. ``pack_linears`` also checks one layer's output against
``F.linear`` before it swaps anything.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

PACKABLE_DTYPES = (torch.float32, torch.bfloat16)


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


class PackedLinear(nn.Module):
    """``nn.Linear`` whose forward uses a weight prepacked for oneDNN."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight            # the same Parameter: tied weights stay tied
        self.bias = linear.bias
        object.__setattr__(self, "packed", _pack(linear.weight))   # not a buffer: opaque, CPU only

    def usable(self, x: torch.Tensor) -> bool:
        return (x.device.type == "cpu" and x.dtype == self.packed.dtype
                and not (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.usable(x):
            return F.linear(x, self.weight, self.bias)
        lead = x.shape[:-1]
        # [..., in] -> [rows, in] -> [rows, out] -> [..., out]
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, self.in_features), self.packed,
                                               self.bias, "none", [], "")
        return y.reshape(*lead, self.out_features)

    def unpacked(self) -> nn.Linear:
        plain = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                          device="meta")
        plain.weight = self.weight
        plain.bias = self.bias
        return plain

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=oneDNN"


def _linears(model: nn.Module, kind: type) -> list[tuple[nn.Module, str, nn.Module]]:
    return [(parent, name, child) for parent in model.modules()
            for name, child in parent.named_children() if type(child) is kind]


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


def pack_linears(model: nn.Module) -> int:
    """Swap the model's ``nn.Linear`` layers for ``PackedLinear``; returns how many were swapped.

    Does nothing (returns 0) for a model that is not on the CPU, not float32/bfloat16,
    or on a PyTorch build without the oneDNN ops. The model must be frozen from here on:
    the packed copy does not follow later in-place changes to the weights.
    """
    if not available():
        return 0
    try:
        param = next(model.parameters())
    except StopIteration:
        return 0
    dtype = param.dtype
    if param.device.type != "cpu" or dtype not in PACKABLE_DTYPES:
        return 0
    found = [entry for entry in _linears(model, nn.Linear) if entry[2].weight.dtype == dtype]
    if not found or not _agrees(found[0][2]):
        return 0
    for parent, name, child in found:
        setattr(parent, name, PackedLinear(child))
    return len(found)


def unpack_linears(model: nn.Module) -> int:
    """Undo ``pack_linears`` (benchmarks compare both kernels on one loaded model)."""
    found = _linears(model, PackedLinear)
    for parent, name, child in found:
        setattr(parent, name, child.unpacked())
    return len(found)


def is_packed(model: Any) -> bool:
    return packed_bytes(model) > 0


def packed_bytes(model: Any) -> int:
    """Memory held by the packed copies (outside ``parameters()``/``buffers()``)."""
    return sum(m.packed.numel() * m.packed.element_size()
               for m in getattr(model, "modules", lambda: [])() if isinstance(m, PackedLinear))
