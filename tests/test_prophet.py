"""Prophet draft head: losslessness (shipped and random weights), sampling exactness, weights, training."""

from __future__ import annotations

import json

import pytest
import torch
from test_speculative import _chi_square as chi_square
from test_speculative import _exact_model_distribution
from test_speculative import _passes as plausible

from decoding.drafting.prophet import ProphetDrafter
from decoding.harness.runner import encode_prompt
from decoding.params import GreedyParams, ProphetParams
from decoding.runtime.head import PROPHET_DIR, Prophet, ProphetConfig, load_prophet, prophet_for, save_prophet
from decoding.runtime.models import load_model
from decoding.runtime.pair import ModelPair
from decoding.sampling import make_generator
from decoding.strategies import get_strategy
from decoding.strategies.baselines import greedy
from decoding.strategies.speculative import prophet
from decoding.tracer import Tracer

from tiny_models import prompt, tiny_causal

F64 = torch.float64
SHIPPED = PROPHET_DIR / "smollm2-135m-instruct.safetensors"


pytestmark = pytest.mark.usefixtures("one_thread")   # conftest.py


def random_prophet(lm, seed=0, vocab_size=None, scale=1.0, context=True):
    """An untrained prophet with random weights over a random draft vocabulary."""
    torch.manual_seed(seed)
    n = vocab_size or lm.vocab_size
    vocab = torch.randperm(lm.vocab_size)[:n].sort().values
    head = Prophet(ProphetConfig.for_target(lm, context=context), lm, vocab)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.5 * scale)
    return head.eval()


def _greedy(pair, ids, n):
    return greedy(ids, pair, GreedyParams(), max_new_tokens=n).token_ids


def exactness_cases(arch):
    """(seed, pair, prompt, greedy's 30 tokens): two random heads (one over a 40-token draft vocabulary) on a
    tiny float64 model of ``arch``, two prompts each; the cases every tree exactness test runs."""
    target = tiny_causal(arch, seed=0, scale=8.0, dtype=F64)
    for seed, vocab_size in ((0, None), (1, 40)):
        pair = ModelPair(target, prophet=random_prophet(target, seed, vocab_size))
        for p in (prompt(5, seed=seed), prompt(9, seed=seed + 3)):
            yield seed, pair, p, _greedy(pair, p, 30)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gptneox"])
def test_random_prophet_chains_are_exact_on_tiny_models(arch):
    target = tiny_causal(arch, seed=0, scale=8.0, dtype=F64)
    for seed, vocab_size, context in ((0, None, True), (1, 40, True), (2, None, False)):
        pair = ModelPair(target, prophet=random_prophet(target, seed, vocab_size, context=context))
        for p in (prompt(5, seed=seed), prompt(9, seed=seed + 3)):
            want = _greedy(pair, p, 30)
            for k, adaptive, threshold in ((1, False, 0.0), (3, False, 0.0), (6, True, 0.0), (6, True, 0.4)):
                res = prophet(p, pair, ProphetParams(tree=False, draft_tokens=k, adaptive=adaptive,
                                                     confidence_threshold=threshold, lookup=False), max_new_tokens=30)
                assert res.token_ids == want, (arch, seed, k, threshold)
                copied = prophet(p, pair, ProphetParams(tree=False, draft_tokens=k, adaptive=adaptive,
                                                        confidence_threshold=threshold), max_new_tokens=30)
                assert copied.token_ids == want, (arch, seed, k, threshold, "the chain with its copy branch")
                assert res.stats["drafted"] > 0 and res.stats["drafted_nodes"] == res.stats["drafted"]
                if threshold:   # an unsure head computes a token, then stops without proposing it
                    assert res.draft_forwards >= res.stats["drafted"]
                else:
                    assert res.draft_forwards == res.stats["drafted"]


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gptneox"])
def test_random_prophet_trees_are_exact_on_tiny_models(arch):
    for seed, pair, p, want in exactness_cases(arch):
        want_doubled = _greedy(pair, p + p, 30)                # the prompt the lookup branch copies from
        for depth, topk, nodes, threshold in ((1, 1, 1, 0.0), (3, 2, 5, 0.0), (6, 4, 16, 0.0), (6, 3, 24, 0.2)):
            tracer = Tracer()
            res = prophet(p, pair, ProphetParams(draft_tokens=depth, tree_topk=topk, tree_nodes=nodes,
                                                 confidence_threshold=threshold, lookup=False),
                          max_new_tokens=30, tracer=tracer)
            assert res.token_ids == want, (arch, seed, depth, topk, nodes, threshold)
            merged = prophet(p + p, pair, ProphetParams(draft_tokens=depth, tree_topk=topk, tree_nodes=nodes,
                                                        confidence_threshold=threshold), max_new_tokens=30)
            assert merged.token_ids == want_doubled, ("with the lookup branch", arch, seed)
            steps = res.stats["steps"]
            assert res.stats["mean_nodes_per_step"] <= nodes
            assert res.draft_forwards <= steps * depth     # one head call per depth, every node of it batched
            trees = [e for e in tracer.events if type(e).__name__ == "DraftTree"]
            if topk > 1 and nodes > depth:
                assert trees and max(len(e.tokens) for e in trees) > max(len(set(e.parents)) for e in trees)
                assert all(e.mask_size == 1 + len(e.tokens) for e in trees)


