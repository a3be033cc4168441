"""Field-by-field checks of an imported trace: every value the views use, typed and bounded.

Event checks are derived from the dataclasses in ``decoding.events``: integers
where integers belong (never booleans), finite numbers, strings only from the
vocabularies below, tuples of bounded size, and each field's own default is
always valid. Result and document fields are listed in ``RESULT_FIELDS`` and
``DOC_FIELDS``. A failed check raises ``Invalid``; its place
(``results[0].events[3].step``) is filled in on the way out, so a valid trace
never pays for building it. For speed, each event type's checks are also
compiled into one function that only accepts (``COMPILED``, ``check_events``);
every refusal still comes from ``_check_event``.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any, Callable, Optional

from decoding.events import EVENT_TYPES, SOURCES, typed_event  # pure dataclasses; no torch

MAX_TOKENS = 100_000          # token ids, pieces or vocabulary entries of one result
MAX_ITEMS = 65_536            # numbers in one event, its tuples together
MAX_STEP = 10**6              # the replay clock, output positions, counters
MAX_ID = 2**31 - 1            # token ids
MAX_DRAFT = 4096              # drafted / accepted lengths of one step
MAX_TEXT = 4096               # one token piece, label or message
MAX_DOC_TEXT = 2**20          # the prompt and a result's whole text

# The string fields of events and their vocabularies; every other event field is a number or numbers.
MODELS = ("target", "draft")
FORWARD_KINDS = ("prefill", "decode", "verify", "draft", "jacobi", "lookahead", "tree")
DRAFT_SOURCES = ("assistant", "prompt_lookup", "prophet", "ngram_pool", "suffix", "draft", "self")
VOCABULARIES: dict[tuple[str, str], tuple[str, ...]] = {
    ("TokenCommitted", "source"): SOURCES, ("ForwardPass", "model"): MODELS,
    ("ForwardPass", "kind"): FORWARD_KINDS, ("DraftProposed", "source"): DRAFT_SOURCES,
    ("DraftTree", "source"): DRAFT_SOURCES, ("CorrectionToken", "kind"): ("correction", "bonus"),
    # issue 16 (suffix decoding): where a model-free draft was copied from
    ("DraftSource", "text"): ("prompt", "output", "history"), ("DraftSource", "source"): DRAFT_SOURCES,
    # issue 36: lookahead's window or Jacobi's block, and where it came from (decoding/runtime/widths.py)
    ("WidthChosen", "name"): ("window", "block_size"), ("WidthChosen", "source"): ("user", "curve", "fallback"),
}
# integer event fields whose range is not a token id's [0, MAX_ID]
INT_RANGES = {"step": (0, MAX_STEP), "position": (0, MAX_STEP), "start": (0, MAX_STEP),
              "block": (0, MAX_STEP), "iteration": (0, MAX_STEP), "converged": (0, MAX_STEP),
              "positions": (0, MAX_STEP), "pool_size": (0, MAX_STEP), "pool_hits": (0, MAX_STEP),
              "finished": (0, MAX_STEP), "mask_size": (0, MAX_STEP), "drafted": (0, MAX_DRAFT),
              "accepted": (0, MAX_DRAFT), "accepted_candidate": (-1, MAX_STEP), "next_token": (-1, MAX_ID)}
ELEMENT_RANGES = {"parents": (-1, MAX_ID)}   # integers inside tuples: token ids unless named here

Check = Callable[[Any], int]   # returns how many numbers the value held; raises Invalid


class Invalid(ValueError):
    """A value that failed its check; ``path`` is prefixed by the callers on the way out."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message, self.path = message, ""

    def __str__(self) -> str:
        return f"{self.path}{self.message}"


def at(exc: Invalid, place: str) -> Invalid:
    exc.path = place + exc.path
    return exc


def _short(value: Any) -> str:
    if type(value) is int and value.bit_length() > 128:   # JSON integers have no size limit (repr may refuse)
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _fail(what: str, value: Any) -> None:
    raise Invalid(f" must be {what}, got {_short(value)}")


def _int_check(lo: int, hi: int) -> Check:
    def check(v: Any) -> int:
        if type(v) is not int or not lo <= v <= hi:   # type(): a bool is not an integer here
            _fail(f"an integer in [{lo}, {hi}]", v)
        return 1
    check.bounds = (lo, hi)
    check.kind = ("int", lo, hi)
    return check


