"""Every place this app reaches into Gradio's internals, behind one door, with the Gradio they were written for.

``app.py`` and the rest of ``web/`` use Gradio's public API; what they need beyond it comes from here:

- :class:`GuardedBlocks` (the app's ``gr.Blocks``): ``postprocess_data`` answers the outputs a handler's dict
  leaves out without rebuilding each component (issue 25), and ``guard_temp_files`` swaps Gradio's sets of
  cached files for :class:`SnapshotSet` so its cache cleaner never dies of "Set changed size during iteration";
- the queue guard (``web/queue_guard.py``, re-exported here: :func:`install_queue_guard`, :class:`Health`,
  :func:`queue_health`): this app's queue instance keeps waiting sessions and restarts if it stops;
- :func:`api_endpoint`: ``gr.api`` with a queue validator, which ``gr.api`` does not take;
- :func:`plot_once`: a figure handed to Gradio already serialized (its ``PlotData``), so a view shared by
  every visitor is serialized once, not once per visitor;
- :class:`LeanSessionState`: a session's state without the copies of every component's config that Gradio keeps
  for deep links (this app offers none): a fresh session costs kilobytes, not 0.4 MB (issue 39);
- :func:`mark_missing`: a module Gradio imports around every event, not installed here, marked missing once.

Why it stays (no public setting does the job in gradio 6.31; each is a subclass, none patches Gradio globally):

- ``GuardedBlocks.postprocess_data``: Gradio has no way to skip the rebuild of outputs a handler leaves out;
- ``LeanSessionState``/``LeanStateHolder``: no setting turns off the deep-link copies, and the holder is made by
  Gradio's app, so the Blocks' setter is the only place to give it the lean class;
- ``SnapshotSet``: ``delete_cache`` is public but its cleaner walks live sets and dies of a concurrent add;
- ``api_endpoint``: ``gr.api`` takes no ``validator=``, and an event listener would lose the typed signature;
- ``plot_once``: ``gr.Plot`` serializes per visitor; a ``PlotData`` is the only value it passes through;
- the queue guard: Gradio's session table evicts sessions still waiting, and nothing public bounds it otherwise;
  its ``push`` names a call's session before the validator runs (Gradio would build a throwaway ``SessionState``);
- ``mark_missing``: Gradio imports matplotlib around every event, with no setting to stop it; a failed import
  searches ``sys.path`` each time.

Each was written against ``GRADIO_VERSION`` by reading that Gradio's source; ``SUPPORTED`` is the range they are
known to fit (``tests/test_gradio_overrides.py`` fails on any other Gradio, and checks that the Space's
``sdk_version`` in README.md is in it). ``tests/test_gradio_contracts.py`` checks what each override assumes of the
installed Gradio, whatever its version: it fails on the Gradio that breaks one, and says when one is no longer
needed. Moving to another Gradio: run it, read the lines each override names again, then widen ``SUPPORTED``.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import os
import sys
from typing import Any, Callable, Optional

import gradio as gr
import plotly.graph_objects as go
from gradio.components.plot import PlotData
from gradio.context import get_blocks_context
from gradio.state_holder import SessionState, StateHolder
from packaging.version import Version

from web.queue_guard import GuardedQueue, Health, queue_health  # noqa: F401  (re-exported: the one door)
from web.queue_guard import install as _install_queue

GRADIO_VERSION = "6.31.0"                 # the Gradio whose source these overrides were written against
SUPPORTED = ("6.31.0", "6.32")            # [from, to): its patch releases; a new minor needs them read again

log = logging.getLogger(__name__)


def supported(version: Optional[str] = None) -> bool:
    """Whether ``version`` (default: the installed Gradio) is one the overrides were written for."""
    v = Version(version or gr.__version__)
    return Version(SUPPORTED[0]) <= v < Version(SUPPORTED[1])


def _warn_unsupported() -> None:
    if not supported():
        log.warning("web/gradio_overrides.py was written for gradio %s (supported: >=%s, <%s); running on %s",
                    GRADIO_VERSION, *SUPPORTED, gr.__version__)


# --------------------------------------------------------------------------- the Blocks
class SnapshotSet(set):
    """A set whose iteration walks a copy taken under the GIL.

    Gradio's cache cleaner (``delete_cache``) iterates each component's set of cached files in a worker thread
    while requests add to it. One "Set changed size during iteration" ends its cleanup loop for the life of the
    server, and the cache then grows without bound: CI saw 33 copies left where 8 were allowed."""

    def __iter__(self):
        return iter(set.copy(self))


def left_out(block: Any) -> Any:
    """What Gradio 6.31 sends for an output left out of a handler's dict (HTML carries its extra props)."""
    if block.stateful:
        return None
    if isinstance(block, gr.HTML):
        return {"props": {"__type__": "update"}, "__type__": "update"}
    return {"__type__": "update"}