def test_training_fits_the_target_chains_on_a_tiny_model(tmp_path):
    """A few hundred steps on the tiny target's own greedy chains: agreement with the target rises."""
    from playground import train_prophet as tp
    target = tiny_causal("llama", seed=0, scale=8.0)
    records = []
    with torch.no_grad():
        for s in range(24):
            ids = torch.tensor([prompt(4, seed=100 + s)])
            out = target.model.generate(ids, max_new_tokens=12, do_sample=False, output_hidden_states=True,
                                        return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
            hid = torch.cat([out.hidden_states[0][-1][:, -1:]] + [h[-1] for h in out.hidden_states[1:]], 1)
            records.append({"tokens": out.sequences[0, 4:], "hidden": hid[0].half()})
    args = tp.parse_args(["--steps", "150", "--batch", "4", "--eval-every", "150", "--lr", "3e-3"])
    vocab = tp.draft_vocabulary(records, 64, (2,))
    head = Prophet(ProphetConfig.for_target(target), target, vocab)
    data = tp.Answers(records, 3)
    before = tp.evaluate(head, data)
    tp.train(head, data, data, args, out_dir=tmp_path)
    after = tp.evaluate(head, data)
    assert after["top1"][0] > before["top1"][0] + 0.3, (before, after)
    assert after["alpha"][3] > before["alpha"][3] + 0.2, (before, after)
    assert (tmp_path / "checkpoint.pt").is_file()


def test_sampling_with_a_random_prophet_matches_the_target_distribution(prefill_once):
    """3-token outputs of the real loop (filters on; q_draft is 0 outside the draft vocabulary)
    against the exactly enumerated target distribution."""
    vocab, ids, n_out, n = 6, [1, 3, 4], 3, 3000
    target = tiny_causal("llama", seed=0, vocab=vocab, eos=False, scale=2.0)
    head = random_prophet(target, seed=3, vocab_size=4, scale=4.0)
    pair = ModelPair(target, prophet=head)
    params = ProphetParams(temperature=0.8, top_k=5, top_p=0.95, draft_tokens=2)
    exact = _exact_model_distribution(target, ids, n_out, params)
    gen = make_generator(5)
    counts: dict[tuple, int] = {}
    drafted = 0
    for _ in range(n):
        res = prophet(ids, pair, params, max_new_tokens=n_out, rng=gen)
        drafted += res.stats["drafted"]
        key = tuple(res.token_ids)
        counts[key] = counts.get(key, 0) + 1
    assert drafted >= n    # every run verified at least one prophet token
    stat, dof = chi_square(counts, exact, n)
    assert plausible(stat, dof), (stat, dof)


def test_drafter_needs_the_hidden_state_and_traces_without_changing_tokens():
    target = tiny_causal("llama", seed=0, scale=8.0, dtype=F64)
    head = random_prophet(target)
    drafter = ProphetDrafter(head, ProphetParams())
    assert drafter.needs_hidden and drafter.propose([1, 2, 3], 4).tokens == []   # no hidden state yet
    pair = ModelPair(target, prophet=head)
    p = prompt(6, seed=2)
    for tree, kind in ((False, "DraftProposed"), (True, "DraftTree")):
        plain = prophet(p, pair, ProphetParams(draft_tokens=3, tree=tree), max_new_tokens=20)
        tracer = Tracer()
        traced = prophet(p, pair, ProphetParams(draft_tokens=3, tree=tree), max_new_tokens=20, tracer=tracer)
        assert traced.token_ids == plain.token_ids
        kinds = {type(e).__name__ for e in tracer.events}
        assert {kind, "TokenVerified", "ForwardPass", "Distribution", "CorrectionToken"} <= kinds
        assert any(getattr(e, "source", "") == "prophet" for e in tracer.events)


def test_registry_params_and_missing_weights_error():
    s = get_strategy("prophet")
    assert s.lossless and not s.needs_assistant
    with pytest.raises(ValueError, match="draft_tokens"):
        ProphetParams(draft_tokens=0)
    target = tiny_causal("llama", seed=0)
    with pytest.raises(ValueError, match="no prophet head is shipped for target .tiny-llama."):
        prophet_for(target)


def test_save_and_load_round_trip(tmp_path):
    target = tiny_causal("llama", seed=0)
    head = random_prophet(target, vocab_size=50)
    path = tmp_path / "p.safetensors"
    save_prophet(head, path)
    again = load_prophet(path, target)
    assert json.loads((tmp_path / "config.json").read_text())["hidden"] == 64
    assert torch.equal(again.vocab, head.vocab)
    assert again.config.context and again.config == head.config
    # load_prophet packs the CPU kernels; the packed copies must stay out of the saved state
    assert set(again.state_dict()) == set(head.state_dict())
    save_prophet(again, tmp_path / "again.safetensors")
    assert torch.equal(load_prophet(tmp_path / "again.safetensors", target).vocab, head.vocab)
    h = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(0))
    tok = torch.tensor([[3, 4, 7, 8, 9], [5, 6, 1, 2, 3]])
    a, _ = head.forward_train(h, tok, 3)
    b, _ = again.forward_train(h, tok, 3)
    # fp16 storage, and fp16 draft weights on the CPU: rounding compounds over the unrolled steps, but stays
    # far below what a wrong or shuffled weight gives (differences of the logits' own size, ~0.5)
    assert (a - b).abs().mean() < 0.01 and (a - b).abs().max() < 0.15


