"""Low-rank adapters (LoRA) stored as safetensors and merged into a model's weights at load time.

File format (written by ``playground/training/lora.py``, read here): for every adapted linear layer
``<path>`` (its name in ``model.named_modules()``) two tensors ``<path>.lora_A`` ``[r, in]`` and
``<path>.lora_B`` ``[out, r]``, stored in float16; the metadata holds ``scale`` (alpha / r) and the
``base`` model the adapter was trained on. Merging adds ``scale * B @ A`` (computed in float32) to
each weight, so the merged model runs exactly like any other model: no extra modules, no extra
cost per forward, and every decoding loop and kernel choice applies unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

SUFFIX_A, SUFFIX_B = ".lora_A", ".lora_B"


def read_adapter(path: Path | str) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], dict[str, str]]:
    """``{layer path: (A [r, in], B [out, r])}`` and the file's metadata."""
    from safetensors import safe_open
    factors: dict[str, dict[str, torch.Tensor]] = {}
    with safe_open(str(path), framework="pt") as fh:
        meta = dict(fh.metadata() or {})
        for key in fh.keys():
            for suffix in (SUFFIX_A, SUFFIX_B):
                if key.endswith(suffix):
                    factors.setdefault(key[:-len(suffix)], {})[suffix] = fh.get_tensor(key)
    pairs = {}
    for name, ab in factors.items():
        if set(ab) != {SUFFIX_A, SUFFIX_B}:
            raise ValueError(f"adapter {path}: layer {name!r} lacks one of its two factors")
        pairs[name] = (ab[SUFFIX_A], ab[SUFFIX_B])
    if "scale" not in meta:
        raise ValueError(f"adapter {path}: no 'scale' in its metadata")
    if not pairs:                   # merging it would change nothing: a preset that silently is its base
        raise ValueError(f"adapter {path}: holds no layer's factors")
    return pairs, meta


def adapter_delta(a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """The weight change of one layer, ``scale * B @ A`` in float32: ``[out, in]``."""
    return scale * (b.float() @ a.float())


@torch.no_grad()
def merge_adapter(model: Any, path: Path | str) -> dict[str, str]:
    """Add the adapter at ``path`` into ``model``'s linear weights (in place); returns its metadata.

    Every layer the file names must exist with the matching shape, or nothing is changed.
    """
    pairs, meta = read_adapter(path)
    modules = dict(model.named_modules())
    scale = float(meta["scale"])
    for name, (a, b) in pairs.items():
        layer = modules.get(name)
        weight = getattr(layer, "weight", None)
        if weight is None or tuple(weight.shape) != (b.shape[0], a.shape[1]) or a.shape[0] != b.shape[1]:
            raise ValueError(f"adapter {path}: layer {name!r} is missing from the model or has another shape")
    for name, (a, b) in pairs.items():
        weight = modules[name].weight
        weight.copy_((weight.float() + adapter_delta(a, b, scale).to(weight.device)).to(weight.dtype))
    return meta
