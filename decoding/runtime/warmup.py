"""Compile a model's CPU forward ahead of use (``runtime/compiled.py``), so no visitor's run pays for it."""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from decoding.runtime import compiled
from decoding.runtime.attention import tree_forward
from decoding.runtime.session import Session
from decoding.tree import TokenTree

WARM_WIDTHS = (1, 3, 9, 17, 40)                 # the causal forwards warm() runs (40: two chunks of ROWS)


def warm(lm: Any, widths: tuple = WARM_WIDTHS, hidden: Any = True,
         progress: Optional[Callable[[int, int], None]] = None) -> dict:
    """Compile ``lm``'s graphs ahead of use (after ``compiled.enable``); seconds per width, from the disk cache if warm.

    Runs one causal forward of each width after a short prefill, in a session of its own, so no visitor's
    run pays for a compilation. ``hidden`` as the prophet asks for it (a layer-fusion head: its tuple).
    """
    if compiled.engine(lm) is None:
        return {}
    session = Session(lm, "compile", fast=True, max_len=16 + sum(widths) + 4)
    session.hidden_layers = tuple(hidden) if isinstance(hidden, (tuple, list)) else ()
    first = lm.tokenizer.eos_token_id if lm.tokenizer is not None else None
    token = int(first if isinstance(first, int) else 1)
    session.prefill([token] * 8)
    took = {}
    steps = [(str(w), lambda w=w: session.forward(session.tensor([[token] * w]), hidden=bool(hidden)))
             for w in widths]
    # and a tree (a root with two children that do not see each other), which runs the same graph
    steps.append(("tree", lambda: tree_forward(session, [token], TokenTree((token,) * 3, (-1, 0, 0)),
                                               hidden=bool(hidden))))
    for i, (name, step) in enumerate(steps):
        t0 = time.perf_counter()
        step()
        took[name] = round(time.perf_counter() - t0, 2)
        if progress is not None:
            progress(i + 1, len(steps))
    return took