@pytest.mark.parametrize("context", [True, False])
def test_training_forward_sees_exactly_what_the_drafter_sees(context):
    """Every anchor and draft step of the parallel training forward equals the incremental drafter path:
    committed pairs fed in chunks (as verify forwards deliver them), then draft steps over a scratch cache."""
    target = tiny_causal("llama", seed=0, scale=8.0, dtype=F64)
    head = random_prophet(target, seed=4, context=context).to(F64)
    torch.manual_seed(1)
    h, tok = torch.randn(1, 12, 64, dtype=F64), torch.randint(0, target.vocab_size, (1, 12))
    with torch.no_grad():
        _, feats = head.forward_train(h, tok, 4)                     # [1, D, S, H]
        state = head.new_state()
        start = 0
        for end in (1, 5, 8, 9):                                    # chunks of 1, 4, 3 and 1 committed pairs
            g = head.extend(state, h[0, start:end], tok[0, start:end])
            anchor = end - 1
            assert torch.allclose(feats[0, 0, anchor], g[0], atol=1e-9)
            scratch = head.new_scratch()
            for j in range(1, 4):
                g = head.draft_step(state, scratch, g, tok[0, anchor + j: anchor + j + 1], j)
                assert torch.allclose(feats[0, j, anchor], g[0], atol=1e-9), (anchor, j)
            start = end
        assert state.n == 9


