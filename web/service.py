"""The request service behind the web app: limits, validation, jobs and their Stop flags. No Gradio here.

Everything a visitor sends is checked here, cheap checks before expensive ones:
types and sizes before model names, names before loading a model, characters
before tokens. ``app.py`` only wires these functions to components.

A public Space is an open API: a request may carry any JSON value in any field,
from a fresh session, thousands of times. So every limit lives in ``LIMITS``,
a Stop can only set the flag of a job that exists, and every store a request
can add to (Stop flags, trace files, replay documents) has a fixed bound.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import os
import re
import threading
import time
import typing
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
import transformers

from decoding.context import RunContext
from decoding.harness.bench import parse_sweep, sweep_value
from decoding.harness.runner import encode_prompt, environment, planned_lanes, run_comparison
from decoding.params import check_max_new_tokens, params_to_dict
from decoding.processors import GenerationSettings
from decoding.runtime.kernel_choice import cpu_name
from decoding.runtime.models import (DEFAULT_MEMORY_BUDGET_GB, EXTRA_PRESETS, cache_root,
                                     default_target, load_model, load_presets)
from decoding.runtime.pair import PROPHET, has_prophet, make_pair
from decoding.strategies import registry
from web.crowd import request_key
from web.live import Live

# --------------------------------------------------------------------------- limits (one place)
LIMITS: dict[str, Any] = {
    "max_new_tokens": 512,        # tokens one strategy may generate
    "prompt_chars": 32_768,       # checked before tokenizing
    "prompt_tokens": 2048,        # checked after
    "strategies": 6,              # per run (plus the greedy reference)
    "time_limit_s": 180.0,        # generation time per request
    "sweep_points": 12, "sweep_keys": 2, "sweep_chars": 500,
    "request_bytes": 2**20,       # any HTTP request body except an upload
    "upload_bytes": 20 * 2**20,   # a trace file
    "queue_size": 32,             # runs and sweeps waiting for a compute slot (beyond it: "queue full")
    "compute_slots": 1,           # runs computed at the same time (one model, one device)
    "recordings_bytes": 256 * 2**20,    # memory for recorded runs replayed to identical requests
    "jobs_per_session": 2,        # queued or running runs, sweeps and imports of one browser session
    "trace_files": 64,            # exported trace files kept on disk
    "export_files": 16, "export_bytes": 96 * 2**20,   # exported animations kept on disk (oldest deleted first)
    "trace_store_bytes": 512 * 2**20,   # memory for the replay documents of all sessions
    "cache_cleanup_s": (300, 1800),     # Gradio's delete_cache: every 5 min, files older than 30 min
    # browser sessions whose Gradio state is kept, least recently used dropped first (Gradio's default: 10,000).
    # With web/gradio_overrides.LeanSessionState a session costs ~14 KB fresh and ~43 KB after a replayed race
    # (Intel Xeon, gradio 6.31; 0.42 MB and 0.45 MB without it): at most ~0.35 GB of a 16 GB Space.
    "sessions": 8000,
    "history_sessions": 64,       # browser sessions whose suffix-decoding history is kept (least recent dropped)
    "history_tokens": 2048,       # earlier output tokens one session's history keeps (oldest outputs dropped)
    "history_nodes": 1_000_000,   # suffix-tree nodes over all histories (about 300 bytes each)
    # a run is recorded only if timed quiet (web/quiet.py): (a) while greedy ran, other processes took at most
    # quiet_cpu_share of the cores (/proc/stat less this process; a window under quiet_window_s cannot tell), and
    # (b) greedy's median decode step (prefill excluded) cost at most quiet_slack x its baseline + quiet_ms, the
    # baseline being the same step measured quiet for that model and mode (measured again after quiet_remeasure
    # slow verdicts in a row with the cores free); else the example is recorded again after quiet_retry_idle x the
    # recorder's idle wait
    "quiet_cpu_share": 0.15,
    "quiet_window_s": 0.25,
    "quiet_slack": 1.25,
    "quiet_ms": 3.0,
    "quiet_remeasure": 3,
    "quiet_retry_idle": 30,
}


# the page's default comparison: the flagship (the prophet head's token trees) against greedy, prompt lookup, lookahead;
# on a CPU, ``chosen_strategies`` keeps those expected to pay on the machine (``Settings.strategies``)
DEFAULT_STRATEGIES = ("greedy", "prophet", "prompt_lookup", "lookahead")


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the operator chose when starting the app (``python app.py --allow-any-model --memory-budget-gb``).

    Passed to every request (``build_demo(settings)`` hands it to the handlers), never a module global
    changed at start: two apps in one process (the tests run several) keep their own."""
    allow_any_model: bool = False                             # any Hub id in the model pickers, not just presets
    memory_budget_gb: Optional[float] = DEFAULT_MEMORY_BUDGET_GB   # cached models beyond it are evicted (None: no cap)
    target: Optional[str] = None          # the page's default target (None: presets/models.yaml's default_target)
    target_note: str = ""                 # why that target (shown under the picker): the start's measured choice
    quiet_recordings: bool = False        # record a run only if timed on a quiet machine (app.main turns it on)
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES   # the page's default comparison (chosen_strategies)
    strategies_note: str = ""             # one line per default strategy left out here, and why (from the curve)
    compiled: bool = False                # the default target's forwards run compiled (web/startup.py); the page
    compiled_note: str = ""               # ticks ``fast`` for it, so greedy and every strategy race in that mode

    def load(self, name: str) -> Any:
        """Load a model (or take it from the cache) under this app's memory budget."""
        return load_model(name, memory_budget_gb=self.memory_budget_gb)

    def default_target(self) -> str:
        return self.target or default_target()


