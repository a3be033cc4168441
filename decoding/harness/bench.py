"""``python -m playground bench``: a Spec-Bench-style benchmark anyone can rerun.

For every prompt of a prompt set (``presets/prompts.yaml``, by category) it runs
our greedy baseline, every requested strategy and transformers' own
``generate`` anchors, interleaved in one process after a warm-up, untraced,
``--repeats`` times. It reports per category the median wall time, tok/s, the
speedup against our greedy (geometric mean over prompts), acceptance α, mean
tokens per target forward, the draft/target cost ratio and, for lossless
strategies, whether the tokens equal greedy's. Output: a table on stdout, and
optionally JSON, markdown and a plotly HTML report (with sweep heatmaps).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
import yaml

from decoding.drafting.universal import shares_tokenizer
from decoding.harness.runner import encode_prompt
from decoding.runtime.kvcache import cache_kwarg, crop_cache
from decoding.runtime.models import PRESETS_DIR, LoadedModel
from decoding.runtime.pair import ModelPair
from decoding.sampling import make_generator
from decoding.strategies import get_strategy
from decoding.tracer import NULL_TRACER

ANCHORS = ("hf_greedy", "hf_prompt_lookup", "hf_assisted")
FAST_GREEDY = "greedy[fast=true]"     # a second reference when the fast path is benchmarked


@dataclasses.dataclass(frozen=True)
class Method:
    """One thing to time: a strategy with parameters, or a transformers anchor."""
    name: str                       # display name, unique within a run
    strategy: Optional[str]         # registry name, None for anchors
    params: Any = None
    anchor: Optional[str] = None    # one of ANCHORS
    lossless: bool = False


def load_prompt_set(path: Path | None = None, categories: Sequence[str] | None = None,
                    per_category: int | None = None) -> list[tuple[str, str]]:
    """[(category, prompt text)] from a YAML mapping ``{category: [prompt | {prompt: ...}]}``.

    A category may name some of its prompts by 0-based index: ``code:2,4,7``.
    """
    with open(path or PRESETS_DIR / "prompts.yaml", encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    data = data.get("categories", data) if isinstance(data, dict) else {}
    picks: dict[str, Optional[list[int]]] = {}
    for spec in categories or []:
        name, _, index = spec.partition(":")
        try:
            picks[name] = [int(i) for i in index.split(",")] if index else None
        except ValueError:
            raise ValueError(f"--category {spec!r}: write NAME or NAME:I,J (0-based prompt indices)") from None
    out = []
    for category, items in data.items():
        if picks and category not in picks:
            continue
        items = list(items or [])
        chosen = [items[i] for i in picks[category] if 0 <= i < len(items)] if picks.get(category) else items
        for item in chosen[: per_category or None]:
            text = item.get("prompt") if isinstance(item, dict) else item
            if isinstance(text, str) and text.strip():
                out.append((category, text))
    if not out:
        raise ValueError(f"no prompts found for categories {list(categories or [])}")
    return out


def hf_generate(lm: LoadedModel, prompt_ids: list[int], max_new: int, **kwargs: Any) -> list[int]:
    """transformers' greedy ``generate``: new tokens only, cut after the first EOS."""
    ids = torch.tensor([prompt_ids], device=lm.device)
    with torch.inference_mode():
        out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                                do_sample=False, **kwargs)[0, len(prompt_ids):]
    tokens = out.tolist()
    eos = set(lm.eos_token_ids)
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


def _runner(method: Method, pair: ModelPair, max_new: int, seed: int,
            prompt_lookup_tokens: int) -> Callable[[list[int]], tuple[list[int], dict, int, int]]:
    """A function prompt_ids -> (tokens, stats, target forwards, draft forwards)."""
    if method.anchor == "hf_greedy":
        return lambda ids: (hf_generate(pair.target, ids, max_new), {}, 0, 0)
    if method.anchor == "hf_prompt_lookup":
        return lambda ids: (hf_generate(pair.target, ids, max_new,
                                         prompt_lookup_num_tokens=prompt_lookup_tokens), {}, 0, 0)
    if method.anchor == "hf_assisted":
        assisted: dict = {"assistant_model": pair.assistant.model}
        if not shares_tokenizer(pair.target, pair.assistant):   # transformers' Universal Assisted Decoding
            assisted.update(tokenizer=pair.target.tokenizer, assistant_tokenizer=pair.assistant.tokenizer)
        return lambda ids: (hf_generate(pair.target, ids, max_new, **assisted), {}, 0, 0)
    strategy = get_strategy(method.strategy)

    def run(ids: list[int]) -> tuple[list[int], dict, int, int]:
        res = strategy.generate(ids, pair, method.params, max_new_tokens=max_new, tracer=NULL_TRACER,
                                rng=make_generator(seed, pair.target.device))
        return res.token_ids, res.stats, res.target_forwards, res.draft_forwards
    return run


