"""Tiny random models built from configs: no weights, no network."""

from __future__ import annotations

import torch

from decoding.runtime.models import wrap_model

VOCAB = 96


def _configs(vocab: int = VOCAB) -> dict:
    from transformers import GPT2Config, GPTNeoXConfig, LlamaConfig
    common = dict(vocab_size=vocab, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return {
        "llama": LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                             **common),
        "gpt2": GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=512, **common),
        "gptneox": GPTNeoXConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, max_position_embeddings=512, **common),
    }


ARCHS = ("llama", "gpt2", "gptneox")


def tiny_causal(arch: str = "llama", seed: int = 0, dtype: torch.dtype = torch.float32,
                vocab: int = VOCAB, eos: bool = True, scale: float = 1.0, device: str = "cpu", layers: int = 2):
    """A random causal LM. ``scale`` sharpens the output distribution (larger = peakier); ``layers``: its
    decoder layers."""
    from transformers import AutoModelForCausalLM
    config = _configs(vocab)[arch]
    config.num_hidden_layers = layers      # GPT-2's n_layer is an alias of it
    if not eos:
        config.eos_token_id = None
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).to(dtype).to(device)
    if scale != 1.0:
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(scale)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = 0
    return wrap_model(model, None, name=f"tiny-{arch}")


def tiny_marian(seed: int = 0, dtype: torch.dtype = torch.float32, vocab: int = VOCAB):
    from transformers import MarianConfig, MarianMTModel
    config = MarianConfig(vocab_size=vocab, d_model=64, encoder_layers=2, decoder_layers=2,
                          encoder_attention_heads=4, decoder_attention_heads=4,
                          encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=512,
                          pad_token_id=0, eos_token_id=2, decoder_start_token_id=0,
                          forced_eos_token_id=None)
    torch.manual_seed(seed)
    model = MarianMTModel(config).to(dtype)
    model.generation_config.bad_words_ids = None
    model.generation_config.forced_eos_token_id = None
    model.generation_config.decoder_start_token_id = 0
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    return wrap_model(model, None, name="tiny-marian")


def prompt(n: int = 8, seed: int = 0, vocab: int = VOCAB) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()