DEFAULT_SETTINGS = Settings()
DEFAULT_MAX_NEW = 64
# the strategies the Sweep tab offers (the API refuses any other), with the values it suggests
SWEEP_DEFAULTS = {"lookahead": "window=3,5,8;ngram=3,4", "speculative": "draft_tokens=1,2,4,8",
                  "prophet": "draft_tokens=1,2,3,4,6", "prompt_lookup": "draft_tokens=2,4,8,16",
                  "suffix": "draft_tokens=4,8,16", "jacobi": "block_size=2,4,8,16"}
SESSION_FALLBACK = "local"   # direct calls (tests, scripts) have no browser session


# --------------------------------------------------------------------------- validation
def param_fields() -> list[tuple[str, str]]:
    """(strategy, field) for every strategy parameter, in UI order."""
    return [(s.name, f.name) for s in registry().values() for f in dataclasses.fields(s.params_cls)]


def field_kind(cls: type, name: str) -> Any:
    hint = typing.get_type_hints(cls)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) is typing.Union and args else hint


_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$")


def check_model_name(name: Any, what: str, presets: dict, allow_any: bool = False) -> str:
    """A preset name, or (with ``allow_any``: ``Settings.allow_any_model``) a Hub id that names nothing on
    this server."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{what}: choose a model")
    name = name.strip()
    if name in presets:
        return name
    shown = name if len(name) <= 60 else name[:57] + "..."
    if not allow_any:
        raise ValueError(f"{what}: {shown!r} is not one of the presets ({', '.join(presets)}); "
                         f"the operator can allow any Hub model with --allow-any-model")
    if not _HUB_ID.match(name) or ".." in name or "--" in name:
        raise ValueError(f"{what}: {shown!r} is not a Hugging Face Hub id (write ORG/NAME)")
    if os.path.lexists(name) or os.path.lexists(os.path.expanduser(name)):
        # a bare name like "models" would load a folder on the server instead of the Hub repository
        raise ValueError(f"{what}: {shown!r} names something on the server; local paths are not accepted "
                         f"from the web UI")
    return name


def build_plan(strategies: Any, values: dict[tuple[str, str], Any]) -> list[tuple[str, Any]]:
    """Validate the strategy selection and parameters; returns [(name, params)]."""
    if strategies is None or strategies == [] or strategies == "":
        raise ValueError("strategies: pick at least one")
    if not isinstance(strategies, list) or not all(isinstance(n, str) for n in strategies):
        raise ValueError("strategies must be a list of strategy names")
    if len(strategies) > LIMITS["strategies"]:
        raise ValueError(f"strategies: pick at most {LIMITS['strategies']}")
    reg = registry()
    plan = []
    for name in strategies:
        if name not in reg:
            raise ValueError(f"strategies: unknown strategy {name[:40]!r}")
        raw = {f: v for (s, f), v in values.items() if s == name and v is not None and v != ""}
        try:
            plan.append((name, reg[name].parse(raw)))
        except ValueError as exc:
            raise ValueError(f"{reg[name].label or name}: {exc}") from None
    return plan


def check_unicode(text: str, what: str) -> str:
    """JSON can carry lone UTF-16 surrogates, which no tokenizer or response encoder accepts."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} has an invalid character at position {exc.start} "
                         f"(a lone UTF-16 surrogate)") from None
    return text


