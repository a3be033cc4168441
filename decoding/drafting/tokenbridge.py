"""Byte-exact bridges between two tokenizers, for drafting across vocabularies.

A token of a byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM) or of a
SentencePiece-style BPE that spells spaces as ``▁`` (Gemma, with byte fallback)
stands for a fixed byte string. :class:`Vocab` knows each token's bytes, and
encodes any byte string back into tokens, a character cut at either end
included (as single-byte tokens). Working in bytes, not text, keeps a character
split over several tokens (an emoji as four ``<0xNN>`` tokens, a CJK character
as two byte-level pieces) exact at every boundary.

:class:`Bridge` pairs the target's and the assistant's vocabularies: the
tokens whose bytes exist in both (the token-level intersection of Timor et al.
2025, arXiv 2502.05202) map one to one from assistant ids to target ids.

Tokenizers whose pieces do not spell their text (WordPiece ``##`` pieces, a
Metaspace tokenizer that adds a leading space to every text) are refused with a
``ValueError`` when the bridge is built, never discovered as silently wrong drafts.
"""

from __future__ import annotations

import re
import threading
import weakref
from typing import Any, Optional

import torch

_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_chars() -> dict[str, int]:
    """Byte-level BPE's printable stand-in for each byte: printable Latin-1 bytes stand for themselves,
    the others (controls, space, a few more) for the characters from U+0100 on, in byte order."""
    kept = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF]
    table = {chr(b): b for b in kept}
    moved = [b for b in range(256) if b not in table.values()]
    table.update({chr(256 + i): b for i, b in enumerate(moved)})
    return table


def is_continuation(byte: int) -> bool:
    """A UTF-8 continuation byte (10xxxxxx): the middle or end of a character."""
    return 0x80 <= byte < 0xC0


def whole_chars_end(data: bytes, start: int = 0) -> int:
    """The end of the last complete UTF-8 character of ``data[start:]`` (a character cut at the end is left out)."""
    i = len(data) - 1
    while i >= start and is_continuation(data[i]) and len(data) - i < 4:
        i -= 1
    if i < start:
        return start
    lead = data[i]
    need = 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    return len(data) if i + need <= len(data) else i


class Vocab:
    """One tokenizer seen as bytes: ``pieces[id]`` is the token's bytes (None for special tokens)."""

    def __init__(self, tokenizer: Any, name: str = "tokenizer") -> None:
        backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
        if not all(hasattr(backend, a) for a in ("encode", "id_to_token", "get_vocab_size",
                                                   "get_added_tokens_decoder")):
            raise ValueError(f"{name}: cross-tokenizer drafting needs a fast (tokenizers-backed) tokenizer, "
                             f"got {type(tokenizer).__name__}")
        self.backend, self.name = backend, name
        decoder = backend.decoder.__getstate__().decode("utf-8") if backend.decoder is not None else ""
        self.byte_level = '"ByteLevel"' in decoder
        fallback = '"ByteFallback"' in decoder
        added = backend.get_added_tokens_decoder()                       # id -> AddedToken
        self.special = frozenset(i for i, tok in added.items() if tok.special)
        size = backend.get_vocab_size(with_added_tokens=True)
        chars = _byte_level_chars() if self.byte_level else {}
        self.pieces: list[Optional[bytes]] = [None] * size
        self.fallback: set[int] = set()
        for i in range(size):
            piece = backend.id_to_token(i)
            if piece is None or i in self.special:
                continue
            m = _FALLBACK.fullmatch(piece) if fallback else None
            if m:
                self.pieces[i] = bytes([int(m.group(1), 16)])
                self.fallback.add(i)
            elif self.byte_level and i not in added and all(c in chars for c in piece):
                self.pieces[i] = bytes(chars[c] for c in piece)
            else:
                self.pieces[i] = (piece if self.byte_level else piece.replace("\u2581", " ")).encode("utf-8")
        self.byte_token: dict[int, int] = {}                            # byte -> a token that is exactly it
        for i, b in enumerate(self.pieces):
            if b is not None and len(b) == 1 and (b[0] not in self.byte_token or i in self.fallback):
                self.byte_token[b[0]] = i
        self.prefix = self._check()

    def spell(self, ids: list[int]) -> bytes:
        return b"".join(self.pieces[i] or b"" if 0 <= i < len(self.pieces) else b"" for i in ids)

    def _check(self) -> list[int]:
        """Encode a text made of the vocabulary's own pieces: it must spell back byte for byte and decode to
        itself. Returns the special tokens the tokenizer puts before a text (a BOS)."""
        word = re.compile(rb"[A-Za-z]+")
        probe_ids: list[int] = []
        spaced: list[int] = []
        for i, b in enumerate(self.pieces):
            if b and len(probe_ids) < 3 and word.fullmatch(b):
                probe_ids.append(i)
            elif b and len(spaced) < 2 and b[:1] == b" " and word.fullmatch(b[1:]):
                spaced.append(i)
            if len(probe_ids) == 3 and len(spaced) == 2:
                break
        probe = self.spell(probe_ids + probe_ids[:1] + spaced).decode("utf-8")    # a word glued to others, too
        if not probe:
            raise ValueError(f"{self.name}: no plain-letter tokens to check the tokenizer with")
        plain = self.backend.encode(probe, add_special_tokens=False).ids
        if self.spell(plain) != probe.encode("utf-8") or self.backend.decode(plain, skip_special_tokens=False) != probe:
            raise ValueError(f"{self.name}: its tokens do not spell their text byte for byte (encoding {probe!r} "
                             f"gives {self.spell(plain)!r}); cross-tokenizer drafting supports byte-level BPE and "
                             f"SentencePiece-style tokenizers without an added leading space")
        full = self.backend.encode(probe, add_special_tokens=True).ids
        n = next((i for i in range(len(full)) if full[i:i + len(plain)] == plain), 0)
        return [t for t in full[:n] if t in self.special]

    def _bytes_as_tokens(self, data: bytes, pos: int, stop: int, ids: list[int], ends: list[int]) -> int:
        while pos < stop and data[pos] in self.byte_token:
            ids.append(self.byte_token[data[pos]])
            pos += 1
            ends.append(pos)
        return pos

    def encode(self, data: bytes, tail: bool = False) -> tuple[list[int], list[int]]:
        """Tokens spelling the longest prefix of ``data`` they can, and the byte offset where each ends.

        A character begun before ``data`` (leading continuation bytes) becomes single-byte tokens; a
        character cut at the end is left out, or spelled as single-byte tokens when ``tail``. The
        tokens stop before anything that does not spell back exactly (an unknown character).
        """
        ids: list[int] = []
        ends: list[int] = []
        # 1. the rest of a character begun before data
        lead = 0
        while lead < len(data) and is_continuation(data[lead]):
            lead += 1
        pos = self._bytes_as_tokens(data, 0, lead, ids, ends)
        if pos < lead:
            return ids, ends
        # 2. whole characters through the tokenizer
        stop = whole_chars_end(data, pos)
        try:
            text = data[pos:stop].decode("utf-8")
        except UnicodeDecodeError as exc:      # an invalid byte: stop before it
            stop = pos + exc.start
            text = data[pos:stop].decode("utf-8")
        for t in self.backend.encode(text, add_special_tokens=False).ids:
            piece = self.pieces[t] if t < len(self.pieces) else None
            if not piece or data[pos:pos + len(piece)] != piece:
                return ids, ends
            pos += len(piece)
            ids.append(t)
            ends.append(pos)
        # 3. a character cut at the end
        if tail and pos == stop:
            self._bytes_as_tokens(data, pos, len(data), ids, ends)
        return ids, ends


