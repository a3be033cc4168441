"""Prompts the model writes itself: its chat template up to the start of a user turn, then sampling.

An instruct model has seen many user turns, so given ``<|im_start|>user\\n`` (whatever its template
puts before a user's words) it writes a plausible request. Each call samples one batch at one
temperature from one seed: that batch is one *source* (``self:t0.9:s17``), and held-out sets hold
whole sources out, never single prompts. Kept: finished turns (the model ended its turn) of 3 to
60 words, plain text, not a system prompt or an assistant reply in disguise, nothing unsafe (a word list),
not a near-duplicate
of an earlier prompt (same first eight words, case and punctuation ignored).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Optional

import torch

MARK = "\x00USER-TURN\x00"
BAD_STARTS = ("you are", "hello, welcome", "welcome", "as an ai", "i am an ai", "sure", "certainly",
              "system", "assistant", "user")
BAD_WORDS = ("smollm", "hugging face", "<|", "|>", "http", "www.", "sh**", "f**")
UNSAFE = re.compile(r"\b(guns?|weapons?|kill\w*|drugs?|sex\w*|porn\w*|nazi\w*|suicid\w*|shit\w*|fuck\w*)\b")


@dataclass(frozen=True)
class Prompt:
    text: str
    source: str            # "self:t<temperature>:s<seed>" or "template:s<seed>"


def user_turn_prefix(tokenizer: Any) -> str:
    """The chat template's text before a user's message (system prompt included, if the template adds one)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": MARK}], tokenize=False)
    return text[:text.index(MARK)]


def dedup_key(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9 ]+", " ", text.lower()).split()[:8])


def acceptable(text: str) -> bool:
    words = text.split()
    if not 3 <= len(words) <= 60:
        return False
    if sum(ch.isascii() for ch in text) < 0.98 * len(text):
        return False
    low = text.lower()
    return not low.startswith(BAD_STARTS) and not any(w in low for w in BAD_WORDS) and not UNSAFE.search(low)


@torch.inference_mode()
def sample_user_turns(lm: Any, *, seed: int, temperature: float, count: int, max_new: int = 64,
                      top_p: float = 0.95) -> list[str]:
    """``count`` user turns sampled in one batch; unfinished ones (no end of turn) come back as ''."""
    tok = lm.tokenizer
    ids = tok(user_turn_prefix(tok), return_tensors="pt", add_special_tokens=False).input_ids.to(lm.device)
    torch.manual_seed(seed)
    eos = list(lm.eos_token_ids)
    out = lm.model.generate(ids.repeat(count, 1), attention_mask=torch.ones_like(ids).repeat(count, 1),
                            do_sample=True, temperature=temperature, top_p=top_p, top_k=0,
                            max_new_tokens=max_new, eos_token_id=eos, pad_token_id=eos[0] if eos else 0)
    texts = []
    for row in out[:, ids.shape[1]:].tolist():
        end = next((i for i, t in enumerate(row) if t in eos), None)
        texts.append("" if end is None else tok.decode(row[:end], skip_special_tokens=True).strip())
    return texts


def self_prompts(lm: Any, seeds: Iterable[int], temperatures: tuple[float, ...], per_seed: int,
                 seen: Optional[set[str]] = None, progress: Any = None) -> list[Prompt]:
    """Filtered, deduplicated self-written prompts; seed ``s`` samples at ``temperatures[s % len]``.

    ``seen`` (dedup keys) is extended in place, so several calls share one dedup.
    """
    seen = set() if seen is None else seen
    out: list[Prompt] = []
    for seed in seeds:
        temp = temperatures[seed % len(temperatures)]
        for text in sample_user_turns(lm, seed=seed, temperature=temp, count=per_seed):
            key = dedup_key(text)
            if text and acceptable(text) and key not in seen:
                seen.add(key)
                out.append(Prompt(text, f"self:t{temp}:s{seed}"))
        if progress is not None:
            progress(len(out))
    return out


def template_prompts(build: Any, n: int, seed: int, seen: set[str], exclude: frozenset = frozenset()) -> list[Prompt]:
    """``n`` prompts from the prophet's templates (``build`` is ``train_prophet.build_prompts``), one source."""
    out = []
    for text in build(n, seed=seed, exclude=exclude):
        key = dedup_key(text)
        if key not in seen:
            seen.add(key)
            out.append(Prompt(text, f"template:s{seed}"))
    return out
