"""A test adapter for the bundled model: random LoRA factors in the file format ``decoding/runtime/adapter.py``
reads, and an operator presets file (``DECODING_PLAYGROUND_PRESETS``) naming it as a preset trained for Jacobi.

It stands in for the consistency-trained adapter no GPU has trained yet: it makes another model out of the
bundled one (its greedy differs from the base model's), so a race of the two shows two models, not one twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

BASE = "smollm2-135m-instruct"
PRESET = "smollm2-135m-instruct-test-cllm"


def projections(config: Any) -> dict[str, tuple[int, int]]:
    """``{layer path: (out, in)}`` of every attention and MLP projection of a Llama-style model's ``config``
    (the names ``named_modules()`` gives before the kernels pack the weights, where adapters are merged)."""
    hidden, inter = config.hidden_size, config.intermediate_size
    head = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    q, kv = config.num_attention_heads * head, config.num_key_value_heads * head
    shapes = {"self_attn.q_proj": (q, hidden), "self_attn.k_proj": (kv, hidden), "self_attn.v_proj": (kv, hidden),
              "self_attn.o_proj": (hidden, q), "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden),
              "mlp.down_proj": (hidden, inter)}
    return {f"model.layers.{i}.{name}": shape for i in range(config.num_hidden_layers) for name, shape in shapes.items()}


def write_adapter(config: Any, path: Path, rank: int = 4, std: float = 0.1, seed: int = 0) -> Path:
    """Random factors for every projection of ``config``'s model (float16, scale 1). At ``std`` 0.1 the bundled
    model stays fluent and its greedy answer leaves the base model's within a few tokens."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, (out_f, in_f) in projections(config).items():
        tensors[f"{name}.lora_A"] = (torch.randn(rank, in_f, generator=gen) * std).half()
        tensors[f"{name}.lora_B"] = (torch.randn(out_f, rank, generator=gen) * std).half()
    save_file(tensors, str(path), metadata={"scale": "1.0", "base": BASE})
    return path


def write_presets(folder: Path, config: Any) -> Path:
    """``folder/models.yaml``: the test preset on the bundled model (``config``: its config) with a test adapter,
    trained for Jacobi."""
    write_adapter(config, folder / "test-cllm.safetensors")
    path = folder / "models.yaml"
    path.write_text(f"models:\n  {PRESET}:\n    base: {BASE}\n    adapter: test-cllm.safetensors\n"
                    f"    trained_for: jacobi\n    trained_params: {{block_size: 8}}\n"
                    f"    description: a test adapter (random factors)\n", encoding="utf-8")
    return path