def width_logits(model: Any, prefix: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 logits of ``tokens [1, T]`` after ``prefix [1, P]``: from one forward over all T (as a verify
    forward computes them) and from T one-position forwards (as greedy does). Lossless drafting against a
    model's own greedy needs the two to agree far below the logit margins."""
    name = cache_kwarg(model)
    cache = model(prefix, use_cache=True).past_key_values
    wide = model(tokens, **{name: cache}, use_cache=True).logits[0].float()
    crop_cache(cache, prefix.shape[1])
    narrow = torch.stack([model(tokens[:, j:j + 1], **{name: cache}, use_cache=True).logits[0, -1].float()
                          for j in range(tokens.shape[1])])
    return wide, narrow


def weight_bytes(lm: LoadedModel) -> int:
    """Bytes of weights a decode step reads (each parameter once; tied embeddings counted once)."""
    return sum(p.numel() * p.element_size() for p in lm.model.parameters())


def measure_bandwidth(device: torch.device, megabytes: int = 1024, repeats: int = 10) -> Optional[float]:
    """Device memory bandwidth in bytes/s from a timed device-to-device copy (read + write), CUDA only."""
    if device.type != "cuda":
        return None
    n = megabytes * (1 << 20) // 4
    src = torch.empty(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    torch.cuda.synchronize(device)
    seconds = (time.perf_counter() - t0) / repeats
    del src, dst
    return 2 * n * 4 / seconds


def roofline(doc: dict, pair: ModelPair) -> None:
    """Add the memory-bandwidth bound: tok/s x bytes read per token / device bandwidth.

    A forward must read every weight once, so ``bandwidth / weight_bytes`` is the
    tok/s ceiling of one-token-per-forward decoding; ``bandwidth_fraction`` is a
    method's tok/s against that ceiling (above 1 only when a forward yields
    several tokens).
    """
    bw = measure_bandwidth(pair.target.device)
    wb = weight_bytes(pair.target)
    doc.setdefault("environment", {}).update({"weight_bytes": wb, "bandwidth_bytes_per_s": bw})
    if not bw:
        return
    ceiling = bw / wb
    doc["environment"]["greedy_tok_s_ceiling"] = ceiling
    for s in doc["summary"]:
        s["bandwidth_fraction"] = s["tok_s"] / ceiling if s.get("tok_s") else None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def geomean(values: Sequence[float]) -> float:
    vals = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else float("nan")


def run_bench(pair: ModelPair, prompts: list[tuple[str, str]], methods: list[Method], *,
              max_new_tokens: int, repeats: int = 3, seed: int = 0, chat: bool = True,
              prompt_lookup_tokens: int = 10,
              on_step: Optional[Callable[[], None]] = None) -> dict:
    """Time every method on every prompt; returns a JSON-ready document."""
    baseline = Method("greedy", "greedy", get_strategy("greedy").parse({}), lossless=True)
    methods = [baseline] + [m for m in methods if m.name != "greedy"]
    runs = {m.name: _runner(m, pair, max_new_tokens, seed, prompt_lookup_tokens) for m in methods}
    encoded = [(cat, text, encode_prompt(pair.target.tokenizer, text, chat=chat and pair.target.chat))
               for cat, text in prompts]
    for _, _, ids in encoded[:2]:  # 1. warm-up, untimed
        for run in runs.values():
            run(ids)
    rows = []
    for cat, text, ids in encoded:
        times: dict[str, list[float]] = defaultdict(list)
        outputs: dict[str, tuple] = {}
        for _ in range(repeats):  # 2. interleave methods so drift hits all alike
            for m in methods:
                _sync(pair.target.device)
                t0 = time.perf_counter()
                outputs[m.name] = runs[m.name](ids)
                _sync(pair.target.device)
                times[m.name].append(time.perf_counter() - t0)
                if on_step:
                    on_step()
        greedy_tokens = outputs["greedy"][0]
        base_s = statistics.median(times["greedy"])
        fast_s = statistics.median(times[FAST_GREEDY]) if FAST_GREEDY in times else None
        for m in methods:
            tokens, stats, tfwd, dfwd = outputs[m.name]
            wall = statistics.median(times[m.name])
            rows.append({
                "category": cat, "prompt": text[:80], "method": m.name, "tokens": len(tokens),
                "wall_s": wall, "tok_s": len(tokens) / wall if wall else 0.0,
                "speedup": (len(tokens) / wall) / (len(greedy_tokens) / base_s) if wall and greedy_tokens else None,
                "speedup_vs_fast_greedy": (len(tokens) / wall) / (len(outputs[FAST_GREEDY][0]) / fast_s)
                    if fast_s and wall and outputs[FAST_GREEDY][0] else None,
                "alpha": stats.get("alpha"), "tokens_per_target_forward":
                    stats.get("mean_tokens_per_target_forward", stats.get("step_compression",
                              len(tokens) / tfwd if tfwd else None)),
                "cost_ratio": stats.get("cost_ratio"), "target_forwards": tfwd, "draft_forwards": dfwd,
                "equals_greedy": (tokens == greedy_tokens) if (m.lossless or m.anchor in ANCHORS) else None,
            })
    return {"methods": [{"name": m.name, "strategy": m.strategy, "anchor": m.anchor,
                         "params": dataclasses.asdict(m.params) if m.params is not None else {}}
                        for m in methods],
            "rows": rows, "summary": summarize_rows(rows)}


def _mean(values: Sequence[Optional[float]]) -> Optional[float]:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return sum(vals) / len(vals) if vals else None


def summarize_rows(rows: list[dict]) -> list[dict]:
    """Per (category, method) and per method over all categories ("all")."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["category"], r["method"])].append(r)
        groups[("all", r["method"])].append(r)
    cats = list(dict.fromkeys(r["category"] for r in rows)) + ["all"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    ordered = [(c, m) for c in cats for m in methods if (c, m) in groups]
    out = []
    for cat, method in ordered:
        rs = groups[(cat, method)]
        eq = [r["equals_greedy"] for r in rs if r["equals_greedy"] is not None]
        out.append({"category": cat, "method": method, "prompts": len(rs),
                    "median_wall_s": statistics.median(r["wall_s"] for r in rs),
                    "tok_s": statistics.median(r["tok_s"] for r in rs),
                    "speedup_geomean": geomean([r["speedup"] for r in rs]),
                    "speedup_vs_fast_greedy": geomean([r.get("speedup_vs_fast_greedy") for r in rs]),
                    "alpha": _mean([r["alpha"] for r in rs]),
                    "tokens_per_target_forward": _mean([r["tokens_per_target_forward"] for r in rs]),
                    "cost_ratio": _mean([r["cost_ratio"] for r in rs]),
                    "equals_greedy": (f"{sum(eq)}/{len(eq)}" if eq else "-")})
    return out


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def markdown_table(summary: list[dict], category: str | None = None) -> str:
    cols = ["category", "method", "prompts", "median_wall_s", "tok_s", "speedup_geomean", "alpha",
            "tokens_per_target_forward", "cost_ratio", "equals_greedy"]
    rows = [s for s in summary if category is None or s["category"] == category]
    for extra in ("speedup_vs_fast_greedy", "bandwidth_fraction"):
        if any(_fmt(r.get(extra)) != "-" for r in rows):
            cols.insert(cols.index("alpha"), extra)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def parse_sweep(spec: str, *, max_keys: Optional[int] = None,
                max_points: Optional[int] = 4096) -> tuple[str, list[str], list[tuple]]:
    """``"lookahead:window=4,8;ngram=3,4"`` -> (strategy, keys, [value tuples]).

    The number of combinations is counted before any is built, so a short spec
    cannot ask for billions of them; a key may appear once, a value once per key.
    """
    import itertools
    if ":" not in spec:
        raise ValueError(f"--sweep expects STRATEGY:KEY=V1,V2[;KEY=...], got {spec!r}")
    strategy, rest = spec.split(":", 1)
    get_strategy(strategy.strip())
    keys: list[str] = []
    grids: list[list[str]] = []
    for part in rest.split(";"):
        if "=" not in part:
            raise ValueError(f"sweep part {part[:40]!r} must be KEY=V1,V2")
        key, values = (x.strip() for x in part.split("=", 1))
        grid = [v.strip() for v in values.split(",") if v.strip()]
        if key in keys:
            raise ValueError(f"sweep key {key[:40]!r} appears twice; list all its values once: {key[:40]}=V1,V2")
        if not grid:
            raise ValueError(f"sweep key {key[:40]!r} has no values")
        if len(set(grid)) < len(grid):
            raise ValueError(f"sweep key {key[:40]!r} lists a value twice")
        keys.append(key)
        grids.append(grid)
    if max_keys is not None and len(keys) > max_keys:
        raise ValueError(f"sweep at most {max_keys} parameters, got {len(keys)}")
    count = math.prod(len(g) for g in grids)
    if max_points is not None and count > max_points:
        raise ValueError(f"{count} combinations; the limit is {max_points}")
    return strategy.strip(), keys, list(itertools.product(*grids))


def sweep_points(doc: dict, sweeps: list[tuple[str, list[str], list[tuple]]]) -> list[dict]:
    overall = {s["method"]: s for s in doc["summary"] if s["category"] == "all"}
    out = []
    for strategy, keys, combos in sweeps:
        points = []
        for combo in combos:
            name = sweep_method_name(strategy, keys, combo)
            if name in overall:
                s = overall[name]
                points.append({"values": [sweep_value(v) for v in combo], "speedup": s["speedup_geomean"],
                               "tokens_per_target_forward": s["tokens_per_target_forward"]})
        out.append({"strategy": strategy, "keys": keys, "points": points})
    return out


def sweep_method_name(strategy: str, keys: list[str], combo: tuple) -> str:
    return f"{strategy}[" + ",".join(f"{k}={v}" for k, v in zip(keys, combo)) + "]"


def sweep_value(v: str) -> Any:
    try:
        f = float(v)
        return int(f) if f.is_integer() else f
    except ValueError:
        return v