def check_prompt(prompt: Any) -> str:
    if not isinstance(prompt, str):
        raise ValueError(f"prompt must be text, got {type(prompt).__name__}")
    if not prompt.strip():
        raise ValueError("prompt must not be empty")
    if not any(ch.isprintable() and not ch.isspace() for ch in prompt):
        raise ValueError("prompt has no visible text (only spaces and control characters)")
    if len(prompt) > LIMITS["prompt_chars"]:
        raise ValueError(f"prompt is {len(prompt)} characters; the limit is {LIMITS['prompt_chars']}")
    return check_unicode(prompt, "prompt")


def check_seed(seed: Any) -> int:
    if not isinstance(seed, (int, float)) or isinstance(seed, bool) or seed != seed or not 0 <= seed < 2**31 \
            or not float(seed).is_integer():
        raise ValueError("seed must be an integer in [0, 2147483647]")
    return int(seed)


GENERATION_FIELDS = tuple(f.name for f in dataclasses.fields(GenerationSettings))


def generation_settings(values: Any) -> GenerationSettings:
    """The shared logits-processor settings from the form, in ``GENERATION_FIELDS`` order (None: the default).

    Raises ValueError naming the field: ``generation settings: repetition_penalty must be in (0, 10], got 0``.
    """
    if isinstance(values, dict):
        values = [values.get(name) for name in GENERATION_FIELDS]
    if not isinstance(values, (list, tuple)) or len(values) != len(GENERATION_FIELDS):
        raise ValueError(f"generation settings: expected {len(GENERATION_FIELDS)} values "
                         f"({', '.join(GENERATION_FIELDS)})")
    kinds = typing.get_type_hints(GenerationSettings)
    given = {}
    for name, value in zip(GENERATION_FIELDS, values):
        if value is None or value == "":
            continue
        if kinds[name] is int and isinstance(value, float) and value.is_integer():
            value = int(value)      # a number field sends 2.0 for 2
        given[name] = value
    try:
        return GenerationSettings(**given)
    except ValueError as exc:
        raise ValueError(f"generation settings: {exc}") from None


def needs_assistant(plan: list[tuple[str, Any]]) -> bool:
    reg = registry()
    return any(reg[name].needs_assistant for name, _ in plan)


@dataclasses.dataclass
class Prepared:
    """A validated request: the model pair, the prompt ids and the run limits."""
    pair: Any
    prompt_ids: list[int]
    max_new: int
    seed: int
    model: str
    note: str


@dataclasses.dataclass(frozen=True)
class Checked:
    """The cheap checks of a request passed (names, numbers, prompt text): no model loaded yet."""
    model: str
    assistant: Optional[str]      # a preset, PROPHET, or None
    prompt: str
    chat: bool
    max_new: int
    seed: int
    versus: Optional[str] = None  # a second target that runs the same strategies, each against its own greedy

    def rival(self) -> Optional["Checked"]:
        """The same request on the ``versus`` model (None without one)."""
        return dataclasses.replace(self, model=self.versus, versus=None) if self.versus else None


def check_versus(versus: Any, model: str, presets: dict, allow_any: bool = False) -> Optional[str]:
    """The second model of a race of two (None: no second model); never the target itself."""
    if versus in (None, "", "none"):
        return None
    versus = check_model_name(versus, "versus", presets, allow_any)
    if versus == model:
        raise ValueError(f"versus: {versus!r} is the target model already; choose another model to race it "
                         f"against, or 'none'")
    return versus


def check_inputs(model: Any, assistant: Any, prompt: Any, chat: Any, max_new_tokens: Any, seed: Any,
                 needs_assistant: bool, plan: Optional[list] = None,
                 settings: Settings = DEFAULT_SETTINGS, versus: Any = None) -> Checked:
    """Every check that needs no model, cheap ones first; raises ValueError naming the field. With ``versus``
    the same strategies run on a second model too, so every check about the target holds for it as well."""
    presets = load_presets()
    model = check_model_name(model, "model", presets, settings.allow_any_model)
    versus = check_versus(versus, model, presets, settings.allow_any_model)
    if assistant in (None, "", "none"):
        assistant = None
    elif assistant != PROPHET:
        assistant = check_model_name(assistant, "assistant", presets, settings.allow_any_model)
    max_new = check_max_new_tokens(max_new_tokens, LIMITS["max_new_tokens"])
    seed = check_seed(seed)
    prompt = check_prompt(prompt)
    if not isinstance(chat, bool):
        raise ValueError(f"chat must be true or false, got {str(chat)[:20]!r}")
    for target in (model, versus) if versus else (model,):
        _check_target(target, assistant, needs_assistant, plan, "" if target == model else " (the versus model)")
    return Checked(model, assistant if needs_assistant else None, prompt, chat, max_new, seed, versus)


