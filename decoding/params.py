"""Strategy parameters: one frozen dataclass per strategy, validated when built.

A bad value raises ``ValueError`` naming the parameter and its allowed range.
``parse_params`` maps plain dicts (YAML presets, ``--set KEY=VALUE``, the UI)
onto these classes by field name, coercing strings.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Any, Mapping

MAX_NEW_TOKENS_CAP = 1024
MAX_DRAFT = 32       # deepest draft (tokens per chain)


MAX_TREE_NODES = 64  # most nodes one tree may hold
BUDGETS = ("fixed", "measured")   # the prophet's tree budget: tree_nodes, or from the measured forward costs
LOOKUP_SOURCES = ("suffix", "prompt")   # the prophet's copy branch: suffix trees or n-gram prompt lookup
MAX_BEAMS = 16
# Smaller positive values would reach the float32 kernels as 0 (top_p: every token dropped;
# temperature: logits divided by 0) and fail inside the run; they mean "argmax" anyway.
MIN_TOP_P = 1e-6
MIN_TEMPERATURE = 1e-4
MAX_MAGNITUDE = 2**53         # integers beyond this are refused (exact as floats up to here)


def check_number(name: str, value: Any, lo: float | None = None, hi: float | None = None, *,
                 integer: bool = False, lo_open: bool = False) -> None:
    """Raise ``ValueError`` unless ``value`` is a finite number in the range."""
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            integer and isinstance(value, float) and not value.is_integer()):
        raise ValueError(f"{name} must be {kind}, got {_shown(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    # JSON integers have no size limit, and a float() of a very large one raises OverflowError
    too_large = isinstance(value, int) and abs(value) > MAX_MAGNITUDE
    low_bad = lo is not None and (value <= lo if lo_open else value < lo)
    high_bad = hi is not None and value > hi
    if too_large or low_bad or high_bad:
        left = "(" if lo_open else "["
        lo_s = "-inf" if lo is None else f"{lo:g}"
        hi_s = "inf" if hi is None else f"{hi:g}"
        raise ValueError(f"{name} must be in {left}{lo_s}, {hi_s}], got {_shown(value)}")


def _shown(value: Any) -> str:
    """A value for an error message, cut short (a JSON integer may have thousands of digits)."""
    if isinstance(value, int) and abs(value) > MAX_MAGNITUDE:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")


FAST_HELP = ("fast: a static KV cache with explicit positions and masks; on a GPU every forward "
             "shape is captured once as a CUDA graph and replayed (decoding/runtime/fastpath.py). Same tokens.")


@dataclass(frozen=True)
class GreedyParams:
    """Plain greedy decoding: one target forward per token, argmax.

    ``fast``: a static KV cache; on a GPU each forward is replayed as a CUDA graph
    (decoding/runtime/fastpath.py). Same tokens either way.
    """
    fast: bool = False

    def __post_init__(self) -> None:
        check_bool("fast", self.fast)


@dataclass(frozen=True)
class SamplingParams:
    """Temperature, top-k and top-p, applied in that order (as transformers does).

    temperature 0 means argmax; top_k 0 and top_p 1 switch those filters off.
    """
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    fast: bool = False              # static KV cache + CUDA graphs (decoding/runtime/fastpath.py)

    def __post_init__(self) -> None:
        check_number("temperature", self.temperature, 0.0, 100.0)
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(f"temperature must be 0 (argmax) or at least {MIN_TEMPERATURE:g}, "
                             f"got {self.temperature!r}")
        check_number("top_k", self.top_k, 0, None, integer=True)
        check_number("top_p", self.top_p, 0.0, 1.0, lo_open=True)
        if self.top_p < MIN_TOP_P:
            raise ValueError(f"top_p must be in (0, 1] and at least {MIN_TOP_P:g}, got {self.top_p!r}")
        check_bool("fast", self.fast)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class SampleParams(SamplingParams):
    """Ancestral sampling with a seeded generator."""


@dataclass(frozen=True)
class BeamParams:
    """Beam search with transformers' semantics (length-normalised finished hypotheses)."""
    num_beams: int = 4
    length_penalty: float = 1.0
    early_stopping: bool = False

    def __post_init__(self) -> None:
        check_number("num_beams", self.num_beams, 1, MAX_BEAMS, integer=True)
        check_number("length_penalty", self.length_penalty, -10.0, 10.0)
        if not isinstance(self.early_stopping, bool):
            raise ValueError(f"early_stopping must be true or false, got {self.early_stopping!r}")


