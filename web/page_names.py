"""The page's run by name: the names of its inputs, in the order its ``/run`` event takes them, and of its views,
in the order it returns them. app.py builds the page from these names and web/page_client.py calls it by them, so
nothing outside this module counts positions.

Each strategy parameter's input is ``"strategy.field"`` (registry order), each generation setting's
``"generation.field"``; ``versus`` came last. ``RUN_VIEWS`` holds gr.State views too (``STATE_VIEWS``): those stay in
the visitor's session and are not among the API's outputs (``api_views``).
"""

from __future__ import annotations

from web.validation import GENERATION_FIELDS, param_fields

RUN_FIELDS = ("model", "assistant", "strategies", "prompt", "chat", "max_new_tokens", "seed")
SWEEP_INPUTS = ("model", "assistant", "prompt", "chat", "max_new_tokens", "seed", "sweep_strategy", "sweep_spec")
RUN_VIEWS = ("key", "step", "columns", "speed", "timeline", "sources", "download", "status", "histogram",
             "inspect_strategy", "jacobi", "lookahead_window", "lookahead_chart", "breakdown", "leviathan",
             "clock", "clock_readout", "tree", "lookahead_mask", "beam", "sampling", "drafts", "crosstok",
             "inspector", "share", "race_id")
STATE_VIEWS = frozenset({"key"})        # gr.State: kept in the session, never sent to a client
STEP_VIEWS = ("columns", "lookahead_window", "jacobi", "drafts", "crosstok")
STEP_FIGURES = ("tree", "lookahead_mask", "beam", "sampling")


def param_input(strategy: str, field: str) -> str:
    return f"{strategy}.{field}"


def generation_input(field: str) -> str:
    return f"generation.{field}"


def run_inputs() -> tuple[str, ...]:
    """The names of the run's inputs, in /run's order."""
    return (*RUN_FIELDS, *(param_input(s, f) for s, f in param_fields()),
            *(generation_input(name) for name in GENERATION_FIELDS), "versus")


def api_views() -> tuple[str, ...]:
    """The run's (and a trace import's) views as an API client gets them, in order: RUN_VIEWS less the gr.State."""
    return tuple(name for name in RUN_VIEWS if name not in STATE_VIEWS)
