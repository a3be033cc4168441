"""Tiny random models built from configs: no weights, no network."""

from __future__ import annotations

import contextlib
import hashlib
import time
from typing import Iterator, Optional

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
def memo_forwards() -> Iterator[dict]:
    """The statistical tests run thousands of generations of 3 tokens from one prompt of a vocabulary of 6:
    their forwards repeat, and ~75 % of a tiny model's forward is transformers' Python around the arithmetic.
    Within this block ``Session.forward`` (the one place the loops call a model) answers a forward it has seen
    from memory. The key is everything the real forward reads: the model (its parameters, so a layer view is
    its own), the KV cache's contents byte for byte (every layer's keys and values, with their shapes), the
    input ids, position ids and 4D mask byte for byte, and ``last_only``, ``hidden`` and ``hidden_layers``. A
    hit appends the real forward's new keys and values through the cache's own ``update`` (the call attention
    makes) and counts the forward through ``Session._account``; logits and hidden states come back as copies
    of the real forward's. So a wrong crop, compaction, position or mask is a different key and runs the model,
    and every run draws exactly the tokens it would without the block (the random stream is untouched). A
    forward that does more to the cache than append is never kept. Fast-path, traced, batched and
    encoder-decoder forwards run as usual. Yields the hit and miss counts."""
    from transformers import DynamicCache

    from decoding.runtime.session import Session
    original = Session.forward
    kept: dict = {}
    models: dict = {}
    counts = {"hits": 0, "misses": 0}

    def forward(self, ids, *, position_ids=None, attention_mask=None, last_only=False, hidden=False,
                kind="decode"):
        args = dict(position_ids=position_ids, attention_mask=attention_mask, last_only=last_only,
                    hidden=hidden, kind=kind)
        if (self.runner is not None or self.fast or self.tracer.enabled or ids.shape[0] != 1
                or type(self.cache) is not DynamicCache):
            return original(self, ids, **args)
        key = (_model_key(self.model, models), _cache_digest(self.cache), _digest(ids), _digest(position_ids),
               _digest(attention_mask), last_only, hidden, tuple(self.hidden_layers))
        if key in kept:
            counts["hits"] += 1
            return _replay(self, kept[key], ids, kind)
        counts["misses"] += 1
        before = [_filled(layer) for layer in self.cache.layers]
        logits = original(self, ids, **args)
        appended = _appended(self.cache, before)
        if appended is not None:
            kept[key] = (logits.clone(), self.last_hidden.clone() if hidden else None, appended)
        return logits
    Session.forward = forward
    try:
        yield counts
    finally:
        Session.forward = original


def _model_key(model, models: dict) -> tuple:
    """The ids of ``model``'s parameters, in order (a layer view runs fewer layers than its model, and two views
    of the same layers share them); ``models`` keeps each model alive while it is in use, so no id is reused."""
    entry = models.get(id(model))
    if entry is None or entry[0] is not model:
        entry = models[id(model)] = (model, tuple(id(p) for p in model.parameters()))
    return entry[1]


def _digest(t) -> Optional[tuple]:
    if t is None:
        return None
    t = t.detach().contiguous()
    return (tuple(t.shape), str(t.dtype), hashlib.blake2b(t.view(-1).view(torch.uint8).numpy(),
                                                          digest_size=16).digest())


def _cache_digest(cache) -> tuple:
    return tuple((_digest(layer.keys), _digest(layer.values)) for layer in cache.layers)


def _filled(layer) -> Optional[tuple]:
    """A copy of a cache layer's keys and values; None for a layer made but never written (a layer view that
    skips it wrote a later one)."""
    if layer.keys is None:
        return None
    return layer.keys.clone(), layer.values.clone()


def _appended(cache, before: list) -> Optional[list]:
    """``(layer, new keys, new values)`` for each layer the forward appended to; None when it changed anything
    already cached (then the forward is not kept)."""
    out = []
    for i, layer in enumerate(cache.layers):
        if layer.keys is None:
            continue
        old = before[i] if i < len(before) else None
        keys, values = old if old is not None else (layer.keys[..., :0, :], layer.values[..., :0, :])
        n = keys.shape[-2]
        if layer.keys.shape[-2] < n or not (torch.equal(layer.keys[..., :n, :], keys)
                                            and torch.equal(layer.values[..., :n, :], values)):
            return None
        if layer.keys.shape[-2] > n:
            out.append((i, layer.keys[..., n:, :].clone(), layer.values[..., n:, :].clone()))
    return out


def _replay(session, entry: tuple, ids, kind: str):
    """A kept forward played on ``session``: its keys and values appended, counted, its outputs copied."""
    logits, states, appended = entry
    t0 = time.perf_counter()
    with torch.inference_mode():
        for i, keys, values in appended:
            session.cache.update(keys, values, i)
    session._account(ids, t0, kind, None if states is None else states.clone())
    return logits.clone()