def _float_check(v: Any) -> int:
    try:
        finite = type(v) in (int, float) and math.isfinite(v)
    except OverflowError:   # an integer too large for a float (JSON integers have no size limit)
        finite = False
    if not finite:
        _fail("a finite number", v)
    return 1


_float_check.kind = ("float",)
_NUMBER_TYPES = frozenset((int, float))


def _finite_numbers(v: list) -> bool:
    """True only if every item is an int or a float (never a bool) and finite: a fast test for a long list,
    conservative (an overflowing sum says False; the caller then checks item by item, for the message)."""
    if not set(map(type, v)) <= _NUMBER_TYPES:
        return False
    try:
        total = math.fsum(v)          # a NaN or an infinity makes it non-finite (inf - inf raises)
    except (OverflowError, ValueError):
        return False
    return total - total == 0.0


def _bool_check(v: Any) -> int:
    if type(v) is not bool:
        _fail("true or false", v)
    return 1


_bool_check.kind = ("bool",)


def _text_check(limit: int, vocabulary: tuple[str, ...] | None = None) -> Check:
    def check(v: Any) -> int:
        if vocabulary is not None:
            if not isinstance(v, str) or v not in vocabulary:
                _fail("one of " + ", ".join(vocabulary), v)
            return 1
        if not isinstance(v, str) or len(v) > limit:
            _fail(f"a string of at most {limit} characters", v if not isinstance(v, str) else v[:20])
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise Invalid(" contains a lone surrogate (not valid Unicode text)") from None
        return 1
    check.kind = ("vocab", frozenset(vocabulary)) if vocabulary is not None else ("text", limit)
    return check


def _texts(v: list, limit: int) -> bool:
    """True only if every item is a str of at most ``limit`` characters that is valid Unicode (no lone
    surrogate): one pass in C over a long list (False: the caller checks item by item, for the message)."""
    if set(map(type, v)) != {str} or max(map(len, v)) > limit:
        return False
    text = "".join(v)
    if text.isascii():
        return True
    try:
        text.encode("utf-8")          # a lone surrogate in any piece fails here (Python never pairs them)
    except UnicodeEncodeError:
        return False
    return True


def _optional(check: Check) -> Check:
    optional = lambda v: 0 if v is None else check(v)   # noqa: E731
    optional.kind = ("optional", check)
    return optional


def _list_check(element: Check, limit: int) -> Check:
    bounds = getattr(element, "bounds", None)
    kind = getattr(element, "kind", ("",))

    def check(v: Any) -> int:
        if not isinstance(v, list) or len(v) > limit:
            _fail(f"a list of at most {limit} items", v if not isinstance(v, list) else f"{len(v)} items")
        if bounds is not None and (not v or (set(map(type, v)) == _INT_TYPE   # integers: the fast path
                                             and bounds[0] <= min(v) and max(v) <= bounds[1])):
            return len(v)
        if v and ((kind[0] == "float" and _finite_numbers(v)) or (kind[0] == "text" and _texts(v, kind[1]))):
            return len(v)                 # every item fine: counted without a call per item
        n = 0
        for i, x in enumerate(v):
            try:
                n += element(x)
            except Invalid as exc:
                raise at(exc, f"[{i}]") from None
        return n
    check.kind = ("list", element, limit)
    return check


_INT_TYPE = frozenset((int,))


