"""Grouped-query attention over a custom mask without copying the KV cache (CPU).

transformers' ``sdpa`` attention hands SDPA its grouped keys and values only
when there is no mask. A forward over several new positions with a mask (a
token tree's verify forward, a lookahead window) instead expands every layer's
cached keys and values to one copy per query head (``repeat_kv``) before each
call. SmolLM2-135M has 9 query heads over 3 KV heads, so each layer copies its
cache three times over, every forward. A profile of the prophet on the CPU put
7 % of a run's time in that copy (BENCHMARKS.md, "Cheaper tree verification on
the CPU").

PyTorch's SDPA takes the grouped tensors with a mask directly
(``enable_gqa=True``). On the CPU its result is bit-identical to the expanded
call, so nothing a strategy commits can change; a test checks that on a tree
forward. This module registers that attention under :data:`NAME`, with the
``sdpa`` mask builder, and :func:`use_gqa_attention` switches a model whose
attention is ``sdpa`` to it. Every other case (no mask, one query position,
no grouping, a position bias, a softcap, any device but the CPU, where a masked
GQA call can fall back to a slower kernel) goes to transformers' own ``sdpa``
function unchanged.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

NAME = "sdpa_gqa_cpu"


def _grouped(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             attention_mask: Optional[torch.Tensor], kwargs: dict) -> bool:
    """Whether this call is the one transformers would serve by copying the keys and values."""
    return (query.device.type == "cpu" and attention_mask is not None and query.shape[2] > 1
            and getattr(module, "num_key_value_groups", 1) > 1 and key.shape[-1] == value.shape[-1]
            and kwargs.get("position_bias") is None and kwargs.get("softcap") is None
            and not kwargs.get("output_attentions", False))


def gqa_sdpa_forward(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                     is_causal: Optional[bool] = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query [B, heads, T, d]``, ``key``/``value [B, kv, S, d]``
    -> ``([B, T, heads, d], None)``."""
    if not _grouped(module, query, key, value, attention_mask, kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling, is_causal=False, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Make :data:`NAME` known to transformers (idempotent); its masks are built as ``sdpa``'s."""
    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, gqa_sdpa_forward)
    if NAME not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)


def use_gqa_attention(model: Any) -> bool:
    """Switch ``model`` from ``sdpa`` to :data:`NAME`; whether it did (other implementations stay as they are)."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa" or not hasattr(model, "set_attn_implementation"):
        return False
    register()
    model.set_attn_implementation(NAME)
    return config._attn_implementation == NAME