def _coerce(name: str, value: Any, annotation: Any) -> Any:
    """Turn strings (CLI / form input) into the field's type; leave the range check to the class."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union:  # Optional[...]
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
            return None
        annotation = args[0]
    if annotation is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{name} must be true or false, got {value!r}")
    if annotation in (int, float):
        if isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                raise ValueError(f"{name} must be a number, got {value!r}") from None
        if isinstance(value, float) and annotation is int and math.isfinite(value) and value.is_integer():
            return int(value)
        if annotation is float and isinstance(value, int) and not isinstance(value, bool) \
                and abs(value) <= MAX_MAGNITUDE:   # a larger one stays an int: check_number names it
            return float(value)
        return value
    if annotation is str:
        if not isinstance(value, str):
            raise ValueError(f"{name} must be text, got {value!r}")
        return value.strip()
    return value


def parse_params(cls: type, values: Mapping[str, Any] | None) -> Any:
    """Build ``cls`` from a mapping, rejecting unknown names with the list of known ones."""
    values = dict(values or {})
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(names))
    if unknown:
        allowed = ", ".join(names) if names else "none"
        raise ValueError(f"unknown parameter(s) {', '.join(unknown)} for {cls.__name__}; "
                         f"allowed: {allowed}")
    kwargs = {k: _coerce(k, v, hints[k]) for k, v in values.items()}
    return cls(**kwargs)


def params_to_dict(params: Any) -> dict:
    return dataclasses.asdict(params)


def check_max_new_tokens(value: Any, cap: int = MAX_NEW_TOKENS_CAP) -> int:
    check_number("max_new_tokens", value, 1, cap, integer=True)
    return int(value)


# --------------------------------------------------------------------------- drafting strategies

ACCEPTANCES = ("exact", "lenient", "typical")   # how a drafted token is accepted (decoding/relaxed.py)
MAX_LENIENCE = 100.0


@dataclass(frozen=True)
class AcceptanceParams:
    """What every strategy that verifies drafts shares: how a drafted token is accepted.

    ``acceptance``: ``exact`` (the default: greedy's tokens at temperature 0, the target's distribution
    above); ``lenient`` (lucidrains' ``lenience``) and ``typical`` (Medusa's typical acceptance, ``ε`` =
    ``posterior_threshold``, ``δ`` = ``posterior_alpha``) accept drafted tokens the exact rule would
    reject: more tokens per forward, other tokens than greedy's. A run with either is marked lossy.
    The rules, at temperature 0 and above, are in ``decoding/relaxed.py``.
    ``lenience`` (lenient only, in [1, 100]): at temperature 0 a drafted token is accepted when
    ``lenience * p(x) >= max p`` (its logit within ``ln(lenience)`` of the top one); above, when
    ``u < min(1, lenience * p(x) / q(x))``. 1 is the exact rule.
    ``posterior_threshold`` ε in (0, 1) and ``posterior_alpha`` δ in (0, 1] (typical only): accepted when
    ``p(x) > min(ε, δ * exp(-H(p)))``; Medusa's defaults (0.09 and its square root, 0.3).
    """
    acceptance: str = "exact"
    lenience: float = 2.0
    posterior_threshold: float = 0.09
    posterior_alpha: float = 0.3
    CHOICES = {"acceptance": ACCEPTANCES}

    def check_acceptance(self) -> None:
        if not isinstance(self.acceptance, str) or self.acceptance not in ACCEPTANCES:
            raise ValueError(f"acceptance must be one of {', '.join(ACCEPTANCES)} (exact: lossless; lenient: "
                             f"lucidrains' lenience; typical: Medusa's typical acceptance), "
                             f"got {_shown(self.acceptance)}")
        check_number("lenience", self.lenience, 1.0, MAX_LENIENCE)
        epsilon = "posterior_threshold (Medusa's epsilon) must be in (0, 1)"
        try:
            check_number("posterior_threshold", self.posterior_threshold, 0.0, 1.0, lo_open=True)
        except ValueError as exc:       # its range is open at both ends: say so
            raise ValueError(f"{epsilon}, got {_shown(self.posterior_threshold)}" if "must be in" in str(exc)
                             else str(exc)) from None
        if self.posterior_threshold >= 1.0:
            raise ValueError(f"{epsilon}, got {_shown(self.posterior_threshold)}")
        check_number("posterior_alpha", self.posterior_alpha, 0.0, 1.0, lo_open=True)

    @property
    def lossy(self) -> bool:
        """Whether the run may commit tokens the exact rule would not (any acceptance but ``exact``)."""
        return self.acceptance != "exact"


@dataclass(frozen=True)
class DraftedParams(AcceptanceParams, SamplingParams):
    """Sampling's parameters, then the acceptance rule's (``AcceptanceParams``): every strategy that verifies
    drafts on the shared stages takes both."""

    def __post_init__(self) -> None:
        SamplingParams.__post_init__(self)
        self.check_acceptance()


# (tree_topk, tree_nodes) when a parameter is 0. CPU: `make bench-prophet-sweep` (BENCHMARKS.md). On the
# AVX2 EPYC with the first head, top-k 4 with 8, 12 or 16 nodes were within noise (geomean 1.63, 1.63,
# 1.59x greedy; 24-32 nodes 1.33-1.46x: the wider verify forward costs more than its extra tokens). With
# the H100-trained head, 8 nodes keep almost every accepted token (3.53 against 3.55 per forward on the
# sweep's 8 prompts) and the forward is narrower, which pays where width costs most: on an Intel Xeon (a
# 13-position forward 1.3-1.8x a one-position one, 1.15-1.48x on the EPYCs) 8 nodes ran 1.03x faster
# than 12 (geomean) on all 16 held-out prompts in one run. GPU: EAGLE-2's published setting (top-k 10,
# 60 nodes): a wide verify forward costs about one narrow one there.
TREE_DEFAULTS = {"cpu": (4, 8), "cuda": (10, 60)}
# With the prophet's measured budget (``budget="measured"``, drafting/budget.py) ``tree_nodes`` is the most
# nodes the rule may keep; 0 means these. The rule trims where the measured forward costs say so.
MEASURED_NODES = {"cpu": 32, "cuda": 64}


@dataclass(frozen=True)
class SpeculativeParams(DraftedParams):
    """Assistant-model drafting. temperature 0 = greedy verification (lossless).

    ``draft_tokens``: draft length (a chain) or depth (a tree); ``adaptive``:
    grow it after a fully accepted draft, shrink it after a rejection;
    ``confidence_threshold``: a chain stops when the drafter's top probability is
    below it, a tree stops growing when its best path's probability is.
    ``tree``: draft an EAGLE-2 dynamic tree, expanding the ``tree_topk`` most
    probable nodes per depth (``tree_topk`` children each) and keeping the
    ``tree_nodes`` most probable nodes; 0 picks the device's default
    (``TREE_DEFAULTS``: a CPU verifies few nodes per forward
    cheaply, a GPU many).
    ``budget`` (a tree drafted by the prophet head: the ``prophet`` strategy, or
    ``speculative`` on a pair with no assistant): ``fixed`` verifies the
    ``tree_nodes`` most probable nodes; ``measured`` grows the tree up to
    ``tree_nodes`` (0: ``MEASURED_NODES``) and verifies the most
    probable prefix that maximizes expected tokens per ms of the target's verify
    forward, timed on this machine (``drafting/budget.py``,
    ``runtime/forward_cost.py``). An assistant model's drafts refuse ``measured``.
    """
    temperature: float = 0.0
    draft_tokens: int = 4
    adaptive: bool = True
    confidence_threshold: float = 0.4
    tree: bool = False
    tree_topk: int = 0
    tree_nodes: int = 0
    budget: str = "fixed"
    CHOICES = {**DraftedParams.CHOICES, "budget": BUDGETS}

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("draft_tokens", self.draft_tokens, 1, MAX_DRAFT, integer=True)
        check_bool("adaptive", self.adaptive)
        check_number("confidence_threshold", self.confidence_threshold, 0.0, 1.0)
        check_bool("tree", self.tree)
        check_number("tree_topk", self.tree_topk, 0, 16, integer=True)
        check_number("tree_nodes", self.tree_nodes, 0, MAX_TREE_NODES, integer=True)
        if not isinstance(self.budget, str) or self.budget not in BUDGETS:
            raise ValueError(f"budget must be one of {', '.join(BUDGETS)} (fixed: the tree_nodes most probable "
                             f"nodes; measured: as many as pay for their measured verify cost), "
                             f"got {_shown(self.budget)}")
        if self.budget == "measured" and not self.tree:
            raise ValueError("budget=measured chooses how many tree nodes to verify; it needs tree=true "
                             "(or budget=fixed for a chain)")

    def tree_shape(self, device: Any) -> tuple[int, int]:
        """``(topk, nodes)`` of its trees on ``device``: the parameters, or the device's defaults where they are
        0 (``TREE_DEFAULTS``; under a measured budget, ``nodes`` is the most it may keep: ``MEASURED_NODES``)."""
        kind = getattr(device, "type", str(device))
        topk, nodes = TREE_DEFAULTS.get(kind, TREE_DEFAULTS["cpu"])
        if self.budget == "measured":
            nodes = MEASURED_NODES.get(kind, MEASURED_NODES["cpu"])
        return self.tree_topk or topk, self.tree_nodes or nodes


@dataclass(frozen=True)
class ProphetParams(SpeculativeParams):
    """Prophet-head drafting; temperature 0 = greedy verification (lossless).

    The same knobs as ``speculative``, with defaults chosen for the head: a tree
    by default (``tree=false`` drafts a chain, for comparison), and a lower
    confidence threshold, because a head position costs a few percent of a target
    forward (BENCHMARKS.md has the sweeps behind these defaults). ``lookup``
    merges a copied continuation into the tree as one more branch (greedy only,
    ``drafting/merged.py``): replies often restate the prompt just where the
    head, with little answer to attend to yet, is weakest. A chain gets the same
    branch beside it where the target verifies trees (a two-path tree then; the
    chain alone with ``lookup=false``): a chain is what a steep CPU curve chooses,
    and without the branch it copied nothing (1.19 tokens a forward on a summary
    of a given text, against 4.39 for the 2-node tree with it).
    ``lookup_source``: ``suffix`` (the default) copies with suffix decoding over
    this generation's prompt and output only (no history of other runs, no edit
    following), which drafts only where a continuation occurred and as far as the
    match supports;
    ``prompt`` with n-gram prompt lookup. ``lookup_tokens``: the longest copy the
    branch may propose (16: a copied run of code or text can land in one step,
    past the head's ``draft_tokens`` depth; BENCHMARKS.md, "The prophet's copy
    branch").
    ``budget`` (``SpeculativeParams``): ``measured`` is not the default: on the
    AMD EPYC it raised tokens per forward but not speed (BENCHMARKS.md).
    """
    draft_tokens: int = 6
    adaptive: bool = False
    confidence_threshold: float = 0.1
    tree: bool = True
    lookup: bool = True
    lookup_source: str = "suffix"
    lookup_tokens: int = 16
    CHOICES = {**SpeculativeParams.CHOICES, "lookup_source": LOOKUP_SOURCES}

    def __post_init__(self) -> None:
        super().__post_init__()
        check_bool("lookup", self.lookup)
        if not isinstance(self.lookup_source, str) or self.lookup_source not in LOOKUP_SOURCES:
            raise ValueError(f"lookup_source must be one of {', '.join(LOOKUP_SOURCES)} (suffix: suffix decoding "
                             f"over this prompt and output; prompt: n-gram prompt lookup), "
                             f"got {_shown(self.lookup_source)}")
        check_number("lookup_tokens", self.lookup_tokens, 1, MAX_DRAFT, integer=True)


MAX_LAYERS = 1024        # the most decoder layers a self-draft's layer numbers may name (checked against the model)
SKIP_AUTO = "auto"


def parse_layer_list(name: str, text: str) -> tuple[int, ...]:
    """``"3,5,7"`` -> ``(3, 5, 7)``: distinct layer numbers in [1, MAX_LAYERS - 1], ascending; ValueError naming
    ``name`` otherwise."""
    if not isinstance(text, str) or len(text) > 4 * MAX_LAYERS:
        raise ValueError(f"{name} must be text: comma-separated layer numbers or {SKIP_AUTO!r}")
    items = [part.strip() for part in text.split(",") if part.strip()]
    layers = []
    for item in items:
        if not item.isdigit() or not 1 <= int(item) < MAX_LAYERS:
            raise ValueError(f"{name} must list layer numbers in [1, {MAX_LAYERS - 1}] (layer 0 always runs) "
                             f"separated by commas, or be {SKIP_AUTO!r}; got {_shown(item)}")
        layers.append(int(item))
    if len(set(layers)) != len(layers):
        raise ValueError(f"{name} lists a layer twice: {_shown(text)}")
    return tuple(sorted(layers))


@dataclass(frozen=True)
class SelfSpeculativeParams(AcceptanceParams):
    """Self-speculative decoding: the target drafts with some of its own layers; temperature 0 = greedy
    verification (lossless), above it exact speculative sampling.

    ``exit_layer``: the draft runs the target's layers 0 .. exit_layer - 1, then its final norm and LM head
    (LayerSkip's early exit); 0 (the default) is half the layers, rounded down. ``skip_layers``: draft with
    every layer except these instead (SWIFT, Draft & Verify), comma-separated numbers (layer 0 always runs),
    or ``auto``: measure how often a few candidate sets agree with the full model on this prompt and draft
    with the one whose agreement and layer count predict the best speed-up (recorded in the trace). Set one
    of the two, not both. ``draft_tokens``, ``adaptive``, ``confidence_threshold``: as for ``speculative``
    (a chain); ``acceptance`` and its thresholds as for every drafting strategy (``AcceptanceParams``).
    Always eager on the dynamic KV cache the draft shares with the target (no ``fast``: the
    static cache and the compiled forward run the whole model).
    """
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    draft_tokens: int = 4
    adaptive: bool = True
    confidence_threshold: float = 0.4
    exit_layer: int = 0
    skip_layers: str = ""

    def __post_init__(self) -> None:
        SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)   # the same checks
        self.check_acceptance()
        check_number("draft_tokens", self.draft_tokens, 1, MAX_DRAFT, integer=True)
        check_bool("adaptive", self.adaptive)
        check_number("confidence_threshold", self.confidence_threshold, 0.0, 1.0)
        check_number("exit_layer", self.exit_layer, 0, MAX_LAYERS - 1, integer=True)
        if self.skip_layers != SKIP_AUTO:
            parse_layer_list("skip_layers", self.skip_layers)
        if self.skip_layers and self.exit_layer:
            raise ValueError("set exit_layer (an early exit) or skip_layers (a skipped set), not both: "
                             f"exit_layer={self.exit_layer}, skip_layers={_shown(self.skip_layers)}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0

    @property
    def skipped(self) -> tuple[int, ...]:
        """The layers ``skip_layers`` names (empty for an early exit or ``auto``)."""
        return () if self.skip_layers in ("", SKIP_AUTO) else parse_layer_list("skip_layers", self.skip_layers)


@dataclass(frozen=True)
class PromptLookupParams(DraftedParams):
    """Drafts by copying what followed the latest earlier occurrence of the last n-gram.

    ``ngram_size``: the longest n-gram matched; shorter ones are tried down to ``min_ngram`` (vLLM's
    ``prompt_lookup_min``; a value above ``ngram_size`` means ``ngram_size``). A shorter match drafts more
    often and is accepted less often, and a drafted step costs more than greedy's (a wider verify forward
    on a CPU, the loop's host work on a GPU): a single token's match does not pay. On the Intel Xeon
    (BENCHMARKS.md, "Prompt lookup's shortest match"), 1 / 2 / 3 ran 0.90x / 1.07x / 1.12x greedy on 6
    unseen prompts and 1.16x / 1.32x / 1.27x on 6 input-grounded ones; 2 is the default.

    ``max_candidates`` > 1: when the n-gram occurred several times, up to that many distinct
    continuations (latest first) are verified together as a tree (``drafting/lookup.py``); 1 drafts
    the latest one as a chain. Models without custom 4D mask support always get the chain.
    """
    temperature: float = 0.0
    draft_tokens: int = 8
    ngram_size: int = 3
    min_ngram: int = 2
    max_candidates: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("draft_tokens", self.draft_tokens, 1, MAX_DRAFT, integer=True)
        check_number("ngram_size", self.ngram_size, 1, 8, integer=True)
        check_number("min_ngram", self.min_ngram, 1, 8, integer=True)
        check_number("max_candidates", self.max_candidates, 1, 16, integer=True)

    @property
    def shortest_match(self) -> int:
        """The shortest n-gram that may draft: ``min_ngram``, at most ``ngram_size``."""
        return min(self.min_ngram, self.ngram_size)


@dataclass(frozen=True)
class SuffixParams(DraftedParams):
    """Suffix decoding; temperature 0 = greedy verification (lossless).

    A match of ``m`` tokens (the context's last ``m`` tokens occurred before) may draft up to
    ``min(draft_tokens, m * spec_factor + spec_offset)`` tokens. ``min_token_prob``: stop a path
    when the empirical probability of reaching its next token is below it. ``tree``: draft a tree
    of the ``tree_nodes`` most probable continuations (a chain of the most frequent one otherwise;
    models without custom 4D mask support always get chains). ``max_depth``: the longest match
    the suffix trees index. ``history``: also draft from earlier outputs when the run has a
    history (``RunContext.history``), and add this output to it. ``history_min_match``: the
    shortest match in the history that may draft (a match of a token or two into unrelated
    earlier text mostly widens the verify forward). ``edit_tokens``: follow the copied text across
    small edits: when the target cuts a copy short (a renamed variable, an added word), the next
    drafts also hold up to ``edit_tokens`` tokens of that text from just after the rejected token
    (the target replaced it) and from the rejected token itself (the target inserted text before
    it), match or not; 0 turns this off. The defaults come from deterministic sweeps on the six
    input-grounded benchmark prompts (BENCHMARKS.md).
    """
    temperature: float = 0.0
    draft_tokens: int = 16
    spec_factor: float = 4.0        # 1 -> 4: 1.77 -> 2.05 tokens per target forward on the grounded prompts
    spec_offset: float = 0.0
    min_token_prob: float = 0.1
    tree: bool = True
    tree_nodes: int = 16            # 12 -> 16 with edit following: 2.14 -> 2.18 tokens/forward (SmolLM2), 3.29 -> 3.83 (Gemma 3)
    max_depth: int = 32
    history: bool = True
    history_min_match: int = 1
    edit_tokens: int = 16           # 0 -> 16: 2.07 -> 2.18 tokens/forward (SmolLM2), 3.02 -> 3.83 (Gemma 3)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("draft_tokens", self.draft_tokens, 1, MAX_DRAFT, integer=True)
        check_number("spec_factor", self.spec_factor, 0.0, 16.0)
        check_number("spec_offset", self.spec_offset, -16.0, float(MAX_DRAFT))
        check_number("min_token_prob", self.min_token_prob, 0.0, 1.0)
        check_bool("tree", self.tree)
        check_number("tree_nodes", self.tree_nodes, 1, MAX_TREE_NODES, integer=True)
        check_number("max_depth", self.max_depth, 2, 256, integer=True)
        check_bool("history", self.history)
        check_number("history_min_match", self.history_min_match, 1, 256, integer=True)
        check_number("edit_tokens", self.edit_tokens, 0, MAX_DRAFT, integer=True)
        if self.spec_factor == 0 and self.spec_offset < 1:
            raise ValueError("spec_factor 0 with spec_offset below 1 never drafts: raise spec_factor "
                             f"(in [0, 16]) or spec_offset (in [-16, {MAX_DRAFT}])")


# --------------------------------------------------------------------------- Jacobi and lookahead

VARIANTS = ("jacobi", "gs_jacobi", "hybrid", "sliding")   # the paper's three, then ours


INITS = ("pad", "repeat", "random")


@dataclass(frozen=True)
class JacobiParams:
    """Jacobi decoding (Santilli et al. 2023). See the module docstring for the variants.

    ``block_size``: guesses refined together (not used by ``jacobi``, whose block is
    the whole length budget); 0 (the default) is *auto*: on a CPU the block with the
    most expected tokens per ms of the model's measured forward-cost curve
    (``runtime/widths.py``), elsewhere 8. ``max_iterations``: the most iterations one block gets
    (the paper's own bound, n iterations for n tokens, always applies; the default
    never binds); a block cut short commits its verified prefix. ``init``: the first
    guess, ``pad`` tokens (the paper's), the newest token repeated, or random tokens.
    """
    block_size: int = 0             # 0: auto (runtime/widths.py)
    max_iterations: int = MAX_NEW_TOKENS_CAP
    variant: str = "hybrid"
    init: str = "pad"
    fast: bool = False              # static KV cache + CUDA graphs (decoding/runtime/fastpath.py)
    CHOICES = {"variant": VARIANTS, "init": INITS}

    def __post_init__(self) -> None:
        check_number("block_size", self.block_size, 0, 64, integer=True)
        check_number("max_iterations", self.max_iterations, 1, MAX_NEW_TOKENS_CAP, integer=True)
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {self.variant!r}")
        if self.init not in INITS:
            raise ValueError(f"init must be one of {', '.join(INITS)}, got {self.init!r}")
        check_bool("fast", self.fast)


@dataclass(frozen=True)
class LookaheadParams(DraftedParams):
    """``window`` W, ``ngram`` N, ``guess_set`` G (n-grams kept per key and verified per step).

    ``temperature`` 0 (the default) is greedy and token-identical to greedy
    decoding; above 0 (with ``top_k``/``top_p``) it samples, exactly in distribution.

    ``window`` 0 (the default) is *auto*: on a CPU the window with the most expected
    tokens per ms of the model's measured forward-cost curve (``runtime/widths.py``),
    elsewhere 2; any other value is used as given. N=4, G=4 are the point of ``make
    bench-lookahead``'s sweep that met both CPU goals on code prompts with W=2 (step
    compression >= 1.3, wall clock >= greedy); on a GPU, where a wide forward costs what a
    narrow one does, wider windows pay more (BENCHMARKS.md: W=4, N=5, G=2 was the H100
    sweep's best).
    """
    temperature: float = 0.0
    window: int = 0                 # 0: auto (runtime/widths.py)
    ngram: int = 4
    guess_set: int = 4
    pool_from_prompt: bool = True
    pool_from_output: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("window", self.window, 0, 32, integer=True)
        check_number("ngram", self.ngram, 2, 8, integer=True)
        check_number("guess_set", self.guess_set, 1, 32, integer=True)
        check_bool("pool_from_prompt", self.pool_from_prompt)
        check_bool("pool_from_output", self.pool_from_output)


# --------------------------------------------------------------------------- transformers' own generate

ASSISTANT_SCHEDULES = ("constant", "heuristic_transient")   # "heuristic" would carry over between runs


@dataclass(frozen=True)
class HFGreedyParams:
    """transformers' ``generate`` with ``do_sample=False`` and one beam: the library's greedy search."""


@dataclass(frozen=True)
class HFPromptLookupParams:
    """transformers' ``generate`` with ``prompt_lookup_num_tokens`` (its prompt lookup decoding).

    ``prompt_lookup_num_tokens``: tokens copied per draft; ``max_matching_ngram_size``: the longest
    n-gram it looks for (transformers' defaults: 10 and 2).
    """
    prompt_lookup_num_tokens: int = 10
    max_matching_ngram_size: int = 2

    def __post_init__(self) -> None:
        check_number("prompt_lookup_num_tokens", self.prompt_lookup_num_tokens, 1, MAX_DRAFT, integer=True)
        check_number("max_matching_ngram_size", self.max_matching_ngram_size, 1, 8, integer=True)


@dataclass(frozen=True)
class HFAssistedParams:
    """transformers' ``generate`` with ``assistant_model`` (its assisted generation), greedy.

    ``num_assistant_tokens``: the assistant's draft length; ``num_assistant_tokens_schedule``:
    ``constant`` or ``heuristic_transient`` (+2 after a fully accepted draft, -1 otherwise, reset
    every run); ``assistant_confidence_threshold``: the assistant stops drafting below it
    (transformers' defaults: 20, constant, 0.4).
    """
    num_assistant_tokens: int = 20
    num_assistant_tokens_schedule: str = "constant"
    assistant_confidence_threshold: float = 0.4
    CHOICES = {"num_assistant_tokens_schedule": ASSISTANT_SCHEDULES}

    def __post_init__(self) -> None:
        check_number("num_assistant_tokens", self.num_assistant_tokens, 1, MAX_DRAFT, integer=True)
        if self.num_assistant_tokens_schedule not in ASSISTANT_SCHEDULES:
            raise ValueError(f"num_assistant_tokens_schedule must be one of {', '.join(ASSISTANT_SCHEDULES)}, "
                             f"got {self.num_assistant_tokens_schedule!r}")
        check_number("assistant_confidence_threshold", self.assistant_confidence_threshold, 0.0, 1.0)


@dataclass(frozen=True)
class HFEarlyExitParams(HFAssistedParams):
    """transformers' ``generate`` with ``assistant_early_exit`` (its self-speculative decoding), greedy.

    ``exit_layer``: the draft runs the target's first ``exit_layer`` layers, then its final norm and LM head
    (0: half the layers, as ``self_speculative``). The draft length settings are ``hf_assisted``'s, with the
    defaults of ``self_speculative``'s chain (4 tokens, grown and shrunk per step, threshold 0.4) so the two
    columns draft alike.
    """
    num_assistant_tokens: int = 4
    num_assistant_tokens_schedule: str = "heuristic_transient"
    exit_layer: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("exit_layer", self.exit_layer, 0, MAX_LAYERS - 1, integer=True)