def test_context_changes_the_draft_and_old_weights_still_load(tmp_path):
    """The context head reads earlier committed pairs; a config without the field (older weights) has none."""
    target = tiny_causal("llama", seed=0, scale=8.0)
    head = random_prophet(target, seed=5)
    h, tok = torch.randn(1, 6, 64), torch.randint(0, target.vocab_size, (1, 6))
    with torch.no_grad():
        full = head.extend(head.new_state(), h[0], tok[0])
        alone = head.extend(head.new_state(), h[0, -1:], tok[0, -1:])
    assert not torch.allclose(full, alone, atol=1e-3)
    old = ProphetConfig(**{k: v for k, v in head.config.to_dict().items() if k != "context"})
    assert old.context is False


# --------------------------------------------------------------------------- the bundled model

@pytest.fixture(scope="module")
def bundled():
    return load_model("smollm2-135m-instruct")


# A prompt of no benchmark and no training source (the shipped head is trained on self-written prompts now)
FIXED = "Write a Python function that checks whether a number is prime."
# A reply that restates the prompt's function (the copy branch's prompt)
COPY_PROMPT = "Add a docstring to this function:\n\ndef area(width, height):\n    return width * height\n"
REPEAT_PROMPT = "Repeat this sentence twice: The quick brown fox jumps over the lazy dog."
LONGEST = 48            # the most tokens a test below asks of one prompt


class ShippedRuns:
    """The bundled model's greedy tokens and the shipped head's runs, made once per module: several tests read
    the same run (each asserting its own thing) and never change it."""

    def __init__(self, lm):
        self.lm, self.wants, self.runs = lm, {}, {}

    def ids(self, text):
        return encode_prompt(self.lm.tokenizer, text, chat=True)

    def want(self, text, n):
        """Greedy's first ``n`` tokens of the chat prompt ``text`` (one greedy run of LONGEST per prompt)."""
        if text not in self.wants:
            self.wants[text] = _greedy(ModelPair(self.lm), self.ids(text), max(n, LONGEST))
        return self.wants[text][:n]

    def __call__(self, text, n, fresh=False, **kw):
        """The shipped head's run of ``n`` tokens with ``ProphetParams(**kw)``, checked against greedy;
        ``fresh``: run again and keep nothing (under a patched drafter or head, or the second of two runs)."""
        params = ProphetParams(**kw)
        key = (text, n, repr(params))
        if fresh or key not in self.runs:
            res = prophet(self.ids(text), ModelPair(self.lm, prophet=prophet_for(self.lm)), params, max_new_tokens=n)
            assert res.token_ids == self.want(text, n), (text, kw)
            if fresh:
                return res
            self.runs[key] = res
        return self.runs[key]


@pytest.fixture(scope="module")
def shipped_run(bundled):
    return ShippedRuns(bundled)


def test_shipped_weights_are_small_and_load(bundled):
    assert SHIPPED.is_file(), "presets/prophet/smollm2-135m-instruct.safetensors is missing"
    assert SHIPPED.stat().st_size <= 20 * 2**20
    head = prophet_for(bundled)
    assert head.config.hidden == 576 and 0 < len(head.vocab) <= 8192
    assert {"embed", "head"}.isdisjoint(dict(head.named_parameters()))   # frozen pieces are borrowed


def test_bundled_model_prophet_equals_greedy_with_shipped_and_random_weights(bundled, shipped_run):
    shipped = shipped_run(FIXED, 24, draft_tokens=4)            # checked against greedy's tokens
    assert shipped.stats["accepted"] > 0         # the trained head does predict the target
    pair = ModelPair(bundled, prophet=random_prophet(bundled, vocab_size=2000))
    res = prophet(shipped_run.ids(FIXED), pair, ProphetParams(draft_tokens=3), max_new_tokens=24)
    assert res.token_ids == shipped_run.want(FIXED, 24)


@pytest.fixture
def keep_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)      # --threads 1 below must not slow the rest of the session