class LeanSessionState(SessionState):
    """Gradio's per-session state without ``config_values``.

    Gradio 6.31 (``state_holder.py``) builds, for every session it meets, the config of every component of the
    page (``config_for_block``, ~200 here) and then keeps a copy of each output value a handler returned (the
    race's HTML, the figures' JSON) in it. Only ``/gradio_api/deep_link`` reads them (``SessionState.components``,
    ``routes.py``), for ``gr.DeepLinkButton``, which this app does not use. Measured here: 0.41 MB per fresh
    session (1,600 Stops from new session ids: +650 MB). Everything else, the ``gr.State`` values and the
    components updated per session, is kept as Gradio keeps it."""

    def __init__(self, blocks: Any) -> None:      # SessionState.__init__ without its config_values
        self.blocks_config = copy.copy(blocks.default_config)
        self.config_values: dict = {}
        self.state_data: dict[int, Any] = {}
        self._state_ttl: dict = {}
        self.is_closed = False
        self.STATE_TTL_WHEN_CLOSED = 1 if os.getenv("GRADIO_IS_E2E_TEST", None) else 3600

    def __setitem__(self, key: int, value: Any) -> None:
        super().__setitem__(key, value)
        self.config_values.pop(key, None)

    def _update_config(self, key: int) -> None:
        return None

    def _update_value_in_config(self, key: int, value: Any) -> None:
        return None


class LeanStateHolder(StateHolder):
    """Gradio's ``StateHolder`` (same bound: ``state_session_capacity``, least recently used dropped first) whose
    sessions are :class:`LeanSessionState`."""

    def __getitem__(self, session_id: str) -> SessionState:
        if session_id not in self.session_data:
            self.session_data[session_id] = LeanSessionState(self.blocks)
        return super().__getitem__(session_id)


