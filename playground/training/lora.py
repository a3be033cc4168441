"""LoRA for training: low-rank trainable factors beside frozen linear layers, saved in the format
``decoding/runtime/adapter.py`` merges at load time.

A wrapped layer computes ``W x + scale * B (A x)`` with ``W`` frozen, ``A`` ``[r, in]`` small random
and ``B`` ``[out, r]`` zero at the start (so training starts from the base model exactly). Written
here rather than taken from ``peft``: the adapter is merged into plain weights at load time, so the
runtime needs no extra package, and the wrapper is a dozen lines.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable

import torch
from torch import nn

from decoding.runtime.adapter import SUFFIX_A, SUFFIX_B

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoRALinear(nn.Module):
    """``base(x) + scale * x A^T B^T``; ``base`` stays frozen."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        self.base = base
        self.scale = alpha / rank
        # on the base layer's device (a model already on the GPU gets its factors there), in float32
        at = base.weight.device
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, device=at))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, device=at))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        base.weight.requires_grad_(False)
        if base.bias is not None:
            base.bias.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_A.t() @ self.lora_B.t()) * self.scale


def add_lora(model: nn.Module, rank: int, alpha: float, targets: Iterable[str] = DEFAULT_TARGETS) -> list[str]:
    """Freeze ``model`` and put a LoRA beside every linear layer whose name ends in one of ``targets``.

    Returns the adapted layers' paths as the runtime model names them (without ``.base``).
    """
    for p in model.parameters():
        p.requires_grad_(False)
    targets = tuple(targets)
    names = [name for name, m in model.named_modules()
             if isinstance(m, nn.Linear) and name.rsplit(".", 1)[-1] in targets]
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, LoRALinear(getattr(parent, child), rank, alpha))
    return names


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def lora_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The trainable factors (float32), keyed in the adapter file's naming."""
    out = {}
    for name, m in lora_layers(model).items():
        out[name + SUFFIX_A] = m.lora_A.detach().clone()
        out[name + SUFFIX_B] = m.lora_B.detach().clone()
    return out


@torch.no_grad()
def load_lora_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    for name, m in lora_layers(model).items():
        m.lora_A.copy_(state[name + SUFFIX_A])
        m.lora_B.copy_(state[name + SUFFIX_B])


def save_adapter(model: nn.Module, path: Path, metadata: dict[str, Any]) -> None:
    """Write the factors in float16 with ``scale`` and ``metadata`` (values made strings)."""
    from safetensors.torch import save_file
    layers = lora_layers(model)
    scales = {m.scale for m in layers.values()}
    if len(scales) != 1:
        raise ValueError(f"one scale per adapter, found {sorted(scales)}")
    tensors = {k: v.to(torch.float16).contiguous() for k, v in lora_state(model).items()}
    meta = {"format": "lora", "scale": repr(scales.pop()), **{k: str(v) for k, v in metadata.items()}}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=meta)
