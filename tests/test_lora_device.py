"""The consistency trainer on an accelerator, checked on the CPU: LoRA factors are made where their base layer
lives (the first H100 run failed with factors left on the CPU beside CUDA weights), and ``--bf16`` really runs the
training step's products under bfloat16 autocast while the default on a CPU stays in the model's dtype."""

from __future__ import annotations

import torch
from torch import nn

import playground.train_consistency as tc
from playground.training.lora import LoRALinear, add_lora


def test_lora_factors_live_on_their_base_layers_device():
    # "meta" stands in for "cuda": a factor made on the default device (the CPU) fails this as it failed on the GPU
    base = nn.Sequential(nn.Linear(8, 6, device="meta"))
    base[0].q_proj = nn.Linear(6, 4, device="meta")
    names = add_lora(base, rank=2, alpha=4.0, targets=("q_proj",))
    layer = base[0].q_proj
    assert names == ["0.q_proj"] and isinstance(layer, LoRALinear)
    assert layer.lora_A.device.type == "meta" and layer.lora_B.device.type == "meta"
    assert layer.lora_A.requires_grad and not layer.base.weight.requires_grad
    on_cpu = LoRALinear(nn.Linear(5, 3), rank=2, alpha=4.0)
    assert on_cpu.lora_A.shape == (2, 5) and on_cpu.lora_B.shape == (3, 2) and not on_cpu.lora_B.any()


def _one_step(monkeypatch, tmp_path, flags: list[str]) -> list[tuple[bool, torch.dtype]]:
    seen = []
    model = nn.Linear(4, 4)

    def fake_losses(m, batch, weights, per_block, rng):
        seen.append((torch.is_autocast_enabled("cpu"), m(torch.ones(1, 4)).dtype))
        return {"loss": m(torch.ones(1, 4)).float().pow(2).mean(), "ar": 0.0}

    monkeypatch.setattr(tc, "losses", fake_losses)
    monkeypatch.setattr(tc, "evaluate", lambda *a, **k: {})
    args = tc.parse_args(["--steps", "1", "--batch", "1", "--out-dir", str(tmp_path), "--no-eval-at-start",
                          "--eval-every", "100"] + flags)
    tc.train(model, None, [{"blocks": []}], [], args, None)
    return seen


def test_bf16_flag_puts_the_training_step_under_autocast(monkeypatch, tmp_path):
    assert _one_step(monkeypatch, tmp_path, ["--bf16"]) == [(True, torch.bfloat16)]
    assert _one_step(monkeypatch, tmp_path, []) == [(False, torch.float32)]      # CPU default: the model's dtype
    assert _one_step(monkeypatch, tmp_path, ["--no-bf16"]) == [(False, torch.float32)]
