"""The prophet head's inputs: the target's hidden states, and (EAGLE-3-style) intermediate layers' states.

A head that ignored its hidden-state input, or a fusion head that ignored its layer features, would
still give exact output (the target verifies everything); these tests fail on such a head instead.
"""

from __future__ import annotations

import pytest
import torch

from decoding.params import GreedyParams, ProphetParams
from decoding.runtime.head import Prophet, ProphetConfig, load_prophet, save_prophet
from decoding.runtime.pair import ModelPair
from decoding.strategies.baselines import greedy
from decoding.strategies.speculative import prophet as prophet_run
from playground.train_prophet import Answers, unrolled_loss
from playground.training import prophet_data

from tiny_models import prompt, tiny_causal

F64 = torch.float64


def _head(lm, layers=(), seed=0, dtype=torch.float32, vocab=None):
    torch.manual_seed(seed)
    vocab = torch.arange(lm.vocab_size) if vocab is None else vocab
    head = Prophet(ProphetConfig.for_target(lm, feature_layers=layers), lm, vocab)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if not name.startswith(("reduce.", "feature_norms.")):
                p.add_(torch.randn_like(p) * 0.5)
    return head.to(dtype).eval()


def _wake_fusion(head, seed=1):
    """Give the layer blocks of the fusion weights values (as training would)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        w = head.reduce.weight
        w[:, head.config.hidden:] = (torch.randn(w[:, head.config.hidden:].shape, generator=g) * 0.3).to(w.dtype)
    return head


# --------------------------------------------------------------------------- the hidden-state input

def test_the_shipped_head_reads_the_targets_hidden_states():
    """Teacher-forced on the bundled model's own greedy answer, the shipped head's first draft agrees with
    the target far more often with the true states than with the same states shifted to other positions
    (a head that ignored its hidden-state input would score the same on both)."""
    from decoding.runtime.head import prophet_for
    from decoding.runtime.models import load_model
    lm = load_model("smollm2-135m-instruct")
    head = prophet_for(lm)
    conv = [[{"role": "user", "content": "Give me three tips for sleeping better, one line each."}]]
    rec = prophet_data.answer(lm, conv, 48)[0]
    hidden, tokens = rec["hidden"].float()[None], rec["tokens"][None]
    labels = head.to_draft_ids(tokens[0, 1:])

    def agreement(h):
        with torch.no_grad():
            out, _ = head.forward_train(h.to(head.dtype), tokens, 1)
        return float((out[0, 0, :-1].argmax(-1) == labels).float().mean())

    true = agreement(hidden)
    shifted = agreement(torch.roll(hidden, 7, dims=1))
    assert true >= 0.35 and true - shifted >= 0.15, (true, shifted)   # measured: 0.45 vs 0.19


def test_the_head_output_depends_on_each_hidden_state_it_is_given():
    lm = tiny_causal("llama", seed=0, scale=8.0)
    head = _head(lm)
    torch.manual_seed(3)
    h, tok = torch.randn(1, 8, 64), torch.randint(0, lm.vocab_size, (1, 8))
    h2 = h.clone()
    h2[0, 4] += 1.0                                 # one state changed: anchors from 4 on see it (context)
    with torch.no_grad():
        out, _ = head.forward_train(h, tok, 3)
        out2, _ = head.forward_train(h2, tok, 3)
    diff = (out - out2).abs().amax(dim=(0, 1, 3))   # per anchor
    assert float(diff[:4].max()) == 0.0 and bool((diff[4:] > 1e-3).all())


# --------------------------------------------------------------------------- layer fusion (EAGLE-3-style)

def test_a_fusion_head_starts_as_its_last_layer_head_and_then_reads_the_layers():
    lm = tiny_causal("llama", seed=0, scale=8.0)
    base = _head(lm)
    fused = Prophet(ProphetConfig.for_target(lm, feature_layers=(0, 1)), lm, base.vocab).eval()
    fused.load_trainable(base.trainable_state(), fresh_fusion=True)
    torch.manual_seed(4)
    h, tok = torch.randn(2, 9, 64), torch.randint(0, lm.vocab_size, (2, 9))
    extra = torch.randn(2, 9, 2, 64)
    with torch.no_grad():
        assert torch.allclose(fused.forward_train(h, tok, 3, extra)[0], base.forward_train(h, tok, 3)[0], atol=1e-5)
        _wake_fusion(fused)
        a = fused.forward_train(h, tok, 3, extra)[0]
        for i in range(2):                           # each fused layer matters on its own
            other = extra.clone()
            other[..., i, :] = torch.randn(2, 9, 64)
            assert (a - fused.forward_train(h, tok, 3, other)[0]).abs().max() > 1e-2
    with pytest.raises(ValueError, match="fuses the target's layers"):
        fused.forward_train(h, tok, 3)
    with pytest.raises(ValueError, match="do not fit"):
        base.load_trainable(fused.trainable_state(), fresh_fusion=True)


def test_training_moves_the_layer_weights_of_a_fusion_head():
    """One optimizer step on the unrolled loss gives the (zero-initialized) layer blocks of the fusion
    weights a gradient: the loss reaches the layer features."""
    lm = tiny_causal("llama", seed=0, scale=8.0)
    head = _head(lm, layers=(0, 1)).train()
    torch.manual_seed(5)
    records = [{"tokens": torch.randint(0, lm.vocab_size, (12,)), "hidden": torch.randn(12, 64),
                "layers": torch.randn(12, 2, 64)} for _ in range(4)]
    data = Answers(records, depth=3, layers=True)
    hidden, tokens, extra = data.batch(range(4))
    assert extra is not None and extra.shape == (4, 12, 2, 64)
    loss, _, _ = unrolled_loss(head, hidden, tokens, 3, kl_weight=0.5, feat_weight=1.0, extra=extra)
    loss.backward()
    grad = head.reduce.weight.grad[:, 64:]
    assert float(grad.abs().sum()) > 0
    assert Answers(records[:2] + [{"tokens": torch.arange(5), "hidden": torch.randn(5, 64)}], 3, layers=True).records \
        == records[:2]   # records without layer states are left out of a fusion head's data


def test_fusion_training_forward_sees_what_the_drafter_sees():
    lm = tiny_causal("llama", seed=0, scale=8.0, dtype=F64)
    head = _wake_fusion(_head(lm, layers=(0, 1), dtype=F64))
    torch.manual_seed(6)
    h, tok = torch.randn(1, 10, 64, dtype=F64), torch.randint(0, lm.vocab_size, (1, 10))
    extra = torch.randn(1, 10, 2, 64, dtype=F64)
    with torch.no_grad():
        _, feats = head.forward_train(h, tok, 3, extra)
        state, start = head.new_state(), 0
        for end in (1, 4, 7):
            g = head.extend(state, h[0, start:end], tok[0, start:end], extra[0, start:end])
            assert torch.allclose(feats[0, 0, end - 1], g[0], atol=1e-9)
            scratch = head.new_scratch()
            for j in range(1, 3):
                g = head.draft_step(state, scratch, g, tok[0, end - 1 + j: end + j], j)
                assert torch.allclose(feats[0, j, end - 1], g[0], atol=1e-9)
            start = end


@pytest.mark.parametrize("fast", [False, True])
def test_in_the_loop_a_fusion_head_gets_the_right_layers_at_the_right_positions(monkeypatch, fast):
    """The verify forwards hand the drafter each committed position's last-layer state and the fused
    layers' states; checked against one plain forward over the whole output. Output equals greedy."""
    lm = tiny_causal("llama", seed=0, scale=8.0, dtype=F64)
    head = _wake_fusion(_head(lm, layers=(0, 1), dtype=F64))
    seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    real = Prophet.extend

    def spy(self, state, hidden, tokens, extra=None):
        seen.append((hidden.clone(), tokens.clone(), extra.clone()))
        return real(self, state, hidden, tokens, extra)
    monkeypatch.setattr(Prophet, "extend", spy)
    pair = ModelPair(lm, prophet=head)
    ids = prompt(6, seed=2)
    want = greedy(ids, pair, GreedyParams(), max_new_tokens=20).token_ids
    got = prophet_run(ids, pair, ProphetParams(draft_tokens=3, fast=fast), max_new_tokens=20)
    assert got.token_ids == want
    hidden = torch.cat([s[0] for s in seen])
    extra = torch.cat([s[2] for s in seen])
    n = hidden.shape[0]
    assert n >= 10 and torch.cat([s[1] for s in seen]).tolist() == want[:n]
    with torch.no_grad():
        full = lm.model(torch.tensor([ids + want]), output_hidden_states=True).hidden_states
    rows = slice(len(ids) - 1, len(ids) - 1 + n)     # the position before each committed token
    assert torch.allclose(hidden, full[-1][0, rows], atol=1e-6)
    for i, layer in enumerate((0, 1)):
        assert torch.allclose(extra[:, i], full[layer][0, rows], atol=1e-6)