def test_training_command_smoke(tmp_path, keep_threads):
    from playground.train_prophet import main
    out = tmp_path / "out"
    summary = main(["--data-dir", str(tmp_path / "data"), "--out-dir", str(out), "--prompts", "3",
                    "--gen-batch", "3", "--max-new", "6", "--steps", "2", "--batch", "4", "--eval-every", "1",
                    "--depth", "2", "--vocab", "64", "--held-out", "0.34", "--threads", "1",
                    "--export", str(tmp_path / "w" / "p.safetensors")])
    assert summary["steps_done"] == 2 and summary["train_tokens"] > 0
    from playground.train_prophet import bf16_is_native
    assert summary["bf16"] is bf16_is_native(torch.device("cpu"))   # default: only where bf16 GEMMs are native
    assert set(summary["alpha"]) == {1, 2} and len(summary["top1"]) == 2
    assert (out / "checkpoint.pt").is_file() and (tmp_path / "w" / "p.safetensors").is_file()
    resumed = main(["--data-dir", str(tmp_path / "data"), "--out-dir", str(out), "--skip-data", "--resume",
                    "--steps", "3", "--batch", "4", "--eval-every", "1", "--depth", "2", "--held-out", "0.34",
                    "--threads", "1"])
    assert resumed["steps_done"] == 3


def test_bf16_autocast_is_on_by_default_only_where_it_is_native(monkeypatch):
    """On an AVX2-only CPU a bfloat16 GEMM falls back to a reference loop (a training step took 13.8 s
    instead of 0.4 s): the default follows the hardware, an explicit flag wins."""
    from playground import train_prophet
    assert train_prophet.parse_args([]).bf16 is None
    assert train_prophet.parse_args(["--bf16"]).bf16 is True and train_prophet.parse_args(["--no-bf16"]).bf16 is False
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False, raising=False)
    assert train_prophet.bf16_is_native(torch.device("cpu")) is False
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True, raising=False)
    assert train_prophet.bf16_is_native(torch.device("cpu")) is True


def test_training_continues_a_shipped_head_on_fresh_prompts(tmp_path, keep_threads, monkeypatch):
    """--init-from starts from an exported head (its weights, config and draft vocabulary, not the
    target's layers or a vocabulary rebuilt from the new data); --prompt-offset skips the prompts an
    earlier round used."""
    from safetensors.torch import load_file

    from playground import train_prophet
    from decoding.runtime.models import load_model
    first = tmp_path / "w" / "p.safetensors"
    common = ["--out-dir", str(tmp_path / "out"), "--gen-batch", "3", "--max-new", "6", "--batch", "4",
              "--eval-every", "1", "--depth", "2", "--held-out", "0.34", "--threads", "1"]
    train_prophet.main(["--data-dir", str(tmp_path / "d1"), "--prompts", "3", "--steps", "1", "--vocab", "64",
                        "--export", str(first)] + common)
    shipped = load_file(str(first))
    ckpt = train_prophet.initial_checkpoint(first, load_model(train_prophet.parse_args([]).target))
    assert torch.equal(ckpt["vocab"], shipped["draft_vocab"]) and ckpt["step"] == 0
    assert all(torch.equal(v, shipped[k].float()) for k, v in ckpt["model"].items())

    seen: list[list[str]] = []
    real = train_prophet.generate_data
    monkeypatch.setattr(train_prophet, "generate_data", lambda lm, prompts, *a, **k: (seen.append(prompts),
                                                                                       real(lm, prompts, *a, **k)))
    second = tmp_path / "w2" / "p.safetensors"
    train_prophet.main(["--data-dir", str(tmp_path / "d2"), "--prompts", "3", "--prompt-offset", "3",
                        "--steps", "1", "--init-from", str(first), "--export", str(second)] + common)
    assert seen == [train_prophet.build_prompts(6)[3:]]
    assert set(seen[0]).isdisjoint(train_prophet.build_prompts(3))
    again = load_file(str(second))
    assert torch.equal(again["draft_vocab"], shipped["draft_vocab"])        # kept, not rebuilt (default 4096)
    assert any(not torch.equal(again[k], shipped[k]) for k in shipped if k != "draft_vocab")   # it trained
    with pytest.raises(SystemExit, match="pick one"):
        train_prophet.main(["--data-dir", str(tmp_path / "d2"), "--skip-data", "--resume", "--steps", "2",
                            "--init-from", str(first)] + common)
    with pytest.raises(SystemExit, match="no such file"):
        train_prophet.main(["--data-dir", str(tmp_path / "d2"), "--skip-data", "--steps", "2",
                            "--init-from", str(tmp_path / "missing.safetensors")] + common)