class GuardedBlocks(gr.Blocks):
    """``gr.Blocks`` with this app's overrides of its internals (the cached-file sets, ``postprocess_data``, lean
    session states); :func:`install` puts them and the queue guard on before ``launch``."""

    @property
    def state_holder(self) -> Any:
        return self.__dict__.get("_state_holder")

    @state_holder.setter
    def state_holder(self, holder: Any) -> None:
        """Gradio's app gives the Blocks its ``StateHolder`` (``StateHolder.set_blocks``, called once per launch
        by ``App.create_app``); the same object serves the routes, so its sessions become lean for both."""
        if type(holder) is StateHolder:
            holder.__class__ = LeanStateHolder
        self.__dict__["_state_holder"] = holder

    def guard_temp_files(self) -> int:
        """Swap every cached-file set for a :class:`SnapshotSet` (same contents, same sharing); returns how many."""
        swapped: list[tuple[set, SnapshotSet]] = []      # (Gradio's set, its replacement): one per shared set

        def safe(files: set) -> set:
            if isinstance(files, SnapshotSet):
                return files
            for old, new in swapped:
                if old is files:
                    return new
            swapped.append((files, SnapshotSet(files)))
            return swapped[-1][1]
        for block in self.blocks.values():
            if isinstance(getattr(block, "temp_files", None), set):
                block.temp_files = safe(block.temp_files)
        self.upload_file_set = safe(self.upload_file_set)
        self.temp_file_sets = [safe(files) for files in self.temp_file_sets]
        return len(swapped)

    async def postprocess_data(self, block_fn: Any, predictions: Any, state: Any) -> list:
        """Outputs a handler's dict leaves out are answered as Gradio answers them (``{"__type__": "update"}``,
        ``None`` for a state) without Gradio's rebuild of each such component and its config (about 1.5 ms
        apiece, gradio 6.31). A live-race frame leaves out 22 of the run's 24 outputs: with 16 visitors
        watching at five frames a second, those rebuilds took more of the server than the decoding did.
        The outputs given go through Gradio's own postprocessing."""
        outputs = list(block_fn.outputs)
        if not (isinstance(predictions, dict) and predictions and all(isinstance(k, gr.blocks.Block)
                                                                        for k in predictions)):
            return await super().postprocess_data(block_fn, predictions, state)
        given = {k._id for k in predictions}
        keep = [i for i, block in enumerate(outputs) if block._id in given]
        if len(keep) == len(outputs) or len(keep) != len(given):
            return await super().postprocess_data(block_fn, predictions, state)
        part = copy.copy(block_fn)
        part.outputs = [outputs[i] for i in keep]
        values = await super().postprocess_data(part, predictions, state)
        out: list = [left_out(block) for block in outputs]
        for i, value in zip(keep, values):
            out[i] = value
        return out


def install_queue_guard(blocks: Any) -> bool:
    """The queue guard on ``blocks``' queue (``web/queue_guard.py``); False when that queue is not one it fits."""
    _warn_unsupported()
    return _install_queue(blocks)


def install(blocks: GuardedBlocks) -> None:
    """Every override on ``blocks``, before ``launch``: the cached-file sets, then the queue guard."""
    blocks.guard_temp_files()
    install_queue_guard(blocks)
    mark_missing(PER_EVENT_IMPORTS)


# Gradio 6.31 imports matplotlib on entering and leaving every event (``utils.MatplotlibBackendMananger``, around
# ``route_utils.call_process_api``); this app does not install it, and a failed import searches every folder of
# ``sys.path`` again each time: about a third of the server's own time when 16 visitors replayed a recorded race.
PER_EVENT_IMPORTS = ("matplotlib",)


def mark_missing(names: tuple[str, ...]) -> list[str]:
    """Each of ``names`` that is not installed is marked missing in ``sys.modules`` (``None``: Python's own
    "not importable" mark), so importing it fails at once, as it would after searching; one that is installed is
    left alone. Returns the names marked."""
    marked = []
    for name in names:
        if name not in sys.modules and importlib.util.find_spec(name) is None:
            sys.modules[name] = None
            marked.append(name)
    return marked


# --------------------------------------------------------------------------- endpoints for code
def api_endpoint(fn: Callable, *, api_name: str, validator: Optional[Callable] = None, **kwargs: Any) -> Any:
    """``gr.api(fn, api_name=..., **kwargs)``: an endpoint whose parameters are ``fn``'s, named and typed by its
    signature. ``validator`` runs when a call enters the queue, as an event's ``validator=`` does; ``gr.api``
    has no such argument, so it is set on the endpoint's ``BlockFunction`` (read by ``Queue.push``, gradio 6.31
    ``queueing.py``). Call inside the Blocks."""
    dep = gr.api(fn, api_name=api_name, **kwargs)
    if validator is not None:
        get_blocks_context().fns[dep["id"]].validator = validator
    return dep


def plot_once(value: Any) -> Any:
    """A plotly figure serialized once, as ``gr.Plot.postprocess`` would (it passes a ``PlotData`` through,
    gradio 6.31 ``components/plot.py``): Gradio would serialize a shared figure again for every visitor."""
    return PlotData(type="plotly", plot=value.to_json()) if isinstance(value, go.Figure) else value
