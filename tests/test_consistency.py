"""The pieces that consistency-train a model for Jacobi decoding (CLLM), and presets that merge an adapter.

No adapter is shipped yet (docs/consistency-training.md: the CPU run did not reach the issue's bar). A
preset may name a ``base`` preset and an ``adapter`` file: it inherits where the weights come from.

The training pieces are checked on tiny random models against plain forwards: the packed layout
gives each Jacobi state exactly the context it has in decoding, the recorded trajectories follow
Jacobi's update, the losses' rows are the right ones, and an exported adapter merges into the
model it was trained as.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch
from tiny_models import prompt, tiny_causal

from decoding.params import GreedyParams
from decoding.runtime.adapter import merge_adapter, read_adapter
from decoding.runtime.models import load_presets
from decoding.runtime.pair import ModelPair
from decoding.strategies.baselines import greedy
from playground.training.consistency import Weights, losses
from playground.training.lora import add_lora, save_adapter
from playground.training.packing import Doc, float_mask, pack
from playground.training.trajectories import greedy_answers, record_trajectories


F64 = torch.float64
PROMPT = "Give me two tips for staying focused while studying."


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0]


# --------------------------------------------------------------------------- training pieces, tiny models

def test_packed_blocks_see_exactly_their_jacobi_context():
    lm = tiny_causal("llama", seed=0, dtype=F64)
    a, b = prompt(9, 1), prompt(6, 2)
    docs = [Doc(a, [(3, [5, 6, 7]), (7, [8, 9])]), Doc(b, [(0, [10, 11, 12, 13])])]
    packed = pack(docs)
    with torch.no_grad():
        out = lm.model(input_ids=packed.ids[None], position_ids=packed.positions[None],
                       attention_mask=float_mask(packed.allowed, F64, lm.device)).logits[0]
    for d, doc in enumerate(docs):
        c0 = packed.ctx_start[d]
        assert torch.allclose(out[c0:c0 + len(doc.context)], _logits(lm.model, doc.context), atol=1e-9)
        for (anchor, tokens), start in zip(doc.blocks, packed.block_start[d]):
            alone = _logits(lm.model, doc.context[:anchor + 1] + tokens)[anchor + 1:]
            assert torch.allclose(out[start:start + len(tokens)], alone, atol=1e-9)


def test_trajectories_follow_jacobi_to_the_fixed_point():
    lm = tiny_causal("llama", seed=0, scale=8.0, dtype=F64)
    prompts = [prompt(8, 1), prompt(5, 2)]
    answers = greedy_answers(lm, prompts, 20)
    for p, ans in zip(prompts, answers):        # batched with left padding = greedy alone
        assert ans == greedy(p, ModelPair(lm), GreedyParams(), max_new_tokens=20).token_ids
    items = [{"prompt": p, "answer": a} for p, a in zip(prompts, answers)]
    records = record_trajectories(lm, items, n=6, blocks_per_answer=2, max_iters=6, rng=random.Random(0))
    inits = set()
    for record in records:
        assert record["blocks"]
        for block in record["blocks"]:
            t, states = block["t"], block["states"].tolist()
            inits.add(block["init"])
            context = record["prompt"] + record["answer"][:t]
            for prev, new in zip(states, states[1:]):      # y^k_i = argmax p(. | context, y^(k-1)_<i)
                expect = _logits(lm.model, context + prev[:-1])[len(context) - 1:].argmax(-1).tolist()
                assert new == expect
            assert block["converged"] and states[-1] == record["answer"][t:t + len(states[0])]
    assert inits == {"pad", "random"}


def test_loss_rows_are_the_states_predictions():
    lm = tiny_causal("llama", seed=0, scale=8.0, dtype=F64)
    p = prompt(7, 3)
    answer = greedy(p, ModelPair(lm), GreedyParams(), max_new_tokens=12).token_ids
    record = {"prompt": p, "answer": answer,
              "blocks": [{"t": 2, "states": torch.tensor([[0] * 5, [4, 9, 9, 9, 9]]), "converged": False}]}
    out = losses(lm.model, [record], Weights(kind="ce"), per_block=2, rng=random.Random(0))
    manual, n = 0.0, 0
    for state in ([0] * 5, [4, 9, 9, 9, 9]):
        logits = _logits(lm.model, p + answer[:2] + state[:-1])[len(p) + 2:]
        target = torch.tensor(answer[3:3 + len(logits)])
        manual += float(torch.nn.functional.cross_entropy(logits, target, reduction="sum"))
        n += len(target)
    assert out["consistency"] == pytest.approx(manual / n, rel=1e-6)     # (the loss runs in float32)
    ar = torch.nn.functional.cross_entropy(_logits(lm.model, p + answer)[len(p) - 1:-1], torch.tensor(answer))
    assert out["ar"] == pytest.approx(float(ar), rel=1e-6)
    kl = losses(lm.model, [record], Weights(kind="kl"), per_block=2, rng=random.Random(0))
    assert kl["consistency"] > 0 and kl["ar"] == pytest.approx(out["ar"])


def test_trimmed_states_keep_only_the_rows_after_the_first_wrong_token():
    # a state right in its first token is the same Jacobi input as the block one token later: --trim feeds
    # it from there (the dropped row repeats an AR row), --state-rows keeps the first rows after that
    lm = tiny_causal("llama", seed=0, scale=8.0, dtype=F64)
    p = prompt(7, 3)
    answer = greedy(p, ModelPair(lm), GreedyParams(), max_new_tokens=12).token_ids
    wrong = 9 if answer[3] != 9 else 8
    state = [answer[2]] + [wrong] * 4
    record = {"prompt": p, "answer": answer, "blocks": [{"t": 2, "states": torch.tensor([state]), "converged": False}]}
    logits = _logits(lm.model, p + answer[:3] + state[1:-1])[len(p) + 3:]          # rows after the wrong token
    for rows, n in ((0, 3), (2, 2)):
        out = losses(lm.model, [record], Weights(kind="ce", trim=True, rows=rows), per_block=1, rng=random.Random(0))
        manual = torch.nn.functional.cross_entropy(logits[:n], torch.tensor(answer[4:4 + n]))
        assert out["consistency"] == pytest.approx(float(manual), rel=1e-6) and out["states"] == n
        assert out["hard_rows"] == n                       # every kept row follows a wrong token
    fixed = {"prompt": p, "answer": answer,                # right but for its last token: nothing to learn
             "blocks": [{"t": 2, "states": torch.tensor([answer[2:6] + [wrong]]), "converged": False}]}
    assert losses(lm.model, [fixed, record], Weights(kind="ce", trim=True), 1, random.Random(0))["states"] == 3


def test_exported_adapter_merges_into_the_model_it_was_trained_as(tmp_path):
    lm = tiny_causal("llama", seed=0)
    trained = copy.deepcopy(lm.model)
    names = add_lora(trained, rank=4, alpha=8)
    assert len(names) == 7 * 2 and all(("lora_" in n) == p.requires_grad for n, p in trained.named_parameters())
    with torch.no_grad():
        for m in trained.modules():
            if hasattr(m, "lora_B"):
                m.lora_B.normal_(0, 0.2)
                m.lora_A.copy_(m.lora_A.half().float())       # what the fp16 file will hold
                m.lora_B.copy_(m.lora_B.half().float())
    save_adapter(trained, tmp_path / "a.safetensors", {"base": "tiny"})
    merged = copy.deepcopy(lm.model)
    meta = merge_adapter(merged, tmp_path / "a.safetensors")
    assert meta["base"] == "tiny" and float(meta["scale"]) == 2.0
    ids = prompt(10, 4)
    assert torch.allclose(_logits(merged, ids), _logits(trained, ids), atol=1e-4)
    assert not torch.allclose(_logits(merged, ids), _logits(lm.model, ids), atol=1e-2)
    other = tiny_causal("gpt2", seed=0).model                  # other layer names: refused, untouched
    before = [p.clone() for p in other.parameters()]
    with pytest.raises(ValueError, match="missing from the model"):
        merge_adapter(other, tmp_path / "a.safetensors")
    assert all(torch.equal(a, b) for a, b in zip(before, other.parameters()))


# --------------------------------------------------------------------------- the shipped preset

def test_a_preset_with_an_adapter_inherits_its_base_weights(tmp_path):
    path = tmp_path / "models.yaml"
    path.write_text("models:\n  base-model:\n    hub_id: org/base\n    network: false\n    chat: true\n"
                    "    bundled: {package: some-package, file: model.gguf}\n"
                    "  tuned:\n    base: base-model\n    adapter: consistency/tuned.safetensors\n"
                    "    description: tuned\n", encoding="utf-8")
    presets = load_presets(path)
    tuned, base = presets["tuned"], presets["base-model"]
    assert (tuned.hub_id, tuned.bundled, tuned.network, tuned.chat) == (base.hub_id, base.bundled, False, True)
    assert tuned.base == "base-model" and tuned.adapter == "consistency/tuned.safetensors"
    assert base.adapter is None and tuned.description == "tuned"


def test_training_command_smoke_and_resume(tmp_path, tiny_model):
    """The command end to end on the tiny preset (tests/tiny_preset.py: the bundled tokenizer and chat template
    on two random layers): data, training, held-out measures, export, resume. What it learns is not the subject
    (benchmarks/ measure that), and the bundled model's backward passes cost ~20 s here."""
    from playground.train_consistency import main
    threads = torch.get_num_threads()
    common = ["--target", tiny_model, "--data-dir", str(tmp_path / "data"), "--out-dir", str(tmp_path / "out"),
              "--threads", "1",
              "--batch", "2", "--eval-every", "1", "--decode-every", "1", "--eval-records", "2", "--eval-prompts", "1",
              "--eval-tokens", "6", "--no-eval-at-start"]
    try:
        summary = main(common + ["--self-seeds", "1", "--per-seed", "3", "--held-seeds", "0", "--templates", "4",
                                 "--held-templates", "3", "--held-records", "2", "--max-new", "10", "--block", "4",
                                 "--max-iters", "3", "--shard-size", "4", "--steps", "2",
                                 "--write-heldout", str(tmp_path / "heldout.yaml"), "--heldout-count", "1",
                                 "--export", str(tmp_path / "a.safetensors")])
        assert summary["steps_done"] == 2 and summary["train_answers"] >= 2 and summary["held_answers"] == 2
        assert "hard_acc" in summary["last"]["teacher_forced"] and summary["last"]["decode"]["exact"] == "1/1"
        lines = (tmp_path / "data" / "prompts.jsonl").read_text().splitlines()
        assert any('"held"' in line for line in lines) and any('"train"' in line for line in lines)
        held = {l for l in lines if '"held"' in l}
        assert all('"template:s2"' in l for l in held)           # held out by whole source
        pairs, meta = read_adapter(tmp_path / "a.safetensors")
        assert meta["base"] == tiny_model and meta["steps"] == "2" and len(pairs) == 7 * 2     # every layer's seven
        resumed = main(common + ["--skip-data", "--resume", "--steps", "3", "--consistency", "ce", "--trim",
                                 "--state-rows", "2"])
        assert resumed["steps_done"] == 3
    finally:
        torch.set_num_threads(threads)


def test_the_device_and_dtype_flags_reach_both_model_loads(tmp_path, monkeypatch):
    """``gpu.sh cllm`` trains on CUDA in float32 (``--device cuda --dtype float32``): the data's model and the
    trained one are both loaded there, and float32 is the default so the fixed points are a CPU's answers."""
    import playground.train_consistency as tc
    calls = []

    class Stop(Exception):
        pass

    def fake_load(name, **kw):
        calls.append(kw)
        if len(calls) == 2:
            raise Stop
        return object()
    monkeypatch.setattr(tc, "load_model", fake_load)
    monkeypatch.setattr(tc, "make_data", lambda lm, args, data_dir: None)
    threads = torch.get_num_threads()
    try:
        with pytest.raises(Stop):
            tc.main(["--device", "meta", "--threads", "1", "--data-dir", str(tmp_path / "d"),
                     "--out-dir", str(tmp_path / "o")])
    finally:
        torch.set_num_threads(threads)
    assert [(c.get("device"), c.get("dtype")) for c in calls] == [("meta", "float32"), ("meta", "float32")]
    assert calls[1]["kernels"] == "default"
    assert tc.parse_args([]).dtype == "float32" and tc.parse_args([]).device is None