def test_a_fusion_head_round_trips_through_its_weights_file(tmp_path):
    lm = tiny_causal("llama", seed=0, scale=8.0)
    head = _wake_fusion(_head(lm, layers=(0, 1)))
    save_prophet(head, tmp_path / "f.safetensors")
    again = load_prophet(tmp_path / "f.safetensors", lm)
    assert again.config.feature_layers == (0, 1)
    assert ProphetConfig(**{**head.config.to_dict(), "feature_layers": [0, 1]}).feature_layers == (0, 1)
    torch.manual_seed(7)
    h, tok, extra = torch.randn(1, 6, 64), torch.randint(0, lm.vocab_size, (1, 6)), torch.randn(1, 6, 2, 64)
    with torch.no_grad():
        a, b = head.forward_train(h, tok, 2, extra)[0], again.forward_train(h, tok, 2, extra)[0]
    assert (a - b).abs().mean() < 0.01


# --------------------------------------------------------------------------- the data's layer states

def test_the_data_hooks_keep_what_output_hidden_states_holds():
    lm = tiny_causal("llama", seed=0, scale=8.0)
    ids = torch.tensor([prompt(7, seed=1)])
    states = prophet_data._States(lm.model, (1,))
    try:
        seq = lm.model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    finally:
        states.close()
    gen = lm.model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0, output_hidden_states=True,
                            return_dict_in_generate=True)
    assert torch.equal(seq, gen.sequences)
    T = seq.shape[1] - ids.shape[1]

    def ref(i):
        return torch.cat([gen.hidden_states[0][i][:, -1:]] + [s[i] for s in gen.hidden_states[1:T]], dim=1)
    assert torch.allclose(states.stacked(-1, T), ref(-1), atol=1e-6)
    assert torch.allclose(states.stacked(1, T), ref(1), atol=1e-6)
    assert not lm.model.model.norm._forward_hooks          # removed
    with pytest.raises(ValueError, match="outside"):
        prophet_data._States(lm.model, (2,))


