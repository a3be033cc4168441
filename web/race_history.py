"""The default race across starts of one machine: each quiet start's rounds kept, and pooled with the next start's.

One start races the page's default comparison against greedy in three rounds (``web/startup.timed_steps``), and
its verdicts (``decoding/harness/pays.py``) rest on them. A machine's starts differ by more than those rounds say:
under the AVX2 caps lookahead on the bug-fix example was judged 1.17 ± 0.06 greedy at one start (ticked), 0.98 at
the next (left out) and 1.08 at a third. So a start keeps its rounds here, and the next start on the same machine
judges every strategy on its own rounds pooled with the last ``KEEP_STARTS`` starts' (``harness/steps.pooled``),
and keeps the last start's tick where the pooled race is still too close to call (``pays.Verdict.previous``).
The prophet's step shapes, timed at each start to choose the one the page starts on, are pooled and kept the same
way (:meth:`RaceHistory.shapes`).

"The same machine" is the key (:func:`race_key`): the code and presets, torch and transformers, the CPU and its
threads (``web/settings.environment_digest``), the CPU's flags and its kernels' instruction set (the AVX2 caps
make another machine), the served config (version and mode), the default example and the race's length. A strategy's
earlier rounds count only with the same parameters (the prophet's shape): a start that chose another shape starts
that strategy's history anew. Only quiet starts are kept (the caller's rule: a start timed while others held the
cores keeps nothing). The file is the start's decision cache's neighbour (``routes.json``), written atomically.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from decoding.harness.examples import DEFAULT_EXAMPLE
from decoding.harness.steps import StepRatio, pooled
from decoding.runtime.cpu import cpu_fingerprint
from decoding.runtime.kernel_choice import read_entries, write_entries
from web.settings import environment_digest

VERSION = 1
KEEP_STARTS = 4        # the starts a verdict pools (the oldest dropped first)
KEEP_ENTRIES = 8       # machines (keys) kept in one file
SHAPE = "shape "       # the prophet's step shapes' timings are kept beside the race, each as this and its name


def race_key(config: str, tokens: int) -> dict:
    """This machine's key for the default race of the served ``config`` (``"preset"`` or ``"preset|compiled"``)
    at ``tokens`` tokens."""
    return {"environment": environment_digest(), "cpu_flags": cpu_fingerprint(), "config": config,
            "example": list(DEFAULT_EXAMPLE), "tokens": int(tokens)}


def _rounds(step: StepRatio) -> list[list[float]]:
    return [[round(float(x), 5) for x in r] for r in step.per_round]


def _starts(kept: Any) -> list[list[list[float]]]:
    """The kept starts of one strategy that are well formed (each a list of rounds of three positive numbers): a
    file edited by hand or cut short loses those starts, never the start's choice."""
    starts = kept.get("starts") if isinstance(kept, dict) else None
    ok = []
    for start in starts if isinstance(starts, list) else []:
        if isinstance(start, list) and start and all(
                isinstance(r, list) and len(r) == 3 and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                            and math.isfinite(x) and x > 0 for x in r)
                for r in start):
            ok.append(start)
    return ok


def _same(kept: Any, params: str) -> bool:
    return isinstance(kept, dict) and kept.get("params", "") == params


class RaceHistory:
    """The races kept for one key in ``path``: :meth:`pool` joins a start's races with the earlier ones,
    :meth:`record` keeps them with the strategies the start ticked."""

    def __init__(self, path: Path, key: Mapping[str, Any]) -> None:
        self.path, self.key = Path(path), dict(key)

    def _entry(self) -> dict:
        return next((e for e in read_entries(self.path, VERSION) if e.get("key") == self.key), {})

    def pool(self, raced: Mapping[str, StepRatio], params: Mapping[str, str]
             ) -> tuple[dict[str, StepRatio], dict[str, bool]]:
        """``raced`` (strategy -> this start's race) pooled with the earlier starts' races of each strategy at the
        same ``params`` (strategy -> its parameters, as text; absent: its defaults), and whether the last start
        ticked each (only where it raced it at the same parameters)."""
        earlier = self._entry().get("strategies")
        earlier = earlier if isinstance(earlier, dict) else {}
        out, ticked = {}, {}
        for name, step in raced.items():
            kept = earlier.get(name)
            starts = _starts(kept) if _same(kept, params.get(name, "")) else []
            out[name] = pooled(step, starts[-(KEEP_STARTS - 1):])
            if starts and isinstance(kept.get("ticked"), bool):
                ticked[name] = kept["ticked"]
        return out, ticked

    def shapes(self, steps: Mapping[str, StepRatio], names: Sequence[str]) -> dict[str, StepRatio]:
        """``steps`` with each of ``names`` (the prophet's step shapes this start timed) pooled with the earlier
        starts' timings of that shape, and this start's kept. The shape the page starts on then rests on the last
        starts, not on one start's sample: five starts on an AMD EPYC Zen 5 timed the 8-node tree's step at 1.87-2.08
        greedy steps, and three of them chose the 8-node tree, two the 4-node one."""
        timed = {SHAPE + name: steps[name] for name in names if name in steps and steps[name].per_round}
        if not timed:
            return dict(steps)
        joined, _ = self.pool(timed, {})
        self.record(timed, {}, ())
        return {**steps, **{name[len(SHAPE):]: step for name, step in joined.items()}}

    def record(self, raced: Mapping[str, StepRatio], params: Mapping[str, str], ticked: Any) -> None:
        """Keep this start's rounds of each raced strategy (after the earlier starts' at the same parameters, the
        newest ``KEEP_STARTS`` in all) and whether the start ticked it; a strategy this start did not race (its run
        failed) keeps its history. A file that cannot be written is left."""
        entries = read_entries(self.path, VERSION)
        old = next((e for e in entries if e.get("key") == self.key), {}).get("strategies")
        old = old if isinstance(old, dict) else {}
        strategies = {name: kept for name, kept in old.items() if name not in raced and _starts(kept)}
        for name, step in raced.items():
            if not step.per_round:
                continue
            kept = old.get(name)
            starts = (_starts(kept) if _same(kept, params.get(name, "")) else []) + [_rounds(step)]
            strategies[name] = {"params": params.get(name, ""), "starts": starts[-KEEP_STARTS:],
                                "ticked": name in ticked}
        entries = [e for e in entries if e.get("key") != self.key]
        entries.append({"key": self.key, "strategies": strategies, "raced_at": time.strftime("%Y-%m-%dT%H:%M:%S")})
        try:
            write_entries(self.path, VERSION, entries, KEEP_ENTRIES)
        except OSError:
            pass


def params_text(params: Mapping[str, Any]) -> str:
    """A strategy's parameters beyond its defaults as the history compares them (``{}``: the defaults)."""
    return json.dumps(dict(params), sort_keys=True) if params else ""


def history_for(file: Optional[Path], config: str, tokens: int) -> Optional[RaceHistory]:
    """The race history beside the start's decision file ``file`` (None: no file, none kept)."""
    return None if file is None else RaceHistory(Path(file).with_name("races.json"), race_key(config, tokens))