def _check_target(model: str, assistant: Optional[str], needs_assistant: bool, plan: Optional[list],
                  which: str) -> None:
    """What the strategies need of a target (its prophet head, an assistant other than itself)."""
    if needs_assistant and assistant == PROPHET and not has_prophet(model):
        raise ValueError(f"assistant: no prophet head is shipped for {model!r}{which}; choose 'none' or an "
                         f"assistant model for the strategies that draft")
    if any(name == "hf_assisted" for name, _ in plan or ()) and assistant in (None, PROPHET, model):
        raise ValueError(f"strategies: transformers generate: assisted needs an assistant model other than the "
                         f"target{which}; pick one under Assistant (not 'none' or the prophet head, which "
                         f"transformers cannot run), or untick it")
    if any(name == "prophet" for name, _ in plan or ()) and not has_prophet(model):
        raise ValueError(f"strategies: no prophet head is shipped for {model!r}{which}; untick Prophet head "
                         f"(or train one with python -m decoding.train_prophet)")


def prepare(model: Any, assistant: Any, prompt: Any, chat: Any, max_new_tokens: Any, seed: Any,
            needs_assistant: bool, progress: Any = None, load: Optional[Callable[[str], Any]] = None,
            generation: Optional[GenerationSettings] = None, plan: Optional[list] = None,
            settings: Settings = DEFAULT_SETTINGS) -> Prepared:
    """The validation boundary shared by runs and sweeps; raises ValueError / ModelLoadError.

    The assistant (a model or the prophet head) is loaded only when a strategy
    of the request drafts with it. ``generation`` (already range-checked) is
    checked against the target model (token ids within its vocabulary); ``plan``
    against what the target ships (the prophet strategy needs its head).
    """
    checked = check_inputs(model, assistant, prompt, chat, max_new_tokens, seed, needs_assistant, plan, settings)
    return prepare_checked(checked, needs_assistant, progress, load or settings.load, generation)


def prepare_checked(checked: Checked, needs_assistant: bool, progress: Any = None,
                    load: Callable[[str], Any] = DEFAULT_SETTINGS.load,
                    generation: Optional[GenerationSettings] = None) -> Prepared:
    """Load the models of a checked request and tokenize its prompt (limits checked on the tokens)."""
    model, assistant, prompt, chat = checked.model, checked.assistant, checked.prompt, checked.chat
    max_new, seed = checked.max_new, checked.seed
    if progress is not None:
        progress(0, desc=f"loading {model}")
    target = load(model)
    note = ""
    if not needs_assistant:
        pair = make_pair(target, None, load)
    elif assistant is None:
        pair = dataclasses.replace(make_pair(target, None, load), assistant=target)
        note = " (no assistant chosen: the target drafts for itself, a correctness demo)"
    else:
        pair = make_pair(target, assistant, load)
        note = " (speculative drafts with the target's trained prophet head)" if assistant == PROPHET else ""
    if generation is not None:
        try:
            generation.check_for(target)
        except ValueError as exc:
            raise ValueError(f"generation settings: {exc}") from None
    prompt_ids = encode_prompt(target.tokenizer, prompt, chat=chat and target.chat)
    if len(prompt_ids) > LIMITS["prompt_tokens"]:
        raise ValueError(f"prompt is {len(prompt_ids)} tokens; the limit is {LIMITS['prompt_tokens']}")
    return Prepared(pair, prompt_ids, max_new, seed, model, note)


