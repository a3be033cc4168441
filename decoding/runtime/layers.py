"""A decoder-only model's stack of layers, and views of the model that run only some of them.

Self-speculative decoding drafts with the target's own layers: its first ``exit_layer`` layers (LayerSkip's
early exit) or all but a skipped set (SWIFT, Draft & Verify), then its final norm and LM head. A
:func:`layer_view` is that draft model: a shallow copy of the loaded model whose decoder holds a
``ModuleList`` of the chosen layers, the very same modules (one set of weights, nothing copied) and nothing of
the model changed, so a forward of the view beside a forward of the model (another thread, the compiled path)
sees the model as it was.

Each layer keeps its own index (``self_attn.layer_idx``), so a view's forward on the target's KV cache writes
the keys and values of the layers it runs into those layers' slots and leaves the others alone: the draft reads
the target's cache of the committed context instead of keeping a cache of its own. Layer 0 always runs, because
the model's forward reads the cache's length (for positions and the causal mask) from layer 0.
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

from torch import nn

LAYER_NAMES = ("layers", "h", "blocks", "layer")   # Llama, Mistral, Qwen2, NeoX: layers; GPT-2: h


def decoder_stack(model: Any) -> tuple[nn.Module, str, nn.ModuleList]:
    """``(decoder module, attribute, its layers)`` of a decoder-only causal LM; ``ValueError`` naming why not."""
    if getattr(model.config, "is_encoder_decoder", False):
        raise ValueError("self-speculative decoding drafts with a decoder-only model's own layers; "
                         f"{type(model).__name__} is an encoder-decoder model")
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    if not isinstance(base, nn.Module) or base is model:
        raise ValueError(f"cannot find the decoder inside {type(model).__name__} (its base_model_prefix names "
                         f"no submodule), so its layers cannot be split for self-speculative decoding")
    n = num_layers(model)
    for name in LAYER_NAMES:
        stack = base._modules.get(name)
        if isinstance(stack, nn.ModuleList) and len(stack) == n and n > 0:
            return base, name, stack
    raise ValueError(f"{type(model).__name__} keeps its {n} decoder layers in no ModuleList named "
                     f"{' / '.join(LAYER_NAMES)}, so self-speculative decoding cannot split them")


def num_layers(model: Any) -> int:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(getattr(config, "num_hidden_layers", 0) or getattr(config, "n_layer", 0) or 0)


def check_layers(model: Any) -> int:
    """The number of decoder layers of a model self-speculation can split (at least 2); ``ValueError`` else."""
    _, _, stack = decoder_stack(model)
    if len(stack) < 2:
        raise ValueError(f"self-speculative decoding needs at least 2 decoder layers to draft with fewer; "
                         f"this model has {len(stack)}")
    return len(stack)


def layer_view(model: Any, kept: Sequence[int]) -> nn.Module:
    """The model running only decoder layers ``kept`` (ascending, layer 0 first), sharing every weight.

    Nothing of ``model`` is modified: the view and its decoder are shallow copies with their own table of
    submodules, in which the layer list is replaced.
    """
    base, name, stack = decoder_stack(model)
    kept = list(kept)
    if not kept or kept[0] != 0 or kept != sorted(set(kept)) or kept[-1] >= len(stack):
        raise ValueError(f"a layer view runs layer 0 and then ascending layers below {len(stack)}, got {kept}")
    base_view = copy.copy(base)
    object.__setattr__(base_view, "_modules", dict(base._modules))
    base_view._modules[name] = nn.ModuleList([stack[i] for i in kept])
    view = copy.copy(model)
    object.__setattr__(view, "_modules", dict(model._modules))
    view._modules[model.base_model_prefix] = base_view
    return view


def config_view(model: Any) -> nn.Module:
    """The model with every layer, every weight shared, and a config of its own: the view and its decoder hold one
    copy of ``model.config``, so code that edits the config while it runs (transformers' ``assistant_early_exit``
    lowers ``num_hidden_layers`` during its drafts) leaves ``model``, and any other run on it, untouched."""
    _, _, stack = decoder_stack(model)
    view = layer_view(model, range(len(stack)))
    config = copy.deepcopy(model.config)
    object.__setattr__(view, "config", config)
    object.__setattr__(view._modules[model.base_model_prefix], "config", config)
    return view