def _fake_units(folder, hidden=576, vocab=49152):
    """Mixed-data units for the bundled model's width: one held-out unit and three training units, two of
    them with layer states (as --store-layers writes them)."""
    g = torch.Generator().manual_seed(8)
    folder.mkdir(parents=True)
    (folder / prophet_data.LAYERS_DIR).mkdir()
    words = ["river", "lamp", "orbit", "cedar", "violin", "harbor", "quartz", "meadow", "falcon", "ember",
             "glacier", "saddle", "pepper", "canyon", "marble", "tundra"]
    for unit, layered in ((0, True), (5, True), (6, True), (7, False)):
        source = prophet_data.source_of(unit).name
        records, layers = [], []
        for i in range(4):
            T = 10
            pick = torch.randperm(len(words), generator=g)[:6].tolist()
            text = f"unit {unit} item {i}: " + " ".join(words[j] for j in pick)
            records.append({"tokens": torch.randint(0, vocab, (T,), generator=g),
                            "hidden": torch.randn(T, hidden, generator=g).half(), "source": source,
                            "prompt": text, "conversation": [{"role": "user", "content": text}],
                            "answer": "a", "unit": unit})
            layers.append(torch.randn(T, 2, hidden, generator=g).to(torch.bfloat16))
        name = f"u{unit:05d}-{source}.pt"
        torch.save(records, folder / name)
        if layered:
            torch.save(layers, folder / prophet_data.LAYERS_DIR / name)


def test_the_training_command_trains_a_fusion_head_and_its_same_data_baseline(tmp_path):
    from playground import train_prophet
    from decoding.runtime.models import load_model
    data = tmp_path / "data"
    _fake_units(data)
    common = ["--data", "mix", "--skip-data", "--data-dir", str(data), "--steps", "2", "--batch", "2",
              "--eval-every", "1", "--depth", "2", "--vocab", "64", "--threads", "1", "--no-bf16"]
    fused = train_prophet.main(common + ["--feature-layers", "2,15", "--out-dir", str(tmp_path / "o1"),
                                         "--export", str(tmp_path / "w" / "f.safetensors")])
    same = train_prophet.main(common + ["--only-layered", "--out-dir", str(tmp_path / "o2")])
    every = train_prophet.main(common + ["--out-dir", str(tmp_path / "o3")])
    assert fused["train_responses"] == same["train_responses"] == 8 and every["train_responses"] == 12
    assert fused["held_out_responses"] == same["held_out_responses"] == every["held_out_responses"] == 4
    lm = load_model("smollm2-135m-instruct")
    head = load_prophet(tmp_path / "w" / "f.safetensors", lm)
    assert head.config.feature_layers == (2, 15)
    # the bundled model with a fusion head: the drafter gets layers 2 and 15, output stays greedy's
    ids = lm.tokenizer("The capital of France is", add_special_tokens=False)["input_ids"]
    pair = ModelPair(lm, prophet=head)
    want = greedy(ids, pair, GreedyParams(), max_new_tokens=12).token_ids
    assert prophet_run(ids, pair, ProphetParams(draft_tokens=3), max_new_tokens=12).token_ids == want
    with pytest.raises(SystemExit):
        train_prophet.main(common + ["--feature-layers", "2,x", "--out-dir", str(tmp_path / "o4")])
