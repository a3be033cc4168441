"""Prompts that look like use, made offline by the target itself (the Magpie recipe, Xu et al. 2024).

An instruct model has read many user turns, so given its chat template up to the start of one
(``<|im_start|>user\\n`` for SmolLM2, system prompt included) it writes a plausible request. This
module builds every kind of prompt the prophet head's data mixes:

* ``magpie``   free user turns sampled at one temperature;
* ``seeded``   the user turn starts with a few words (``Write a Python``, ``Translate``, ``Solve``) and
               the model finishes the request: code, math and translation requests in the model's words;
* ``followup`` the next user turn of a conversation (an earlier prompt and the target's answer);
* ``grounded`` a task on a given text: summaries, rewrites, extraction, code edits, over docstrings and
               functions of Python's standard library or over the target's own earlier answers;
* ``template`` the project's own templates (``train_prophet.build_prompts``), as a minority.

Every batch comes from one **source** (kind, seed words or text origin, temperature); held-out sets
take whole sources, never single prompts, and never split by template (``split_by_source``). Sampled
turns are kept only when finished (the model ended its turn), 3 to 80 words, plain text, not
degenerate (``reject_reason``) and not a near-duplicate of a kept prompt (``Deduper``: Jaccard
overlap of word 3-grams, an inverted index keeps it linear).
"""

from __future__ import annotations

import ast
import random
import re
import sysconfig
import textwrap
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import torch

MARK = "\x00USER-TURN\x00"
BAD_WORDS = ("<|", "|>", "smollm", "hugging face", "http://", "https://", "www.")
BAD_STARTS = ("you are a", "as an ai", "i am an ai", "sure,", "certainly", "assistant", "system:")


@dataclass(frozen=True)
class Source:
    """Where a batch of prompts comes from; ``held_out`` sources are never trained on."""
    name: str
    kind: str                     # magpie | seeded | followup | grounded | template
    temperature: float = 0.0
    seeds: tuple[str, ...] = ()   # seeded: the words a user turn starts with
    held_out: bool = False


# seed words per request kind: training sources ...
SEEDS = {
    "code": ("Write a Python function", "Write a JavaScript", "How do I write a", "Can you write a program",
             "Write a SQL query", "Write a bash script", "I have a Python list", "Implement a"),
    "math": ("Solve", "What is the sum of", "A store sells", "Calculate", "If a car", "How many",
             "Find the value of", "What is 15"),
    "translate": ("Translate", "How do you say", "What does this mean in English:", "Translate into Spanish"),
    "write": ("Write a short story", "Write an email", "Write a poem", "Write a product description",
              "Write a cover letter", "Write a speech"),
    "ask": ("Why do", "What are the", "How does", "Explain", "What is the difference", "Tell me about",
            "What happens when", "Is it true that"),
}
# ... and held-out ones, never trained on (the unseen benchmark's self-generated prompts come from these)
HELD_SEEDS = ("Could you", "I need help", "Please", "Write a function in C", "Compute", "What would happen if",
              "Translate the following sentence into", "Give me a")

TEXT_TASKS = (
    "Summarize this text in one sentence:\n\n{x}", "Rewrite the following so that a child can understand it:\n\n{x}",
    "List the key points of this text as bullet points:\n\n{x}", "Rewrite this in a more formal tone:\n\n{x}",
    "What is the main idea of this passage?\n\n{x}", "Extract every name, number and technical term from this "
    "text:\n\n{x}", "Write three questions that this text answers:\n\n{x}", "Shorten this to half its length:\n\n{x}",
    "{x}\n\nSummarize the text above.", "Fix the grammar and spelling of this text and keep its meaning:\n\n{x}",
)
CODE_TASKS = (
    "Add a docstring to this function:\n\n```python\n{x}\n```", "Explain what this code does:\n\n```python\n{x}\n```",
    "Add type hints to this Python function:\n\n{x}", "Rewrite this function so it is easier to read:\n\n{x}",
    "Write a unit test for this function:\n\n```python\n{x}\n```", "Rename the variables in this function to "
    "clearer names:\n\n{x}", "Is there a bug in this code?\n\n{x}", "Convert this Python function to JavaScript:\n\n{x}",
)


# --------------------------------------------------------------------------- chat template

def user_prefix(tokenizer: Any, history: Sequence[dict] = ()) -> str:
    """The chat template's text up to where a user's words start, after ``history`` (earlier turns)."""
    text = tokenizer.apply_chat_template(list(history) + [{"role": "user", "content": MARK}], tokenize=False)
    return text[:text.index(MARK)]


@torch.inference_mode()
def sample_user_turns(lm: Any, prefixes: Sequence[str], *, temperature: float, seed: int, max_new: int = 72,
                      top_p: float = 0.98) -> list[Optional[str]]:
    """One sampled user turn per chat-template prefix, in one left-padded batch (the text after the prefix,
    unstripped: a seeded prefix continues mid-sentence); None where the model did not end its turn within
    ``max_new`` tokens (an unfinished request is not a request)."""
    tok = lm.tokenizer
    side, tok.padding_side = tok.padding_side, "left"
    enc = tok(list(prefixes), return_tensors="pt", padding=True, add_special_tokens=False).to(lm.device)
    tok.padding_side = side
    torch.manual_seed(seed)
    eos = list(lm.eos_token_ids)
    out = lm.model.generate(**enc, do_sample=True, temperature=temperature, top_p=top_p, top_k=0,
                            max_new_tokens=max_new, eos_token_id=eos, pad_token_id=tok.pad_token_id)
    texts: list[Optional[str]] = []
    for row in out[:, enc["input_ids"].shape[1]:].tolist():
        end = next((i for i, t in enumerate(row) if t in eos), None)
        texts.append(None if end is None else tok.decode(row[:end], skip_special_tokens=True))
    return texts