def test_training_prompts_never_include_the_benchmark_prompts():
    # the benchmark's chat prompts are held out: training prompts come from our own templates only
    import yaml

    from decoding.runtime.models import PRESETS_DIR
    from playground.train_prophet import build_prompts
    sets = yaml.safe_load((PRESETS_DIR / "prompts.yaml").read_text(encoding="utf-8"))
    bench = {p if isinstance(p, str) else str(p) for prompts in sets.values() for p in prompts}
    assert len(bench) >= 40
    assert bench.isdisjoint(build_prompts(2000))


def test_rotary_angles_are_computed_in_float32_under_bfloat16():
    """Training runs under bfloat16 autocast: a bfloat16 angle at position ~100 would be off by up to
    0.25 rad, so the rotation the head learns would not be the one the float32 drafter applies."""
    from decoding.runtime.head import _rotate
    torch.manual_seed(0)
    x = torch.randn(1, 2, 3, 64)
    pos = torch.tensor([97, 101, 203])
    want = _rotate(x.double(), pos, 10000.0)
    got = _rotate(x.bfloat16(), pos, 10000.0).double()
    assert (got - want).abs().max() < 0.05


# --------------------------------------------------------------------------- the shipped head's speed features

def test_shipped_head_reads_the_hidden_states_and_its_vocabulary_map(bundled, shipped_run, monkeypatch):
    """Measured on this prompt: 3.6 tokens per target forward; a head fed zeros instead of the target's states
    falls to 1.5, one with its draft-vocabulary map off by one to 1.05 (each still exact)."""
    good = shipped_run(FIXED, 40, lookup=False).stats["mean_tokens_per_target_forward"]
    assert good >= 2.5
    original = ProphetDrafter.observe
    monkeypatch.setattr(ProphetDrafter, "observe", lambda self, h, t: original(self, torch.zeros_like(h), t))
    blind = shipped_run(FIXED, 40, fresh=True, lookup=False).stats["mean_tokens_per_target_forward"]
    monkeypatch.setattr(ProphetDrafter, "observe", original)
    head = prophet_for(bundled)
    monkeypatch.setattr(head, "vocab", head.vocab + 1)
    shifted = shipped_run(FIXED, 40, fresh=True, lookup=False).stats["mean_tokens_per_target_forward"]
    assert blind <= good - 1.0 and shifted <= good - 1.0, (good, blind, shifted)


def test_the_tree_accepts_more_per_forward_than_the_chain(shipped_run):
    tree, chain = shipped_run(FIXED, 40, lookup=False), shipped_run(FIXED, 40, tree=False)
    assert tree.stats["mean_tokens_per_target_forward"] >= chain.stats["mean_tokens_per_target_forward"] + 0.2
    assert tree.target_forwards < chain.target_forwards
    assert tree.stats["mean_nodes_per_step"] > tree.stats["gamma"]        # it really branched


def test_raising_the_confidence_threshold_drafts_fewer_tokens(shipped_run):
    """From the default threshold (0.1) to 0.6: the runs at 0.1 are the tree and chain tests' own."""
    low = shipped_run(FIXED, 40, tree=False)
    high = shipped_run(FIXED, 40, tree=False, confidence_threshold=0.6)
    assert high.stats["drafted"] <= low.stats["drafted"] * 0.75, (low.stats["drafted"], high.stats["drafted"])
    low_t = shipped_run(FIXED, 40, lookup=False)
    high_t = shipped_run(FIXED, 40, confidence_threshold=0.6, lookup=False)
    assert high_t.stats["gamma"] < low_t.stats["gamma"]                 # shallower trees