@dataclasses.dataclass(frozen=True)
class RunRequest:
    """A checked run request, before any model is loaded: everything that decides its result.

    ``history`` is the visitor's earlier outputs (None: this request keeps none). A request whose suffix
    run drafts from a non-empty history is ``private``: it is never shared with, or replayed for, anyone else.
    """
    inputs: Checked
    plan: tuple                         # ((strategy name, params), ...)
    generation: GenerationSettings
    history: Optional[tuple] = None
    settings: Settings = DEFAULT_SETTINGS   # how it loads its models (not part of the key: the result is the same)

    @property
    def uses_history(self) -> bool:
        return any(name == "suffix" and params.history for name, params in self.plan)

    @property
    def private(self) -> bool:
        return bool(self.history) and self.uses_history

    @property
    def strategies(self) -> int:
        """Timed runs, the greedy reference included (each model's, in a race of two models)."""
        return (len(self.plan) + (not any(name == "greedy" for name, _ in self.plan))) * (1 + bool(self.inputs.versus))

    @property
    def units(self) -> int:
        """Work for the line's estimates: tokens of every strategy."""
        return self.strategies * self.inputs.max_new

    @property
    def key(self) -> str:
        """The same for any two requests whose runs give the same trace (up to timings)."""
        fields = {"inputs": dataclasses.asdict(self.inputs),
                  "plan": [[name, params_to_dict(params)] for name, params in self.plan],
                  "generation": dataclasses.asdict(self.generation),
                  "history": ("unused" if not self.uses_history else
                              None if self.history is None else [list(t) for t in self.history])}
        return request_key(fields)


def run_request(model: Any, assistant: Any, strategies: Any, prompt: Any, chat: Any, max_new_tokens: Any,
                seed: Any, params: Any, generation: Any, history: Optional[list] = None,
                settings: Settings = DEFAULT_SETTINGS, versus: Any = None) -> RunRequest:
    """Check a run request without loading anything (ValueError names the field). ``versus``: a second model
    that runs the same strategies (a race of two models), or None."""
    plan = build_plan(strategies, params or {})
    processors = generation_settings(generation)
    inputs = check_inputs(model, assistant, prompt, chat, max_new_tokens, seed, needs_assistant(plan), plan, settings,
                          versus)
    return RunRequest(inputs, tuple(plan), processors, None if history is None else tuple(map(tuple, history)),
                      settings)


def recordings_dir() -> str:
    """Where recorded runs are kept across restarts: one folder per environment (the library's code and
    presets, torch and transformers versions, device and threads), so only the code and machine that measured
    a run replay it."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted([*root.joinpath("decoding").rglob("*.py"), *root.joinpath("presets").rglob("*.*")]):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    extra = os.environ.get(EXTRA_PRESETS, "").strip()
    if extra:                       # the operator's own presets and the adapters they merge decide results too
        for path in [Path(extra), *(Path(p.adapter) for p in load_presets().values() if p.adapter)]:
            digest.update(path.read_bytes() if path.is_file() else str(path).encode())
    device = torch.cuda.get_device_name(0) if cuda_available() else cpu_name()
    digest.update(f"{torch.__version__}|{transformers.__version__}|{device}|{torch.get_num_threads()}".encode())
    return str(recordings_root() / digest.hexdigest()[:16])


PERSISTENT = Path("/data")     # a Hugging Face Space's persistent storage, when the Space has it


def recordings_root() -> Path:
    """The persistent storage's folder where there is one to write (it outlives a Space's restarts; replicas
    that mount the same folder share the recordings), else the user's cache."""
    if PERSISTENT.is_dir() and os.access(PERSISTENT, os.W_OK):
        return PERSISTENT / "decoding-playground" / "recordings"
    return cache_root().parent / "recordings"


def cuda_available() -> bool:
    return torch.cuda.is_available()


@dataclasses.dataclass(frozen=True)
class SweepRequest:
    """A checked sweep: one strategy over a grid of parameter values (``combos``), one greedy reference."""
    inputs: Checked
    strategy: str
    keys: list
    combos: list
    plan: list
    settings: Settings = DEFAULT_SETTINGS

    @property
    def units(self) -> int:
        return (len(self.plan) + 1) * self.inputs.max_new


def sweep_request(model: Any, assistant: Any, prompt: Any, chat: Any, max_new_tokens: Any, seed: Any,
                  strategy: Any, spec: Any, settings: Settings = DEFAULT_SETTINGS) -> SweepRequest:
    """Check a sweep request without loading anything (ValueError names the field)."""
    keys, combos, plan = parse_sweep_spec(strategy, spec)
    inputs = check_inputs(model, assistant, prompt, chat, max_new_tokens, seed, needs_assistant(plan), plan, settings)
    return SweepRequest(inputs, strategy, keys, combos, plan, settings)


