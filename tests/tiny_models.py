"""Tiny random models built from configs: no weights, no network."""

from __future__ import annotations

import contextlib
from typing import Iterator

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


@contextlib.contextmanager
def prefill_once_per_prompt() -> Iterator[None]:
    """The statistical tests run thousands of generations of 3 tokens from one prompt, and the prompt's
    prefill was 2 of each run's ~3 forwards (target and assistant). Within this block a session's first
    prefill of a (model, prompt) is computed and kept; later ones get a copy of its cache, logits and hidden
    states, the forward counted as before. The prefill samples nothing, so every run draws the same tokens
    as without the block (the random stream is untouched); traced, fast-path, batched and encoder-decoder
    prefills run as usual. Only a prefill's output is reused: drafting, verification and the cache edits
    after it all run."""
    from decoding.runtime.session import Session
    original = Session.prefill
    kept: dict = {}

    def prefill(self, prompt_ids, batch=1, hidden=False):
        if self.fast or batch != 1 or self.lm.is_encoder_decoder or self.tracer.enabled:
            return original(self, prompt_ids, batch, hidden)
        key = (self.lm.uid, tuple(prompt_ids), hidden, self.hidden_layers)
        if key not in kept:
            logits = original(self, prompt_ids, batch, hidden)
            kept[key] = (_copy_cache(self.cache), logits.clone(), self.last_hidden.clone() if hidden else None)
            return logits
        cache, logits, states = kept[key]
        self.cache, self._prefix = _copy_cache(cache), list(prompt_ids)
        self.forwards += 1
        self.positions += len(prompt_ids)
        if hidden:
            self.last_hidden = states.clone()
        return logits.clone()
    Session.prefill = prefill
    try:
        yield
    finally:
        Session.prefill = original


@torch.inference_mode()
def _copy_cache(cache):
    """A new cache of the project's kind holding a copy of ``cache``'s positions, layer by layer."""
    from decoding.runtime.kvcache import new_dynamic_cache
    fresh = new_dynamic_cache()
    for i, layer in enumerate(cache.layers):
        fresh.update(layer.keys, layer.values, i)
    return fresh
