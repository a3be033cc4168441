"""Per-model state lives on the loaded model (issue 28): evicting a model frees everything built for it.

The prophet head (which borrows the target's embeddings), the warm-up marks, the fast path's static runners
and the 4D-mask verdict hang on the ``LoadedModel``; a loaded model's ``uid`` is never reused. Loading,
running, evicting and loading again several times keeps memory bounded, and nothing outlives its model.
"""

from __future__ import annotations

import ctypes
import gc
import weakref

import pytest

from decoding.harness.runner import encode_prompt, run_comparison
from decoding.runtime import models
from decoding.runtime.head import prophet_for
from decoding.runtime.models import load_model
from decoding.runtime.pair import ModelPair

BUNDLED = "smollm2-135m-instruct"


def _rss_mb() -> float:
    """This process's resident MB after glibc gives its free heap back (``malloc_trim``): what freed models left in
    malloc's arenas is not a leak, and it moved with the tests a worker ran before (the whole suite under the AVX2
    caps once read 1263, 1723, 1833 MB after three evictions of a 1026 MB model). Live tensors cannot be trimmed."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):          # not glibc: RSS as it is
        pass
    with open("/proc/self/status", encoding="ascii") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024


@pytest.mark.bundled
def test_evicting_a_model_frees_its_head_marks_and_runners_and_reloading_stays_bounded():
    models.clear_model_cache()
    rss, uids, size = [], [], None
    for i in range(3):                  # a first load and two reloads: growth would show by the third
        lm = load_model(BUNDLED)
        size = size or models.model_bytes(lm) / 2**20
        head = prophet_for(lm)
        assert prophet_for(lm) is head and lm.state.prophet_head is head      # loaded once per model
        ids = encode_prompt(lm.tokenizer, "Name a colour.", chat=True)
        # the first model times its forward-cost curve for lookahead's automatic window (4/5 of a round's time),
        # and that curve must go with it too; the reloads name a window and skip the timing
        lookahead = {} if i == 0 else {"window": 2}
        results = run_comparison(ids, ModelPair(lm, prophet=head),
                                 [("prophet", {}), ("lookahead", lookahead), ("greedy", {"fast": True})],
                                 max_new_tokens=4)
        assert all(r.error is None for r in results)
        assert bool(lm.state.forward_cost) == (i == 0)                       # timed on the first model only
        assert {("prophet", False), ("lookahead", False), ("greedy", True)} <= \
            {key[1:] for key in lm.state.warmed}                                 # warm-up marks, on the model
        assert lm.state.fastpath_runners and lm.state.mask_support == "ok"
        uids.append(lm.uid)
        built = [lm, lm.model, head, lm.state.fastpath_runners[0][0], *lm.state.forward_cost.values()]
        alive = [weakref.ref(x) for x in built]
        del lm, head, results, built
        models.clear_model_cache()                                                   # evicted
        gc.collect()
        assert [r() is None for r in alive] == [True] * len(alive)                   # nothing outlives it
        rss.append(_rss_mb())
    assert len(set(uids)) == len(uids)                                               # a new model, a new uid
    print(f"\n[memory] RSS after each evict: {[round(r) for r in rss]} MB (model {size:.0f} MB)")
    assert max(rss) - rss[0] < 0.5 * size                                            # bounded, not growing


def test_warm_up_marks_are_per_loaded_model(tmp_path):
    """A mark names the assistant by uid: a new assistant (even at a reused address) is warmed up again."""
    from tiny_models import tiny_causal
    target, first, second = (tiny_causal("llama", seed=s, vocab=32, eos=False) for s in (1, 2, 3))
    runs = [("speculative", {"draft_tokens": 2})]
    run_comparison([1, 2, 3], ModelPair(target, first), runs, max_new_tokens=3, reference=False)
    run_comparison([1, 2, 3], ModelPair(target, second), runs, max_new_tokens=3, reference=False)
    assert {key[0] for key in target.state.warmed} == {first.uid, second.uid}
    assert not first.state.warmed                                                    # marks hang on the target


def test_the_cache_goes_under_the_name_this_transformers_takes():
    """transformers 5.24 renamed forward's ``past_key_values`` to ``cache`` (the old name warns and goes in
    5.40); older 5.x releases only know ``past_key_values``. Our forwards pass whichever the model takes."""
    import inspect
    import warnings

    import torch

    from decoding.runtime.kvcache import cache_kwarg
    from decoding.runtime.session import Session
    from tiny_models import tiny_causal

    class Old(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None, use_cache=None):
            return None
    assert cache_kwarg(Old()) == "past_key_values"
    lm = tiny_causal("llama")
    want = "cache" if "cache" in inspect.signature(type(lm.model).forward).parameters else "past_key_values"
    assert cache_kwarg(lm.model) == want
    session = Session(lm)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        session.prefill([3, 4, 5])
        session.forward(session.tensor([[6, 7]]))
    assert session.length == 5
