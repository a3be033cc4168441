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
             "shape is captured once as a CUDA graph and replayed (decoding/fastpath.py). Same tokens.")


@dataclass(frozen=True)
class GreedyParams:
    """Plain greedy decoding: one target forward per token, argmax.

    ``fast``: a static KV cache; on a GPU each forward is replayed as a CUDA graph
    (decoding/fastpath.py). Same tokens either way.
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
    fast: bool = False              # static KV cache + CUDA graphs (decoding/fastpath.py)

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
        if annotation is float and isinstance(value, int) and not isinstance(value, bool):
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
