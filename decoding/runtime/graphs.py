"""Capture-or-replay: a region of tensor code run once per shape key, then replayed (CUDA graphs), or emulated.

A CUDA graph records the kernels a region launches and the addresses they read and write; a replay launches
them again on the same addresses. Whatever the region read from Python (an int, a fresh tensor made outside it)
is frozen at capture. The classic bug is a caller that passes a new tensor or value on a later call instead of
copying it into the static buffers the graph recorded: the replay silently reads the stale ones.

``Graphs`` runs such regions for the target's fast path (``runtime/fastpath.py``) and the prophet head's draft
steps (``runtime/headgraph.py``):

* on CUDA the first call of a key runs the region for real (the warm-up capture needs), then records it; later
  calls replay the recording and return the recorded outputs (overwritten in place);
* in emulation (``emulation()``, for the CPU) the first call of a key stores the region's closure and its
  outputs; every later call IGNORES the closure it is given and re-runs the STORED one, copying its results into
  the stored output tensors. A region that reads only static buffers gives the same results either way; one that
  baked a Python value or a caller's fresh tensor into its closure reads the first call's, as a graph would.
  A region that reads a tensor's value on the host (``.item()``, ``bool``, ``.tolist()``) or makes a tensor from
  host data raises ``HostReadInRegion`` (a capture would refuse the sync, or freeze the data);
* otherwise the region runs eagerly every time.

``captures`` and ``replays`` count what happened (a test asserts that regions were replayed, not re-run).
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from typing import Any, Callable, Iterator, Optional

import torch
from torch.overrides import TorchFunctionMode

# what a captured region must not do: read a device value on the host (a sync, which a CUDA capture refuses) or
# make a tensor from host data (frozen into the graph at capture)
_HOST_READS = (torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
               torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.cpu, torch.Tensor.numpy, torch.tensor,
               torch.as_tensor)


class HostReadInRegion(RuntimeError):
    """A region read a tensor's value on the host, or made a tensor from host data (emulation found it)."""


class _NoHostReads(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        if func in _HOST_READS:
            raise HostReadInRegion(f"{getattr(func, '__name__', func)} inside a captured region: a graph cannot "
                                   f"read device values on the host or take host data; copy it into a static "
                                   f"buffer outside the region, or keep it a tensor")
        return func(*args, **(kwargs or {}))


def _emulated(fn: Callable[[], Any]) -> Any:
    with _NoHostReads():
        return fn()


_EMULATE: contextvars.ContextVar[bool] = contextvars.ContextVar("emulate_graphs", default=False)


@contextlib.contextmanager
def emulation(on: bool = True) -> Iterator[None]:
    """Within this block (this thread or task), every uncaptured device's regions replay by emulation."""
    token = _EMULATE.set(on)
    try:
        yield
    finally:
        _EMULATE.reset(token)


def emulating() -> bool:
    return _EMULATE.get()


def _copy_into(stored: Any, fresh: Any) -> None:
    """Write ``fresh``'s tensors into ``stored``'s (the same nesting of tuples, lists and None)."""
    if isinstance(stored, torch.Tensor):
        if fresh.shape != stored.shape:
            raise RuntimeError(f"a replayed region gave a {tuple(fresh.shape)} output where it recorded "
                               f"{tuple(stored.shape)}: its shape depends on something outside its key")
        stored.copy_(fresh)
    elif isinstance(stored, (tuple, list)):
        for s, f in zip(stored, fresh):
            _copy_into(s, f)


class Graphs:
    """The regions captured on one device, by key, with their counters."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._pool = torch.cuda.graph_pool_handle() if self.cuda else None
        self._regions: dict[Any, tuple[Any, Any]] = {}    # key -> (CUDA graph or the stored closure, outputs)
        self.captures = 0
        self.replays = 0
        self.failed = False          # a region could not be captured: run eagerly from now on

    @property
    def active(self) -> bool:
        """Whether regions are captured (CUDA) or emulated (the CPU within ``emulation()``)."""
        return not self.failed and (self.cuda or emulating())

    def forget(self) -> None:
        self._regions.clear()

    def run(self, key: Any, fn: Callable[[], Any], eager: bool = False) -> Any:
        """``fn()``'s outputs: captured under ``key`` the first time, replayed afterwards (``eager``: just run)."""
        if eager or not self.active:
            return fn()
        entry = self._regions.get(key)
        if entry is not None:
            self.replays += 1
            if self.cuda:
                entry[0].replay()
            else:
                _copy_into(entry[1], _emulated(entry[0]))     # the stored closure, never the new one
            return entry[1]
        if not self.cuda:
            outputs = _emulated(fn)
            self._regions[key] = (fn, outputs)
            self.captures += 1
            return outputs
        return self._capture(key, fn)

    def _capture(self, key: Any, fn: Callable[[], Any]) -> Any:
        # First time for this key: run it for real on a side stream (the warm-up capture needs), then record the
        # same body into a graph. Recording executes nothing, so the state is exactly what the real run left.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            result = fn()
        torch.cuda.current_stream().wait_stream(side)
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                outputs = fn()
        except Exception:    # a region that cannot be captured keeps the uncaptured path
            self.failed = True
            return result
        self._regions[key] = (graph, outputs)
        self.captures += 1
        return result

    def __len__(self) -> int:
        return len(self._regions)

    def keys(self) -> list:
        return list(self._regions)



def admit(pool: list, free: list, owner: Any, make: Callable[[], Any], limit: int) -> Any:
    """A new runner ``make()`` for ``owner`` in ``pool`` (entries ``[runner, weak reference to its owner]``;
    ``free``: the entries whose owner is gone), or None when ``limit`` runners are busy. Free runners are dropped,
    oldest first, to make room. Shared by the target's runners (``fastpath``) and the head's (``headgraph``)."""
    if len(pool) - len(free) >= limit:
        return None
    while free and len(pool) >= limit:
        pool.remove(free.pop(0))
    runner = make()
    pool.append([runner, weakref.ref(owner)])
    return runner