def complete(doc: dict) -> bool:
    """Every strategy of the run finished on its own (no Stop, time limit or error): worth recording."""
    return all(not r.get("error") and r.get("stop_reason") != "cancelled" for r in doc.get("results", ()))


def device_text(doc: dict) -> str:
    """Where a run was measured, in words: the GPU, or the CPU and its thread count."""
    env = doc.get("environment") or {}
    if env.get("gpu"):
        return f"{env['gpu']} (GPU)"
    cpu = env.get("cpu") or env.get("processor") or "a CPU"
    threads = env.get("threads")
    return f"{cpu} (CPU, {threads} threads)" if threads else str(cpu)


def ui_default(strategy: str, field: str, settings: Optional["Settings"] = None) -> Any:
    """What the page's parameter field shows at first: the field's default (``fast`` on where CUDA is, and on a
    CPU where the default target's forward was compiled at start: ``settings.compiled``)."""
    cls = registry()[strategy].params_cls
    default = next(f.default for f in dataclasses.fields(cls) if f.name == field)
    if field == "fast" and field_kind(cls, field) is bool:
        return bool(default or cuda_available() or (settings is not None and settings.compiled))
    return default


def default_request(prompt: str, settings: Settings = DEFAULT_SETTINGS) -> RunRequest:
    """The request the page sends for ``prompt`` when nothing else was changed (what examples are recorded as)."""
    model = settings.default_target()
    plan = [name for name in settings.strategies if name in registry()]
    values = {(s, f): ui_default(s, f, settings) for s, f in param_fields() if s in plan}
    return run_request(model, PROPHET if has_prophet(model) else "none", plan, prompt, True, DEFAULT_MAX_NEW, 0,
                       values, [None] * len(GENERATION_FIELDS), history=None, settings=settings)


def preload_default(settings: Settings = DEFAULT_SETTINGS, load: Optional[Callable[[str], Any]] = None) -> Optional[str]:
    """Load the default target and its prophet head into the in-process caches (the app calls this in a
    background thread at start, so a visitor's first Run does not wait for the load). Returns the model
    name, or None when it could not be loaded (the first Run then reports why)."""
    name, load = settings.default_target(), load or settings.load
    try:                            # the pair prepare() builds for the default comparison (head included)
        make_pair(load(name), PROPHET if has_prophet(name) else None, load)
    except Exception:               # noqa: BLE001: a Run will load it again and name the error
        return None
    return name


def parse_sweep_spec(strategy: Any, spec: Any) -> tuple[list[str], list[tuple], list[tuple[str, Any]]]:
    """``"window=3,5;ngram=3,4"`` for ``strategy`` -> (keys, value tuples, validated plan)."""
    reg = registry()
    if not isinstance(strategy, str) or strategy not in reg:
        raise ValueError(f"sweep strategy: unknown strategy {str(strategy)[:40]!r}")
    if strategy not in SWEEP_DEFAULTS:
        raise ValueError(f"sweep strategy: {strategy!r} cannot be swept; choose one of {', '.join(SWEEP_DEFAULTS)}")
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError("sweep values: write KEY=V1,V2[;KEY=V1,V2], e.g. draft_tokens=2,4,8")
    if len(spec) > LIMITS["sweep_chars"]:
        raise ValueError(f"sweep values: at most {LIMITS['sweep_chars']} characters")
    check_unicode(spec, "sweep values")
    try:
        _, keys, combos = parse_sweep(f"{strategy}:{spec}", max_keys=LIMITS["sweep_keys"],
                                      max_points=LIMITS["sweep_points"])
    except ValueError as exc:
        raise ValueError(f"sweep values: {exc}") from None
    plan = []
    for combo in combos:
        try:
            plan.append((strategy, reg[strategy].parse({k: sweep_value(v) for k, v in zip(keys, combo)})))
        except ValueError as exc:
            raise ValueError(f"sweep values: {exc}") from None
    return keys, combos, plan