def _hint_check(owner: str, name: str, hint: Any, element: bool = False, default: Any = None) -> Check:
    """The check for one dataclass field, from its type hint (its default is always a valid value)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Union and len(args) == 1:
        return _optional(_hint_check(owner, name, args[0], element))
    if hint is bool:
        return _bool_check
    if hint is int:
        lo, hi = ELEMENT_RANGES.get(name, (0, MAX_ID)) if element else INT_RANGES.get(name, (0, MAX_ID))
        return _int_check(min(lo, default) if type(default) is int else lo, hi)
    if hint is float:
        return _float_check
    if hint is str and (owner, name) in VOCABULARIES:
        return _text_check(0, VOCABULARIES[(owner, name)])
    if typing.get_origin(hint) is tuple and len(args) == 2 and args[1] is Ellipsis:
        return _list_check(_hint_check(owner, name, args[0], element=True), MAX_ITEMS)
    raise TypeError(f"{owner}.{name}: no import check for {hint!r}; add one to visualize/traces.py")


@dataclasses.dataclass(frozen=True)
class _EventSpec:
    checks: dict[str, Check]
    required: frozenset[str]
    defaults: dict[str, Any]

    @property
    def allowed(self) -> frozenset[str]:
        """Every key an event of this type may have: its fields and ``type``."""
        return frozenset(self.checks) | {"type"}


def _spec(cls: type) -> _EventSpec:
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    return _EventSpec({f.name: _hint_check(cls.__name__, f.name, hints[f.name], default=f.default) for f in fields},
                      frozenset(f.name for f in fields if f.default is dataclasses.MISSING
                                and f.default_factory is dataclasses.MISSING),
                      {f.name: f.default for f in fields if f.default is not dataclasses.MISSING})


SPECS: dict[str, _EventSpec] = {name: _spec(cls) for name, cls in EVENT_TYPES.items()}


def _check_tree(e: dict) -> None:
    """A DraftTree lists parents first; q is per node; the accepted nodes form a path from the root."""
    n = len(e["tokens"])
    if len(e["parents"]) != n or any(not -1 <= p < i for i, p in enumerate(e["parents"])):
        raise Invalid(".parents must give each node an earlier node or -1 (the root), one per token")
    if len(e["q"]) not in (0, n):
        raise Invalid(".q must be empty or hold one probability per node")
    parent = -1
    for node in e["accepted"]:
        if node >= n or e["parents"][node] != parent:
            raise Invalid(".accepted must be a path of nodes from the root down")
        parent = node


def _check_filter(e: dict) -> None:
    """A SamplingFilter holds one probability in [0, 1] per token in each of its distributions."""
    n = len(e["tokens"])
    for key in ("p_raw", "p_temperature", "p_final"):
        if len(e[key]) not in (0, n):
            raise Invalid(f".{key} must be empty or hold one probability per token")
        if any(not 0.0 <= p <= 1.0 for p in e[key]):
            raise Invalid(f".{key} must hold probabilities in [0, 1]")


def _check_proposed(e: dict) -> None:
    """A DraftProposed holds one probability per drafted token, or none."""
    if len(e["q"]) not in (0, len(e["tokens"])):
        raise Invalid(".q must be empty or hold one probability per drafted token")


# the checks across an event's fields, by type: after its fields and defaults (the rule and the compiled checks)
WHOLE_EVENT: dict[str, Callable[[dict], None]] = {"DraftTree": _check_tree, "SamplingFilter": _check_filter,
                                                  "DraftProposed": _check_proposed}


def _refused(kind: str, detail: Any) -> Invalid:
    if kind == "object":
        return Invalid(f" must be an object, got {detail}")
    if kind == "type":
        return Invalid(f": unknown event type {_short(detail)}")
    return Invalid(f": {detail[0]} has unknown field(s) {_short(detail[1])}")


def _check_event(e: Any) -> int:
    """Validate one event dict in place (missing fields get their defaults); returns its number count."""
    name, spec = typed_event(e, SPECS, lambda spec: spec.checks, _refused)
    missing = spec.required - set(e)
    if missing:
        raise Invalid(f": {name} is missing field(s) {sorted(missing)}")
    items = 0
    for key, value in e.items():
        if key != "type":
            try:
                items += spec.checks[key](value)
            except Invalid as exc:
                raise at(exc, f".{key}") from None
    if items > MAX_ITEMS:
        raise Invalid(f" holds {items} numbers; the limit is {MAX_ITEMS}")
    for key, default in spec.defaults.items():
        e.setdefault(key, list(default) if isinstance(default, tuple) else default)
    whole = WHOLE_EVENT.get(name)
    if whole is not None:
        whole(e)
    return items


def check_event(e: Any, place: str = "event") -> int:
    """:func:`_check_event`, raising with ``place`` in the message."""
    try:
        return _check_event(e)
    except Invalid as exc:
        raise at(exc, place) from None


# --------------------------------------------------------------------------- the same checks, compiled
# A trace holds up to 200,000 events; ``_check_event`` calls a check per field, so most of an import's time
# went there. Each event type's checks are also written out as one function (its source generated below
# from the same ``SPECS``, see ``compiled_source``) that only *accepts*: it returns the event's number count
# when every field passes, having filled in the defaults and run the type's own checks exactly as
# ``_check_event`` does, and None at the first doubt, before changing anything. ``check_events`` then runs
# ``_check_event`` on that event, so every refusal and its message come from the one rule above.
# tests/test_import_speed.py holds the two to the same answers on valid and broken events.

_MISSING = object()


def _emit(check: Check, var: str, lines: list, pad: str, consts: dict, depth: int = 0) -> None:
    """Lines that return None unless ``var`` passes ``check``, adding its number count to ``n``."""
    kind = getattr(check, "kind", ("",))
    const = lambda value: _const(consts, value)   # noqa: E731
    if kind[0] == "int":
        lines += [f"{pad}if type({var}) is not int or not {kind[1]} <= {var} <= {kind[2]}: return None",
                  f"{pad}n += 1"]
    elif kind[0] == "float":     # a finite float, or an int a float holds (huge ones: the slow path decides)
        lines += [f"{pad}if not ((type({var}) is float and {var} - {var} == 0.0) or "
                  f"(type({var}) is int and -1e300 < {var} < 1e300)): return None", f"{pad}n += 1"]
    elif kind[0] == "bool":
        lines += [f"{pad}if type({var}) is not bool: return None", f"{pad}n += 1"]
    elif kind[0] == "vocab":
        lines += [f"{pad}if type({var}) is not str or {var} not in {const(kind[1])}: return None", f"{pad}n += 1"]
    elif kind[0] == "optional":
        lines.append(f"{pad}if {var} is not None:")
        _emit(kind[1], var, lines, pad + "    ", consts, depth)
    elif kind[0] == "list":
        element, limit = kind[1], kind[2]
        inner = getattr(element, "kind", ("",))
        lines.append(f"{pad}if type({var}) is not list or len({var}) > {limit}: return None")
        if inner[0] == "int":
            lines += [f"{pad}if {var} and (set(map(type, {var})) != _INT_TYPE or min({var}) < {inner[1]} "
                      f"or max({var}) > {inner[2]}): return None", f"{pad}n += len({var})"]
        elif inner[0] == "float":
            lines += [f"{pad}if {var} and not _finite_numbers({var}): return None", f"{pad}n += len({var})"]
        else:
            item = f"x{depth}"
            lines.append(f"{pad}for {item} in {var}:")
            _emit(element, item, lines, pad + "    ", consts, depth + 1)
    else:                        # a check not written out here: called as it is
        lines += [f"{pad}try:", f"{pad}    n += {const(check)}({var})",
                  f"{pad}except Invalid:", f"{pad}    return None"]


def compiled_source(name: str) -> tuple[str, dict]:
    """The accept-only check of one event type as Python source, and the constants it names."""
    spec, consts = SPECS[name], {}
    lines = [f"def check_{name}(e):", f"    if not (e.keys() <= {_const(consts, spec.allowed)} and "
                                       f"{_const(consts, spec.required)} <= e.keys()): return None", "    n = 0"]
    for key, check in spec.checks.items():
        if key in spec.required:
            lines.append(f"    v = e[{key!r}]")
            _emit(check, "v", lines, "    ", consts)
        else:
            lines += [f"    v = e.get({key!r}, _MISSING)", "    if v is not _MISSING:"]
            _emit(check, "v", lines, "        ", consts)
    lines.append(f"    if n > {MAX_ITEMS}: return None")
    for key, default in spec.defaults.items():   # as _check_event's setdefault, in the same order
        value = "[]" if default == () else f"list({_const(consts, default)})" if isinstance(default, tuple) \
            else repr(default) if default is None or type(default) in (int, float, bool, str) \
            else _const(consts, default)
        lines.append(f"    if {key!r} not in e: e[{key!r}] = {value}")
    if name in WHOLE_EVENT:
        lines.append(f"    {_const(consts, WHOLE_EVENT[name])}(e)")
    lines.append("    return n")
    return "\n".join(lines) + "\n", consts


def _const(consts: dict, value: Any) -> str:
    name = f"_k{len(consts)}"
    consts[name] = value
    return name


def _compile(name: str) -> Callable[[dict], Optional[int]]:
    source, consts = compiled_source(name)
    scope = {"_MISSING": _MISSING, "_INT_TYPE": _INT_TYPE, "_finite_numbers": _finite_numbers,
             "Invalid": Invalid, **consts}
    exec(compile(source, f"<checks.compiled {name}>", "exec"), scope)   # our own source: built from SPECS only
    return scope[f"check_{name}"]


COMPILED: dict[str, Callable[[dict], Optional[int]]] = {name: _compile(name) for name in SPECS}


def check_events(events: list) -> None:
    """Check every event of a list in place (``_check_event``'s rule, compiled per type for speed); raises
    Invalid with the event's index (``[7].step must be ...``)."""
    compiled = COMPILED
    for j, e in enumerate(events):
        try:
            fast = None
            if type(e) is dict:
                name = e.get("type")
                fast = compiled.get(name) if type(name) is str else None
            if fast is None or fast(e) is None:
                _check_event(e)
        except Invalid as exc:
            raise at(exc, f"[{j}]") from None


# --------------------------------------------------------------------------- results and documents

def _scalar(v: Any) -> int:
    if v is None or type(v) is bool:
        return 1
    if type(v) in (int, float):
        return _float_check(v)
    return _text_check(MAX_TEXT)(v)


def _mapping_check(value: Check, limit: int, key_check: Check | None = None) -> Check:
    key_check = key_check or _text_check(64)

    def check(v: Any) -> int:
        if not isinstance(v, dict) or len(v) > limit:
            _fail(f"an object of at most {limit} entries", v if not isinstance(v, dict) else f"{len(v)} entries")
        for k, x in v.items():
            try:
                key_check(k)
            except Invalid as exc:
                raise at(exc, " key") from None
            try:
                value(x)
            except Invalid as exc:
                raise at(exc, f".{k}") from None
        return len(v)
    return check


MAX_ENV_NODES = 4096         # values in a trace's environment, nested ones included (a real one holds ~160)
MAX_ENV_DEPTH = 8            # objects and lists nested in it (a real one nests 5 deep)


def _environment(v: Any) -> int:
    """Where and how a run was measured: an object of plain JSON values (text, numbers, booleans, null, and
    objects and lists of them) with at most ``MAX_ENV_NODES`` values, ``MAX_ENV_DEPTH`` deep. Walked without
    recursion; refused at the first value over a cap, before the rest is looked at."""
    if not isinstance(v, dict):
        _fail("an object", v)
    nodes, stack = 1, [(v, 0, "")]
    while stack:
        item, depth, where = stack.pop()
        if depth > MAX_ENV_DEPTH:
            raise Invalid(f"{where} nests deeper than {MAX_ENV_DEPTH} objects and lists")
        if isinstance(item, (dict, list)):
            nodes += len(item)             # counted before any of them is looked at
            if nodes > MAX_ENV_NODES:
                raise Invalid(f"{where} brings it over {MAX_ENV_NODES} values in all, nested ones included")
        if isinstance(item, dict):
            for k, x in item.items():
                try:
                    _text_check(64)(k)
                except Invalid as exc:
                    raise at(exc, f"{where} key") from None
                stack.append((x, depth + 1, f"{where}.{k}"))
        elif isinstance(item, list):
            stack.extend((x, depth + 1, f"{where}[{i}]") for i, x in enumerate(item))
        elif depth:
            try:
                _scalar(item)
            except Invalid as exc:
                raise at(exc, where) from None
    return nodes


def _token_key(k: Any) -> int:
    if not isinstance(k, str) or not k.isdecimal() or len(k) > 10:
        _fail("a token id written as decimal digits", k)
    return 1


def _stat_value(v: Any) -> int:
    if isinstance(v, list):
        return _list_check(_scalar, MAX_TOKENS)(v)
    if isinstance(v, dict):
        return _mapping_check(_scalar, 256)(v)
    return _scalar(v)


NUMERIC_STATS = ("alpha", "gamma", "cost_ratio", "predicted_speedup", "mean_tokens_per_target_forward",
                 "step_compression")   # the stats the views format as numbers
_lengths = _list_check(_int_check(0, MAX_DRAFT), MAX_TOKENS)   # the histogram draws a bar per length


def _stats_check(v: Any) -> int:
    n = _mapping_check(_stat_value, 256)(v)
    for key in NUMERIC_STATS + ("accepted_lengths",):
        if v.get(key) is not None:
            try:
                (_lengths if key == "accepted_lengths" else _float_check)(v[key])
            except Invalid as exc:
                raise at(exc, f".{key}") from None
    return n


_token_ids = _list_check(_int_check(0, MAX_ID), MAX_TOKENS)
MAX_TIME_MS = 1e9             # an event time: about 11 days after its run started
MAX_EVENT_TIMES = 200_000     # as many as a trace may hold events


def _times_check(v: Any) -> int:
    """``times_ms``: one finite time in [0, MAX_TIME_MS] per event (checked against ``events`` by check_result)."""
    n = _list_check(_float_check, MAX_EVENT_TIMES)(v)
    if not v or (0 <= min(v) and max(v) <= MAX_TIME_MS):     # finite numbers by now: min and max are exact
        return n
    for i, t in enumerate(v):
        if not 0 <= t <= MAX_TIME_MS:
            raise Invalid(f"[{i}] must be a time in [0, {MAX_TIME_MS:g}] ms, got {_short(t)}")
    return n


RESULT_FIELDS: dict[str, Check] = {
    "strategy": _text_check(64), "label": _text_check(128),
    "params": _mapping_check(_scalar, 64), "token_ids": _token_ids, "text": _text_check(MAX_DOC_TEXT),
    "pieces": _list_check(_text_check(MAX_TEXT), MAX_TOKENS),
    "vocab": _mapping_check(_text_check(MAX_TEXT), MAX_TOKENS, _token_key),
    "wall_s": _optional(_float_check), "tokens_per_s": _optional(_float_check), "speedup": _optional(_float_check),
    "divergence_margin": _optional(_float_check), "target_forwards": _optional(_int_check(0, MAX_STEP)),
    "draft_forwards": _optional(_int_check(0, MAX_STEP)), "first_divergence": _optional(_int_check(0, MAX_STEP)),
    "divergence_tokens": _optional(_list_check(_int_check(0, MAX_ID), 16)), "stats": _stats_check,
    "lossless": _bool_check, "reference": _bool_check, "matches_greedy": _optional(_bool_check),
    "lossy": _bool_check, "differing_tokens": _optional(_int_check(0, MAX_STEP)),   # relaxed acceptance's cost
    "target_logprob": _optional(_float_check),
    "stop_reason": _optional(_text_check(64)), "error": _optional(_text_check(MAX_TEXT)),
    "upgraded_from": _mapping_check(_scalar, 8),      # what visualize.legacy renamed in a version-1 trace
    "times_ms": _times_check,                         # per event, ms since the run started (the race replay)
    "model": _optional(_text_check(256)),             # the model it ran on, in a race of two models
}
REQUIRED = ("strategy", "token_ids", "events")
DOC_FIELDS: dict[str, Check] = {
    "prompt": _text_check(MAX_DOC_TEXT), "chat": _bool_check, "prompt_ids": _token_ids,
    "max_new_tokens": _int_check(0, MAX_STEP), "environment": _environment,
    "generation": _mapping_check(_optional(_float_check), 16),   # the logits processors' settings
}


def check_result(r: Any) -> dict:
    """The known fields of one result, checked (unknown ones are dropped); raises Invalid."""
    if not isinstance(r, dict):
        raise Invalid(" must be an object")
    for key in REQUIRED:
        if key not in r:
            raise Invalid(f".{key} is missing")
    if not isinstance(r["events"], list):
        raise Invalid(".events must be a list")
    clean = {}
    for key, check in RESULT_FIELDS.items():
        if key in r:
            try:
                check(r[key])
            except Invalid as exc:
                raise at(exc, f".{key}") from None
            clean[key] = r[key]
    clean["events"] = r["events"]
    if len(clean.get("times_ms") or ()) not in (0, len(r["events"])):
        raise Invalid(f".times_ms must be empty or hold one time per event ({len(r['events'])}), "
                      f"got {len(clean['times_ms'])}")
    return clean