# --------------------------------------------------------------------------- filters

def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def reject_reason(text: Optional[str], *, min_words: int = 3, max_words: int = 80) -> Optional[str]:
    """Why a sampled user turn is dropped (None: kept): unfinished, empty, too short or long, markup,
    a reply in disguise, mostly non-text, or degenerate (a repeated phrase, few distinct words)."""
    if text is None:
        return "unfinished"
    ws = words(text)
    if not ws:
        return "empty"
    if len(ws) < min_words:
        return "short"
    if len(ws) > max_words:
        return "long"
    low = text.lower()
    if any(b in low for b in BAD_WORDS):
        return "markup"
    if low.startswith(BAD_STARTS):
        return "not a request"
    if sum(ch.isalpha() or ch.isspace() for ch in text) < 0.6 * len(text):
        return "not text"
    grams = [tuple(ws[i:i + 3]) for i in range(len(ws) - 2)]
    if grams and max(grams.count(g) for g in set(grams)) >= 3:
        return "repeated"
    if len(ws) >= 12 and len(set(ws)) < 0.4 * len(ws):
        return "repeated"
    return None


def shingles(text: str, n: int = 3) -> frozenset:
    ws = words(text)
    if len(ws) < n:
        return frozenset([" ".join(ws)])
    return frozenset(" ".join(ws[i:i + n]) for i in range(len(ws) - n + 1))


class Deduper:
    """Near-duplicate filter: a text is new unless its word 3-grams overlap a kept text's by Jaccard
    ``threshold`` or more. An inverted index from 3-gram to kept texts keeps each check short."""

    def __init__(self, threshold: float = 0.5) -> None:
        self.threshold = threshold
        self.kept: list[frozenset] = []
        self.index: dict[str, list[int]] = {}

    def duplicate(self, text: str) -> bool:
        s = shingles(text)
        counts: dict[int, int] = {}
        for g in s:
            for j in self.index.get(g, ()):
                counts[j] = counts.get(j, 0) + 1
        return any(c / len(s | self.kept[j]) >= self.threshold for j, c in counts.items())

    def add(self, text: str) -> bool:
        """Keep ``text`` unless it near-duplicates a kept one; whether it was kept."""
        if self.duplicate(text):
            return False
        s = shingles(text)
        for g in s:
            self.index.setdefault(g, []).append(len(self.kept))
        self.kept.append(s)
        return True


def keep_new(texts: Iterable[Optional[str]], dedupe: Deduper) -> tuple[list[str], dict[str, int]]:
    """The texts that pass ``reject_reason`` and ``dedupe`` (in order), and a count of each drop reason."""
    kept, dropped = [], {}
    for text in texts:
        why = reject_reason(text) or (None if dedupe.add(text) else "duplicate")
        if why:
            dropped[why] = dropped.get(why, 0) + 1
        else:
            kept.append(text)
    return kept, dropped


def split_by_source(records: Sequence[dict], held_out: Iterable[str]) -> tuple[list[dict], list[dict]]:
    """(train, held): every record of a held-out source goes to ``held``, every other one to ``train``."""
    held_names = set(held_out)
    train = [r for r in records if r.get("source") not in held_names]
    held = [r for r in records if r.get("source") in held_names]
    return train, held


# --------------------------------------------------------------------------- grounded texts

def held_origin(name: str, share: int = 5) -> bool:
    """Whether a text origin (a stdlib module) is held out: one in ``share``, by a stable hash of its name."""
    return zlib.crc32(name.encode()) % share == 0


def stdlib_pieces(max_lines: int = 24, limit_files: int = 400) -> dict[str, dict[str, list[str]]]:
    """``{module: {"text": docstrings, "code": short functions}}`` from Python's own standard library."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out: dict[str, dict[str, list[str]]] = {}
    for path in sorted(root.glob("*.py"))[:limit_files]:
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
            lines = source.splitlines()
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        texts, code = [], []
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)):
                doc = ast.get_docstring(node)
                if doc and 20 <= len(doc.split()) <= 160 and ">>>" not in doc:
                    texts.append(" ".join(doc.split()))
            if isinstance(node, ast.FunctionDef) and 4 <= node.end_lineno - node.lineno + 1 <= max_lines:
                segment = textwrap.dedent("\n".join(lines[node.lineno - 1:node.end_lineno]))
                if segment.startswith("def ") and "\t" not in segment:
                    code.append(segment)
        if texts or code:
            out[path.stem] = {"text": texts, "code": code}
    return out


def grounded_prompts(pieces: Sequence[str], tasks: Sequence[str], count: int, rng: random.Random) -> list[str]:
    """``count`` prompts pairing a random piece with a random task instruction."""
    if not pieces:
        return []
    return [rng.choice(tasks).format(x=rng.choice(pieces).strip()) for _ in range(count)]