@pytest.mark.parametrize("source", ["suffix", "prompt"])
def test_the_lookup_branch_saves_target_forwards_where_the_reply_copies_the_prompt(shipped_run, source):
    alone = shipped_run(REPEAT_PROMPT, 40, lookup=False)           # one run for both sources
    merged = shipped_run(REPEAT_PROMPT, 40, lookup_source=source)
    # the 10-token reply takes the (GPU-trained) head alone 6 forwards; the lookup branch must save at least 2
    assert merged.target_forwards <= alone.target_forwards - 2, (merged.target_forwards, alone.target_forwards)


def test_a_chain_drafts_the_copy_branch_beside_it_where_the_target_verifies_trees(shipped_run, monkeypatch):
    """A chain (what a steep CPU curve chooses) gets the copy branch too: the restated function lands in fewer
    target forwards than the chain alone (``lookup=false``), one step accepting more than the chain's 1-token
    depth, and the output is greedy's (``shipped_run`` checks). Where the target cannot verify a tree the chain
    stays a chain: a drafter that merged there would hand the loop a tree it cannot verify."""
    from decoding import drafting
    from decoding.drafting.merged import MergedDrafter
    copied = shipped_run(COPY_PROMPT, 48, tree=False, draft_tokens=1)
    alone = shipped_run(COPY_PROMPT, 48, tree=False, draft_tokens=1, lookup=False)
    assert max(copied.stats["accepted_lengths"]) > 1 and max(alone.stats["accepted_lengths"]) <= 1
    assert copied.target_forwards < alone.target_forwards - 4, (copied.target_forwards, alone.target_forwards)
    pair = ModelPair(shipped_run.lm, prophet=prophet_for(shipped_run.lm))
    chain = ProphetParams(tree=False, draft_tokens=1)
    assert isinstance(drafting.make_drafter("prophet", pair, chain), MergedDrafter)
    monkeypatch.setattr(drafting, "_trees_ok", lambda pair: False)
    assert not isinstance(drafting.make_drafter("prophet", pair, chain), MergedDrafter)
    assert isinstance(drafting.make_drafter("prophet", pair, ProphetParams()), MergedDrafter)   # a tree keeps it


@pytest.mark.parametrize("source", ["suffix", "prompt"])
def test_the_copy_branch_lands_a_copy_longer_than_the_heads_depth_in_one_step(shipped_run, source):
    """``lookup_tokens`` (16) lets the copy branch run past the head's 6-token depth; capped at the depth, no
    step can accept more than 6 drafted tokens (the reply restates the function: one step takes 9 at once)."""
    deep = shipped_run(COPY_PROMPT, 48, lookup_source=source)
    capped = shipped_run(COPY_PROMPT, 48, lookup_source=source, lookup_tokens=6)
    assert max(capped.stats["accepted_lengths"]) <= 6
    assert max(deep.stats["accepted_lengths"]) > 6, deep.stats["accepted_lengths"]
    assert deep.target_forwards < capped.target_forwards


def test_the_suffix_copy_branch_keeps_no_history_between_runs(shipped_run):
    """The branch copies from this run's prompt and output only: a second identical run drafts exactly as the
    first (a history of earlier runs would let it copy the whole answer, docstring included, and would leak one
    visitor's output into another's drafts). The first is the copy tests' run with the defaults."""
    first = shipped_run(COPY_PROMPT, 48)
    second = shipped_run(COPY_PROMPT, 48, fresh=True)
    assert first.token_ids == second.token_ids
    assert first.stats["accepted_lengths"] == second.stats["accepted_lengths"]