class Bridge:
    """The target's and the assistant's vocabularies, and the tokens they share.

    ``to_target[a]``: the target id spelling the same bytes as assistant token ``a``, -1 if none
    (a target byte-fallback token is used only when no ordinary piece spells the byte).
    """

    def __init__(self, target_tokenizer: Any, assistant_tokenizer: Any, target_vocab_size: int) -> None:
        self.target = Vocab(target_tokenizer, "target tokenizer")
        self.assistant = Vocab(assistant_tokenizer, "assistant tokenizer")
        self.target_vocab_size = int(target_vocab_size)
        by_bytes: dict[bytes, int] = {}
        order = sorted(range(len(self.target.pieces)), key=lambda i: i not in self.target.fallback)
        for i in order:                                          # fallback tokens first, ordinary pieces win
            b = self.target.pieces[i]
            if b and i < self.target_vocab_size:
                by_bytes[b] = i
        mapped = [by_bytes.get(b, -1) if b else -1 for b in self.assistant.pieces]
        self.to_target = torch.tensor(mapped, dtype=torch.long)                        # [Va]
        self.shared = torch.nonzero(self.to_target >= 0).flatten()                     # assistant ids in both
        if len(self.shared) == 0:
            raise ValueError("the target's and the assistant's vocabularies share no token")

    def target_q(self, q_assistant: torch.Tensor, size: int) -> torch.Tensor:
        """An assistant distribution ``[Va]`` over shared tokens as a distribution over target ids ``[size]``."""
        idx = self.shared.to(q_assistant.device)
        out = torch.zeros(size, dtype=q_assistant.dtype, device=q_assistant.device)
        return out.index_add_(0, self.to_target.to(q_assistant.device)[idx], q_assistant[idx])


_LOCK = threading.Lock()


def bridge_for(target: Any, assistant: Any) -> Bridge:
    """The bridge from ``assistant``'s tokenizer to ``target``'s (loaded models), built once per pair (a few
    hundred ms for a 262k vocabulary). Kept on the target, one per assistant, and dropped when the assistant
    is freed, so evicting either model frees the bridge."""
    with _LOCK:
        bridges = target.state.bridges
        bridge = bridges.get(assistant.uid)
        if bridge is None:
            bridge = bridges[assistant.uid] = Bridge(target.tokenizer, assistant.tokenizer, target.vocab_size)
            weakref.finalize(assistant, bridges.pop, assistant.uid, None)
        return bridge