# --------------------------------------------------------------------------- running a request
def stream_comparison(prep: Prepared, plan: list[tuple[str, Any]], *, stop: threading.Event,
                      context: Optional[RunContext] = None, time_limit_s: Optional[float] = None,
                      poll_s: float = 0.2, quiet_s: float = 1.0, rivals: Sequence[Prepared] = ()) -> Any:
    """Run the comparison in a worker thread; yield ``("live", Live.snapshot())`` while it runs, then
    ``("done", [RunResult])``.

    ``rivals``: the same request prepared on other models (a race of two models). The plan runs on ``prep``'s
    model, then on each rival's, each with its own greedy reference, all within ``time_limit_s``; every result
    names its model (``RunResult.model``), and the rivals' lanes show as waiting from the start.

    A snapshot is yielded every ``poll_s`` when something changed (a token, a new
    strategy), else every ``quiet_s``. Strategies still run one after the other,
    so their timings are what each gets alone. Closing the generator early (the
    browser left) sets ``stop`` and waits for the run to end at its next event.
    """
    live, box = Live(), {}
    preps = [prep, *rivals]
    for rival in rivals:
        live.then(planned_lanes(plan, rival.model))
    deadline = time.perf_counter() + time_limit_s if time_limit_s else None

    def work() -> None:
        try:
            results: list = []
            for one in preps:
                if results and stop.is_set():
                    break
                left = None if deadline is None else max(deadline - time.perf_counter(), 1e-3)
                results += run_comparison(one.prompt_ids, one.pair, plan, max_new_tokens=one.max_new,
                                          seed=one.seed, should_stop=stop.is_set, time_limit_s=left,
                                          context=context, live=live, model=one.model if rivals else None)
            box["results"] = results
        except BaseException as exc:    # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=work, name="decoding-run", daemon=True)
    thread.start()
    last, shown = None, 0.0
    try:
        while thread.is_alive():
            thread.join(poll_s)
            if not thread.is_alive():
                break
            snap = live.snapshot()
            running = snap["running"] or {}
            sig = (len(snap["done"]), running.get("strategy"), running.get("warming"),
                   len(running.get("events") or ()))
            if sig != last or time.monotonic() - shown >= quiet_s:
                last, shown = sig, time.monotonic()
                yield "live", snap
    finally:
        if thread.is_alive():
            stop.set()
            thread.join()
    if "error" in box:
        raise box["error"]
    yield "done", box["results"]


def run_document(results: list, prep: Prepared, prompt: str, chat: bool,
                 generation: Optional[GenerationSettings] = None) -> tuple[dict, str]:
    """The trace document of a finished run (server paths redacted) and its status line."""
    rows = [r.to_dict() for r in results]
    for row in rows:
        row["error"] = row["error"] and redact_paths(row["error"])
    doc = {"environment": redact_all(environment(prep.pair, prep.seed)), "prompt": prompt, "chat": chat,
           "prompt_ids": prep.prompt_ids, "max_new_tokens": prep.max_new, "results": rows}
    if generation is not None:
        doc["generation"] = dataclasses.asdict(generation)
    failed = [r for r in rows if r["error"]]
    models = list(dict.fromkeys(r["model"] for r in rows if r.get("model"))) or [prep.model]
    message = f"Ran {len(rows)} strategies on {' and '.join(models)}{prep.note}."
    if failed:
        message += " " + "; ".join(f"{r['strategy']}: {r['error']}" for r in failed)
    return doc, message


CLI_KEYS = ("environment", "prompt", "chat", "prompt_ids", "max_new_tokens", "generation", "results")


def cli_document(doc: dict, generation: GenerationSettings) -> dict:
    """The document ``python -m decoding run --json`` writes, from a run's trace document (:func:`run_document`,
    or a recording of one): the same keys in the same order, ``generation`` always present as the CLI has it."""
    out = {key: doc[key] for key in CLI_KEYS[:5]}
    out["generation"] = doc.get("generation") or dataclasses.asdict(generation)
    out["results"] = doc["results"]
    return out


def history_outputs(rows: list[dict]) -> list[list[int]]:
    """Outputs a session's history keeps from a run: those of suffix runs that drafted from history."""
    return [list(r["token_ids"]) for r in rows if r.get("strategy") == "suffix" and not r.get("error")
            and (r.get("params") or {}).get("history") and r.get("token_ids")]


# --------------------------------------------------------------------------- what leaves the server
# a path starts with / or ~/ (not inside a word, a URL or a relative path, and not the / of a closing tag
# such as </script>, which is markup to escape, not a path to hide)
_PATH = re.compile(r"(?<![\w.:/~-])(?!(?<=<)/[A-Za-z][\w-]*>)(?:~/|/)(?!/)[^\s'\"<>()\[\],;]+")