def test_a_packed_heads_float16_products_run_on_the_projects_kernel():
    """Where the project's float16 kernel builds (``kernels.own_half``), every product of a packed head runs on it,
    not FBGEMM's (1.2-1.4x faster at the head's row counts; BENCHMARKS.md): counted in the profiler, and the drafts
    match the plain head's to float16's rounding."""
    from decoding.runtime import kernels
    target = tiny_causal("llama", seed=0, scale=8.0)
    plain, packed = random_prophet(target, seed=4), random_prophet(target, seed=4)
    if not kernels.half_available() or not kernels.own_half():
        pytest.skip("no float16 kernel of the project's on this build")
    assert packed.pack() > 0 and packed.kernels == "fp16-weights"
    halves = [m for m in [packed._packed_head, *vars(packed.layers[0]).values(), *packed.modules()]
              if isinstance(m, kernels.HalfLinear)]
    assert halves and all(m.own for m in halves)
    torch.manual_seed(2)
    h, tok = torch.randn(5, 64), torch.randint(0, target.vocab_size, (5,))
    with torch.no_grad(), torch.profiler.profile() as prof:
        feats = packed.extend(packed.new_state(), h, tok)
        logits = packed.draft_logits(feats)
    calls = {e.key: e.count for e in prof.key_averages()}
    assert calls.get("decoding_attention::half_linear", 0) == 2 + 4 * len(packed.layers), calls
    assert not any("linear_dynamic_fp16" in key for key in calls)
    with torch.no_grad():
        want = plain.extend(plain.new_state(), h, tok)
        want_logits = plain.draft_logits(want)
    assert torch.allclose(feats, want, rtol=2e-2, atol=2e-2)
    assert torch.allclose(logits, want_logits, rtol=2e-2, atol=5e-2)


@pytest.mark.parametrize("bad, message", [({"lookup_source": "history"}, "lookup_source must be one of suffix, prompt"),
                                          ({"lookup_tokens": 0}, "lookup_tokens"),
                                          ({"lookup_tokens": 33}, "lookup_tokens")])
def test_the_copy_branch_parameters_are_validated(bad, message):
    with pytest.raises(ValueError, match=message):
        ProphetParams(**bad)


def test_a_packed_head_joins_its_products_and_writes_its_cache_in_place(monkeypatch):
    """On the CPU kernels (``Prophet.pack``) a draft position costs ``1 + 4 * layers`` products (the fusion,
    then q|k|v, o, gate|up and down per layer) instead of ``1 + 7 * layers``, drafts what the plain head drafts
    (to the reduced weights' rounding), and a draft step writes its keys into the state's buffers in place: the
    committed rows are neither copied nor changed."""
    from decoding.runtime import kernels
    target = tiny_causal("llama", seed=0, scale=8.0)
    plain, packed = random_prophet(target, seed=4), random_prophet(target, seed=4)
    if not packed.pack():
        pytest.skip("no reduced-weight kernels on this build")
    products = []
    for cls in (kernels.HalfLinear, kernels.PackedLinear):
        original = cls.forward
        monkeypatch.setattr(cls, "forward", lambda self, x, _o=original: products.append(1) or _o(self, x))
    torch.manual_seed(2)
    h, tok = torch.randn(7, 64), torch.randint(0, target.vocab_size, (7,))
    with torch.no_grad():
        states = [plain.new_state(), packed.new_state()]
        feats = [head.extend(state, h, tok) for head, state in zip((plain, packed), states)]
        assert torch.allclose(feats[0], feats[1], rtol=2e-2, atol=2e-2)
        before = (states[1].key_buf[0].data_ptr(), states[1].keys[0].clone())
        products.clear()
        scratch = packed.new_scratch()
        g = packed.draft_nodes(states[1], scratch, feats[1].repeat(3, 1), tok[:3], torch.tensor([7, 7, 7]))
        assert len(products) == 1 + 4 * len(packed.layers)
        assert (states[1].key_buf[0].data_ptr(), scratch.used) == (before[0], 3)
        assert torch.equal(states[1].keys[0], before[1]) and states[1].length == 7
        want = plain.draft_nodes(states[0], plain.new_scratch(), feats[0].repeat(3, 1), tok[:3],
                                 torch.tensor([7, 7, 7]))
        assert torch.allclose(g, want, rtol=2e-2, atol=2e-2)
