"""The trace schema: every event a decoding strategy can record.

Events are frozen dataclasses of ints, floats, strings, bools and tuples, so they
are cheap to build, JSON-serializable and replayable without torch. Every event
carries ``step``: the number of *target* forward passes completed when it
happened (0 = before/during prefill). Replays use it as their clock, so that a
speculative run at step 5 can be shown next to greedy at step 5.

Token sources (``TokenCommitted.source``) are a closed vocabulary, listed in
``SOURCES``, that the visualizations map onto one colour legend.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Optional

# How a committed token was produced.
SOURCES = (
    "greedy",      # one target forward, argmax
    "sample",      # one target forward, sampled
    "beam",        # final beam-search hypothesis
    "accepted",    # a drafted token the target verified
    "correction",  # the target's replacement for a rejected draft token
    "bonus",       # the target's extra token after a fully accepted draft
    "jacobi",      # fixed by a Jacobi iteration
    "ngram",       # from an accepted lookahead n-gram
    "suffix",      # a suffix-decoding draft the target verified
)


@dataclass(frozen=True)
class ForwardPass:
    """One forward pass of a model: which model, how many positions, how long."""
    step: int
    model: str          # "target" or "draft"
    positions: int      # query positions fed in this pass (batch x length)
    ms: float
    kind: str = "decode"  # "prefill" | "decode" | "verify" | "draft" | "jacobi" | "lookahead"


@dataclass(frozen=True)
class TokenCommitted:
    """A token became part of the output. ``position`` counts new tokens from 0."""
    step: int
    position: int
    token: int
    source: str
    prob: Optional[float] = None  # target probability of the token, when known


@dataclass(frozen=True)
class DraftProposed:
    """A drafter proposed ``tokens`` (with draft probabilities ``q`` when it has them)."""
    step: int
    position: int               # output position of the first drafted token
    tokens: tuple[int, ...]
    q: tuple[float, ...] = ()   # q_draft(token) for each drafted token; empty if deterministic
    source: str = "assistant"   # "assistant" | "prompt_lookup" | "prophet" | "ngram_pool" | "self"
    # a self-draft (source "self"): the target's own layers drafted. ``layers``: the target's decoder layers (0:
    # not a self-draft); ``exit_layer``: the draft ran layers 0 .. exit_layer - 1, minus ``skipped``, then the
    # final norm and the LM head (early exit: ``skipped`` empty; a skipped set: ``exit_layer`` = ``layers``)
    layers: int = 0
    exit_layer: int = 0
    skipped: tuple[int, ...] = ()


@dataclass(frozen=True)
class DraftTree:
    """A token tree a drafter proposed, verified in one target forward through a tree attention mask.

    Nodes are listed parents first. ``parents[i]`` is the parent node of node ``i``,
    ``-1`` for the root (the newest committed token, fed first in the verify
    forward). A node at depth ``d`` (1 for the root's children) proposes the token
    at output position ``position + d - 1``. ``q`` holds q_draft of each node's
    token (1.0 for a deterministic drafter). ``accepted`` lists the nodes of the
    accepted path from the root down; ``next_token`` is the target's correction
    or bonus after it. ``mask_size`` is the number of query positions of the
    verify forward (root + nodes).
    """
    step: int
    position: int
    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    q: tuple[float, ...] = ()
    accepted: tuple[int, ...] = ()
    next_token: int = -1
    mask_size: int = 0
    source: str = "assistant"


@dataclass(frozen=True)
class TokenVerified:
    """The target checked one drafted token.

    ``p_target``/``q_draft`` are the target's and the drafter's probabilities of
    the drafted token; ``u`` is the uniform draw compared with p/q when sampling
    (None under greedy verification).
    """
    step: int
    position: int
    token: int
    accepted: bool
    p_target: float
    q_draft: float
    u: Optional[float] = None


@dataclass(frozen=True)
class CorrectionToken:
    """The token the target adds after verification: a correction or a bonus."""
    step: int
    position: int
    token: int
    kind: str          # "correction" | "bonus"
    p_target: float


@dataclass(frozen=True)
class Distribution:
    """Top of the target and draft distributions at one output position (the inspector)."""
    step: int
    position: int
    tokens: tuple[int, ...]
    p_target: tuple[float, ...]
    q_draft: tuple[float, ...] = ()
    residual: tuple[float, ...] = ()  # normalized max(0, p - q) when a rejection resampled


@dataclass(frozen=True)
class StepTiming:
    """Where one propose-verify step spent its time."""
    step: int
    draft_ms: float
    verify_ms: float
    overhead_ms: float
    drafted: int
    accepted: int


@dataclass(frozen=True)
class JacobiIteration:
    """One Jacobi refinement of a block: the whole guess and its converged prefix."""
    step: int
    block: int
    iteration: int
    start: int                     # output position of the block's first token
    guess: tuple[int, ...]
    converged: int                 # length of the prefix that is now fixed
    probs: tuple[float, ...] = ()  # target probability of each guessed token
    # leading guess tokens this iteration decided for good (the block stopped, or the sliding
    # window's unchanged prefix); 0 while the block iterates on; -1 in traces before version 2
    committed: int = -1


@dataclass(frozen=True)
class LookaheadStep:
    """One fused lookahead forward: window, pool, candidates and what was accepted."""
    step: int
    position: int                            # output position of the first committed token
    window: tuple[tuple[int, ...], ...]      # (N-1) levels x W positions
    pool_size: int
    candidates: tuple[tuple[int, ...], ...]  # verified n-grams
    accepted_candidate: int                  # index into candidates, -1 if none matched
    accepted: tuple[int, ...]                # tokens committed this step
    pool_hits: int = 0                       # candidates found for the key token


@dataclass(frozen=True)
class WidthChosen:
    """The width a run uses (``runtime/widths.py``): lookahead's ``window`` or Jacobi's ``block_size``.

    ``source``: ``user`` (the value given), ``curve`` (auto: the most expected tokens per ms of the model's
    measured forward-cost curve) or ``fallback`` (auto without a curve). With ``curve``, the model's
    ``tokens_per_forward`` at that width, its forward's ``cost_ratio`` c(T) / c(1) and their quotient,
    the ``predicted_speedup`` over greedy; 0 otherwise.
    """
    step: int
    name: str                       # "window" | "block_size"
    value: int
    source: str = "user"            # "user" | "curve" | "fallback"
    tokens_per_forward: float = 0.0
    cost_ratio: float = 0.0
    predicted_speedup: float = 0.0


@dataclass(frozen=True)
class LayerSearch:
    """One candidate set of skipped layers a self-speculative run measured before choosing (``skip_layers=auto``).

    ``agreement``: the share of the prompt's last ``positions`` positions where the draft (the target without
    ``skipped``) predicts the full target's next token; ``cost``: the layers it runs over all of them;
    ``score``: the speed-up over greedy that acceptance and cost predict for chains of ``draft_tokens``
    (Leviathan et al.); ``chosen``: the set the run drafts with (the best score).
    """
    step: int
    skipped: tuple[int, ...]
    layers: int
    agreement: float
    positions: int
    cost: float
    score: float
    chosen: bool = False


@dataclass(frozen=True)
class BeamStep:
    """Running beams after one beam-search step."""
    step: int
    tokens: tuple[tuple[int, ...], ...]  # each running beam's generated tokens
    scores: tuple[float, ...]            # cumulative log-probabilities
    finished: int                        # hypotheses finished so far


@dataclass(frozen=True)
class DraftSource:
    """Where a model-free drafter copied a draft from (the draft view; ``drafting.suffix``).

    ``text``: the earlier text holding the occurrence the draft's first path was copied from,
    "prompt", "output" or "history" (an earlier output; ``item`` says which, 0 = the oldest kept,
    -1 otherwise). ``tokens``: a window of that text starting at its index ``start``: a few tokens
    before the match, the match (the earlier occurrence of the context's last ``match_len`` tokens,
    from index ``match_at`` of ``tokens``), then the ``copied`` tokens that became the draft's first
    path. ``occurrences``: how often the matched tokens occurred there before; ``nodes``: the draft's
    size (more than ``copied`` for a tree); ``score``: its summed empirical token probabilities.
    """
    step: int
    position: int                   # output position of the first drafted token
    text: str = "prompt"            # "prompt" | "output" | "history"
    tokens: tuple[int, ...] = ()
    match_at: int = 0
    match_len: int = 0
    copied: int = 0
    start: int = 0
    item: int = -1
    occurrences: int = 1
    nodes: int = 0
    score: float = 0.0
    source: str = "suffix"          # the drafter: "suffix" | "prompt_lookup"


@dataclass(frozen=True)
class DraftTranslated:
    """A draft from an assistant with another tokenizer: its own tokens and the target tokens they became.

    Both tokenizations spell one byte string, ``text`` (UTF-8 bytes; a draft may
    end inside a character). ``assistant_ends[i]`` / ``target_ends[j]`` are the
    byte offsets in ``text`` where assistant token ``i`` / target token ``j``
    ends (strictly increasing); the target tokens spell a prefix of ``text``
    (the rest: a character cut at the end, tokens past the draft length). The
    target tokens are what the target verified (``DraftProposed`` of the same
    step). ``intersection``: sampling over the tokens both vocabularies share,
    one target token per assistant token (False: greedy, re-encoded through text).
    """
    step: int
    position: int                            # output position of the first target token
    assistant_tokens: tuple[int, ...]
    assistant_ends: tuple[int, ...]
    target_tokens: tuple[int, ...]
    target_ends: tuple[int, ...]
    text: tuple[int, ...] = ()               # the draft's bytes (0..255)
    assistant_q: tuple[float, ...] = ()      # the assistant's probability of each drafted token
    intersection: bool = False


@dataclass(frozen=True)
class SamplingFilter:
    """One sampled position's distribution before and after the sampling filters (the sampling view).

    ``tokens``: the most probable tokens (and the sampled one). Per token: ``p_raw``, the
    softmax of the target's (processed) logits; ``p_temperature``, after dividing them by
    ``temperature``; ``p_final``, after top-k and top-p, renormalized: what ``chosen`` was
    drawn from. ``kept``: how many tokens of the whole vocabulary top-k and top-p left.
    Recorded only when tracing.
    """
    step: int
    position: int
    tokens: tuple[int, ...]
    p_raw: tuple[float, ...] = ()
    p_temperature: tuple[float, ...] = ()
    p_final: tuple[float, ...] = ()
    chosen: int = -1
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    kept: int = 0


@dataclass(frozen=True)
class BatchStep:
    """One verify forward of a batch whose rows accept their own number of drafted tokens (per row, in row order).

    ``accepted``: drafted tokens the target accepted in the row; ``committed``: tokens the row committed (the
    accepted ones plus the target's own, cut at EOS or the length limit; 0 while the row waits); ``fed``: the
    positions the row fed (its newest token and its draft); ``width``: the forward's width, the widest row's
    feed, which every row pays for; ``waiting``: the rows that had finished and only waited for the slowest.
    """
    step: int
    accepted: tuple[int, ...]
    committed: tuple[int, ...]
    fed: tuple[int, ...]
    width: int
    waiting: tuple[int, ...] = ()


EVENT_TYPES: dict[str, type] = {
    cls.__name__: cls
    for cls in (ForwardPass, TokenCommitted, DraftProposed, DraftTree, TokenVerified, CorrectionToken,
                Distribution, StepTiming, JacobiIteration, LookaheadStep, WidthChosen, BeamStep, DraftSource,
                DraftTranslated, SamplingFilter, LayerSearch, BatchStep)
}


def event_to_dict(event: Any) -> dict:
    """A plain dict with a ``type`` tag; tuples become lists."""
    data = {"type": type(event).__name__}
    for f in dataclasses.fields(event):
        data[f.name] = getattr(event, f.name)
    return data


def _to_tuple(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_to_tuple(v) for v in value)
    return value


def typed_event(data: Any, table: dict, fields: Callable[[Any], Any],
                refuse: Callable[[str, Any], Exception]) -> tuple[str, Any]:
    """What every reader of an event dict checks first: ``data`` is a dict (else ``refuse("object", its type's
    name)``), its ``type`` names an entry of ``table`` (else ``refuse("type", the name)``) and it holds no field
    but ``type`` and ``fields(entry)`` (else ``refuse("fields", (name, sorted extras))``). Returns the name and
    the entry; ``refuse`` returns the exception to raise."""
    if not isinstance(data, dict):
        raise refuse("object", type(data).__name__)
    name = data.get("type")
    entry = table.get(name) if isinstance(name, str) else None
    if entry is None:
        raise refuse("type", name)
    extra = set(data) - set(fields(entry)) - {"type"}
    if extra:
        raise refuse("fields", (name, sorted(extra)))
    return name, entry


def event_from_dict(data: dict) -> Any:
    """Rebuild an event from :func:`event_to_dict` output (or its JSON round trip).

    Raises ``ValueError`` for an unknown type or missing/unknown fields.
    """
    def refuse(kind: str, detail: Any) -> ValueError:
        return ValueError({"object": lambda: f"event must be an object, got {detail}",
                           "type": lambda: f"unknown event type {detail!r}",
                           "fields": lambda: f"{detail[0]}: unknown field(s) {detail[1]}"}[kind]())

    name, cls = typed_event(data, EVENT_TYPES, lambda c: [f.name for f in dataclasses.fields(c)], refuse)
    kwargs = {k: _to_tuple(v) for k, v in data.items() if k != "type"}
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ValueError(f"{name}: {exc}") from None