def redact_paths(text: str) -> str:
    """Replace absolute file system paths (``/home/...``, ``~/...``) with ``[path]``; URLs stay."""
    return _PATH.sub("[path]", text)


def public_message(exc: BaseException) -> str:
    return redact_paths(str(exc))


def redact_all(value: Any) -> Any:
    """``value`` with every string in it passed through :func:`redact_paths` (an environment record)."""
    if isinstance(value, str):
        return redact_paths(value)
    if isinstance(value, dict):
        return {k: redact_all(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_all(v) for v in value]
    return value


# --------------------------------------------------------------------------- jobs and Stop flags
@dataclasses.dataclass
class _Ticket:
    session: str
    flag: threading.Event
    admitted: float
    running: bool = False


class Jobs:
    """The Stop flags of queued and running jobs, one ticket per job.

    ``admit`` runs when a job enters the queue (before it waits), ``start`` when
    it starts, ``finish`` when it ends. A Stop sets the flags of its session's
    tickets and creates nothing, so Stops from other sessions cannot push a
    running job's flag out, and a Stop pressed while the job waits is still set
    when it starts. Tickets of jobs that never start (their client left the
    queue) expire after ``queued_ttl_s``; beyond ``capacity`` the oldest waiting
    ticket goes first. Running tickets are never dropped before ``finish``.

    A session may hold ``per_session`` unstopped jobs; a waiting ticket stops
    counting after ``count_s`` (its client may have cancelled it in a way this
    table cannot see), so the bound is at most ``per_session`` new jobs per
    ``count_s`` while older ones still wait.
    """

    def __init__(self, per_session: int, capacity: int, queued_ttl_s: float, count_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.per_session, self.capacity, self.clock = per_session, capacity, clock
        self.queued_ttl_s, self.count_s = queued_ttl_s, count_s
        self._tickets: dict[int, _Ticket] = {}    # admission order
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._tickets)

    def _drop_stale(self) -> None:
        now = self.clock()
        for key in [k for k, t in self._tickets.items() if not t.running and now - t.admitted > self.queued_ttl_s]:
            del self._tickets[key]
        # over capacity: waiting tickets go oldest first, stopped ones (most likely cancelled) before the rest
        waiting = sorted((k for k, t in self._tickets.items() if not t.running),
                         key=lambda k: not self._tickets[k].flag.is_set())
        while len(self._tickets) >= self.capacity and waiting:
            del self._tickets[waiting.pop(0)]

    def admit(self, session: str) -> int:
        """A ticket for a job entering the queue; ValueError when the session has too many jobs."""
        with self._lock:
            self._drop_stale()
            now = self.clock()
            live = sum(1 for t in self._tickets.values() if t.session == session and not t.flag.is_set()
                       and (t.running or now - t.admitted <= self.count_s))
            if live >= self.per_session:
                raise ValueError(f"this session already has {live} jobs queued or running (the limit is "
                                 f"{self.per_session}); wait for one to finish or press Stop")
            key = next(self._ids)
            self._tickets[key] = _Ticket(session, threading.Event(), self.clock())
            return key

    def start(self, key: Optional[int], session: str) -> tuple[int, threading.Event]:
        """The job's ticket and Stop flag (kept set if Stop was pressed while it waited)."""
        with self._lock:
            ticket = self._tickets.get(key) if key is not None else None
            if ticket is None:     # not admitted through the queue (a direct call), or expired meanwhile
                self._drop_stale()
                key, ticket = next(self._ids), _Ticket(session, threading.Event(), self.clock())
                self._tickets[key] = ticket
            # the key travels server-side with the request; Gradio may name the session only now
            ticket.session, ticket.running = session, True
            return key, ticket.flag

    def finish(self, key: int) -> None:
        with self._lock:
            self._tickets.pop(key, None)

    def flag(self, key: Any) -> threading.Event:
        """The Stop flag of a started job (a fresh, unset one for a key this table does not hold)."""
        with self._lock:
            ticket = self._tickets.get(key) if isinstance(key, int) else None
            return ticket.flag if ticket is not None else threading.Event()

    def stop(self, session: str) -> tuple[int, int]:
        """Set the Stop flags of ``session``'s jobs; returns (running, waiting) counts."""
        with self._lock:
            mine = [t for t in self._tickets.values() if t.session == session]
            for t in mine:
                t.flag.set()
            running = sum(t.running for t in mine)
            return running, len(mine) - running
