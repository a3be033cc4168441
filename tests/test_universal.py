"""Cross-tokenizer speculative decoding (decoding/drafting/universal.py, tokenbridge.py).

Toy pairs use two different tokenizers built offline with the ``tokenizers``
library over the alphabet {a, b, space}: a SentencePiece-style target (spaces
spelled ``▁``, 6 tokens) and a byte-level BPE assistant (spaces spelled ``Ġ``,
7 tokens); they share the tokens a, b, " " and " a". The bundled pair is
gemma-3-270m (target) <- smollm2-135m-instruct (assistant).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from test_speculative import (_chi_square, _draw_outputs, _exact_model_distribution, _negative_control_fails, _outputs,
                              _passes)
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from decoding.drafting import make_drafter, universal
from decoding.drafting.assistant import AssistantDrafter
from decoding.drafting.tokenbridge import Bridge, bridge_for, whole_chars_end
from decoding.drafting.universal import UniversalDrafter, realign, to_target
from decoding.events import DraftTranslated, event_from_dict, event_to_dict
from decoding.harness.bench import Method, _runner
from decoding.params import SpeculativeParams
from decoding.runtime.pair import ModelPair
from decoding.sampling import make_generator
from decoding.strategies import get_strategy
from decoding.strategies.speculative import speculative
from decoding.tracer import Tracer
from visualize.crosstok import crosstok_html, crosstok_view

from tiny_models import tiny_causal

SPACE, G = "\u2581", "\u0120"


def sp_tokenizer() -> PreTrainedTokenizerFast:
    """Gemma-style: spaces become ▁ before BPE; 6 tokens."""
    vocab = {"a": 0, "b": 1, SPACE: 2, "ab": 3, SPACE + "a": 4, "ba": 5}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b"), (SPACE, "a"), ("b", "a")]))
    tok.normalizer = normalizers.Replace(" ", SPACE)
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.Fuse()])
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def bl_tokenizer() -> PreTrainedTokenizerFast:
    """GPT-2-style byte-level BPE: a space is Ġ; 7 tokens, other ids and merges."""
    vocab = {"b": 0, "a": 1, G: 2, "aa": 3, G + "b": 4, "bb": 5, G + "a": 6}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "a"), (G, "b"), ("b", "b"), (G, "a")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


TARGET_TOK, ASSISTANT_TOK = sp_tokenizer(), bl_tokenizer()


def toy_target(arch: str = "llama", seed: int = 0, scale: float = 2.0, vocab: int = 6):
    lm = tiny_causal(arch, seed=seed, vocab=vocab, eos=False, scale=scale)
    lm.tokenizer = TARGET_TOK
    return lm


def toy_assistant(arch: str = "llama", seed: int = 9, scale: float = 4.0):
    lm = tiny_causal(arch, seed=seed, vocab=7, eos=False, scale=scale)
    lm.tokenizer = ASSISTANT_TOK
    return lm


def _greedy(pair: ModelPair, ids: list[int], n: int) -> list[int]:
    g = get_strategy("greedy")
    return g.generate(ids, pair, g.parse({}), max_new_tokens=n).token_ids



# --------------------------------------------------------------------------- the bridge

def test_the_toy_bridge_maps_exactly_the_tokens_spelling_the_same_bytes():
    bridge = Bridge(TARGET_TOK, ASSISTANT_TOK, 6)
    mapped = {a: t for a, t in enumerate(bridge.to_target.tolist()) if t >= 0}
    assert mapped == {0: 1, 1: 0, 2: 2, 6: 4}       # b, a, Ġ -> ▁, Ġa -> ▁a; aa, Ġb, bb are the assistant's own
    assert bridge.target.spell([3, 4]) == b"ab a" and bridge.assistant.spell([4, 3]) == b" baa"
    q = torch.tensor([0.1, 0.2, 0.3, 0.05, 0.05, 0.1, 0.2])
    assert torch.allclose(bridge.target_q(q, 8), torch.tensor([0.2, 0.1, 0.3, 0, 0.2, 0, 0, 0]))


def test_a_tokenizer_that_does_not_spell_its_text_is_refused_clearly():
    tok = Tokenizer(models.WordPiece({"[UNK]": 0, "ab": 1, "##ba": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()
    with pytest.raises(ValueError, match="do not spell their text byte for byte"):
        Bridge(TARGET_TOK, PreTrainedTokenizerFast(tokenizer_object=tok), 6)
    with pytest.raises(ValueError, match="fast \\(tokenizers-backed\\) tokenizer"):
        Bridge(TARGET_TOK, object(), 6)


def test_utf8_boundaries():
    smile = "🙂".encode()
    assert whole_chars_end(b"ok " + smile[:3]) == 3 and whole_chars_end(b"ok " + smile) == 7
    assert whole_chars_end(smile[1:] + b"x", 0) == 4       # leading continuation bytes are not a cut


# --------------------------------------------------------------------------- translation (bundled tokenizers)

@pytest.fixture(scope="module")
def bundled_pair():
    from decoding.runtime.models import load_model
    return load_model("gemma-3-270m"), load_model("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def bridge(bundled_pair):
    g, s = bundled_pair
    return bridge_for(g, s)


TEXT = "Tokenizers disagree: the 日本語 word, an emoji 🙂, naïve café (€3.50)\n\n  indented code();\tdone."


@pytest.mark.bundled
@pytest.mark.parametrize("side", ["target", "assistant"])
def test_every_cut_of_a_text_translates_to_exactly_the_tokens_after_it(bridge, side):
    """Committed = the first i tokens of a text, draft = the rest: the translation is exactly tokens i..,
    in both tokenizers. Dropping the first token after the boundary, or repeating the last committed
    one, fails here."""
    vocab = getattr(bridge, side)
    data = TEXT.encode()
    ids, ends = vocab.encode(data)
    assert vocab.spell(ids) == data and ids == vocab.backend.encode(TEXT, add_special_tokens=False).ids
    for i in range(1, len(ids)):
        got, got_ends = to_target(vocab, data[:ends[i - 1]], ends[:i], data[ends[i - 1]:])
        assert got == ids[i:], i
        assert got_ends[-1] == len(data) - ends[i - 1]


@pytest.mark.bundled
def test_a_token_merging_across_the_boundary_is_split_there(bundled_pair, bridge):
    g = bundled_pair[0]
    committed = g.tokenizer("The word Hel", add_special_tokens=False)["input_ids"]
    text = bridge.target.spell(committed)
    ends = [len(bridge.target.spell(committed[:i + 1])) for i in range(len(committed))]
    assert bridge.target.encode(b"The word Hello world")[0][-2:] != committed[-1:]   # 'Hello' would merge
    got, _ = to_target(bridge.target, text, ends, b"lo world")
    assert bridge.target.spell(got) == b"lo world"                                  # nothing dropped or doubled
    assert g.tokenizer.decode(committed + got) == "The word Hello world"
    assert bridge.target.spell(got[:1]) == b"lo"


@pytest.mark.bundled
def test_multibyte_characters_cut_at_either_end_of_a_draft(bundled_pair, bridge):
    g, tv = bundled_pair[0], bridge.target
    smile = "🙂".encode()
    head = g.tokenizer("an emoji ", add_special_tokens=False)["input_ids"]
    committed = head + [tv.byte_token[b] for b in smile[:2]]          # the target stopped inside the emoji
    text = tv.spell(committed)
    ends = [len(tv.spell(committed[:i + 1])) for i in range(len(committed))]
    got, got_ends = to_target(tv, text, ends, smile[2:] + b" ok")
    assert got[:2] == [tv.byte_token[b] for b in smile[2:]] and tv.spell(got) == smile[2:] + b" ok"
    assert g.tokenizer.decode(committed + got) == "an emoji 🙂 ok"
    got, got_ends = to_target(tv, b"ok", [2], b" fine " + smile[:3])   # a draft cut inside a character
    assert tv.spell(got) == b" fine " and got_ends[-1] == 6
    # the assistant's context follows a committed text that ends inside a character (byte-level pieces)
    av = bridge.assistant
    ids, ends = realign(av, [], [], b"", b"emoji " + smile[:3])
    assert av.spell(ids) == b"emoji " + smile[:3] and ends[-1] == 9


@pytest.mark.bundled
def test_the_assistant_context_keeps_its_cached_tokens_and_re_encodes_only_the_tail(bridge):
    av = bridge.assistant
    data = TEXT.encode()
    ids, ends = av.encode(data)
    for cut in range(1, len(data)):
        new_ids, new_ends = realign(av, ids, ends, data, data[:cut])
        assert av.spell(new_ids) == data[:cut] and new_ends[-1] == cut
        kept = sum(e <= cut for e in ends) - universal.LOOKBEHIND
        assert new_ids[:max(kept, 0)] == ids[:max(kept, 0)]                # the cache is reused up to there


# --------------------------------------------------------------------------- routing

def test_make_drafter_translates_only_between_different_tokenizers():
    target, helper = toy_target(), toy_assistant()
    assert isinstance(make_drafter("speculative", ModelPair(target, helper), SpeculativeParams()), UniversalDrafter)
    twin = toy_target(seed=5)                                         # another model, the same tokenizer
    assert isinstance(make_drafter("speculative", ModelPair(target, twin), SpeculativeParams()), AssistantDrafter)
    same_vocab = toy_target(seed=6)
    same_vocab.tokenizer = sp_tokenizer()                               # an equal tokenizer, another object
    assert isinstance(make_drafter("speculative", ModelPair(target, same_vocab), SpeculativeParams()),
                      AssistantDrafter)
    with pytest.raises(ValueError, match="drafts a chain only"):
        make_drafter("speculative", ModelPair(target, helper), SpeculativeParams(tree=True))


@pytest.mark.bundled
def test_same_tokenizer_bundled_pairs_keep_the_plain_assistant_drafter(bundled_pair):
    g, s = bundled_pair
    assert isinstance(make_drafter("speculative", ModelPair(s, s), SpeculativeParams()), AssistantDrafter)
    assert isinstance(make_drafter("speculative", ModelPair(g, s), SpeculativeParams()), UniversalDrafter)


# --------------------------------------------------------------------------- greedy: exactly the target's tokens

@pytest.mark.parametrize("t_arch,a_arch,fast", [("llama", "gpt2", False), ("gpt2", "gptneox", False),
                                                ("gptneox", "llama", False), ("llama", "llama", True)])
def test_greedy_on_toy_pairs_is_the_targets_greedy(t_arch, a_arch, fast, one_thread):
    target, helper = toy_target(t_arch, seed=1), toy_assistant(a_arch, seed=2)
    drafted = 0
    for text in ("ab a ba", "b", "bab aab a"):
        ids = TARGET_TOK(text, add_special_tokens=False)["input_ids"]
        ref = _greedy(ModelPair(target), ids, 24)
        res = speculative(ids, ModelPair(target, helper), SpeculativeParams(draft_tokens=3, fast=fast,
                                                                             confidence_threshold=0.0),
                          max_new_tokens=24)
        assert res.token_ids == ref, text
        drafted += res.stats["drafted"]
    assert drafted > 0


@pytest.mark.bundled
def test_bundled_pair_greedy_matches_the_target_and_records_both_tokenizations(bundled_pair):
    g, s = bundled_pair
    ids = g.tokenizer("The capital of France is", add_special_tokens=True)["input_ids"]
    ref = _greedy(ModelPair(g), ids, 28)
    tracer = Tracer()
    res = speculative(ids, ModelPair(g, s), SpeculativeParams(), max_new_tokens=28, tracer=tracer)
    assert res.token_ids == ref and res.stats["alpha"] > 0 and res.draft_forwards > 0
    drafts = [e for e in tracer.events if isinstance(e, DraftTranslated)]
    proposed = {e.step: e.tokens for e in tracer.events if type(e).__name__ == "DraftProposed"}
    assert drafts and not any(e.intersection for e in drafts)
    for e in drafts:
        assert proposed.get(e.step, ()) == e.target_tokens                   # what the target verified
        text = bytes(e.text)
        assert s.tokenizer.decode(list(e.assistant_tokens)) == text.decode("utf-8", errors="replace")
        context = ids + res.token_ids[:e.position]                            # committed before this draft
        if e.target_tokens:   # the real tokenizer's decode: the draft adds exactly its text, once
            spelled = text[:e.target_ends[-1]].decode()
            assert g.tokenizer.decode(context + list(e.target_tokens)) == g.tokenizer.decode(context) + spelled


@pytest.mark.bundled
def test_the_cli_runs_the_bundled_pair_offline(tmp_path, bundled_pair):
    from playground.cli import main
    out = tmp_path / "run.json"
    rc = main(["run", "--target", "gemma-3-270m", "--assistant", "smollm2-135m-instruct", "--strategy",
               "speculative", "--prompt", "The capital of France is", "--max-new-tokens", "16", "--no-warmup",
               "--quiet", "--json", str(out)])
    assert rc == 0
    spec = next(r for r in json.loads(out.read_text())["results"] if r["strategy"] == "speculative")
    assert spec["matches_greedy"] is True and spec["stats"]["alpha"] > 0
    assert any(e["type"] == "DraftTranslated" for e in spec["events"])


# --------------------------------------------------------------------------- sampling: token-level intersection

def test_intersection_drafts_carry_normalized_q_rows_over_shared_target_tokens():
    target, helper = toy_target(), toy_assistant()
    params = SpeculativeParams(temperature=1.0, draft_tokens=4, confidence_threshold=0.0)
    drafter = make_drafter("speculative", ModelPair(target, helper), params, rng=make_generator(3))
    shared_targets = {1, 0, 2, 4}
    drafter.begin([3, 4])
    for step in range(20):
        prop = drafter.draft([3, 4] + [2, 4] * step, 4)
        assert prop.q is not None and prop.q.shape == (len(prop), 6)
        assert torch.allclose(prop.q.sum(-1), torch.ones(len(prop)))
        assert set(torch.nonzero(prop.q.sum(0)).flatten().tolist()) <= shared_targets
        assert set(prop.tokens) <= shared_targets
        assert prop.q_token == pytest.approx([float(prop.q[i, t]) for i, t in enumerate(prop.tokens)])


def test_intersection_sampling_keeps_the_target_distribution(monkeypatch, one_thread, prefill_once):
    """Empirical distribution of 3-token outputs vs the exactly enumerated target distribution. The
    negative control gives the verifier the assistant's probabilities restricted to the intersection
    but not renormalized (q is then not the distribution the draft was drawn from): it must fail."""
    target, helper = toy_target(seed=0), toy_assistant(seed=9)
    params = SpeculativeParams(temperature=1.0, draft_tokens=2, confidence_threshold=0.0)
    ids, n_out, n = TARGET_TOK("aab a", add_special_tokens=False)["input_ids"], 3, 2000
    exact = _exact_model_distribution(target, ids, n_out, params)
    assert abs(sum(exact.values()) - 1) < 1e-4

    def run(gen):
        res = speculative(ids, ModelPair(target, helper), params, max_new_tokens=n_out, rng=gen)
        return res.token_ids, res.stats["accepted"]

    def draw(m: int) -> tuple[dict, int]:
        return _draw_outputs(run, m, 11)
    counts, accepted = draw(n)
    assert accepted > n // 4                       # drafts really were accepted, not only resampled
    stat, dof = _chi_square(counts, exact, n)
    assert _passes(stat, dof), (stat, dof)

    def unnormalized(q: torch.Tensor, shared: torch.Tensor):
        out = torch.zeros_like(q)
        out[shared] = q[shared]
        return out
    monkeypatch.setattr(universal, "restrict", unnormalized)
    _negative_control_fails(_outputs(lambda gen: run(gen)[0], 11), exact, n)


# --------------------------------------------------------------------------- trace, view, benchmark anchor

def test_the_event_round_trips_and_passes_the_trace_import_checks(one_thread):
    from visualize.traces import check_event
    target, helper = toy_target(vocab=10), toy_assistant()      # the loop's trace lists a top 10 of the target
    tracer = Tracer()
    speculative(TARGET_TOK("ab a", add_special_tokens=False)["input_ids"], ModelPair(target, helper),
                SpeculativeParams(temperature=0.8, confidence_threshold=0.0), max_new_tokens=12,
                rng=make_generator(0), tracer=tracer)
    events = [e for e in tracer.events if isinstance(e, DraftTranslated)]
    assert events and all(e.intersection and e.assistant_ends == e.target_ends for e in events)
    for e in events:
        data = json.loads(json.dumps(event_to_dict(e)))
        assert event_from_dict(data) == e
        check_event(data)


def _doc_event(**fields) -> dict:
    base = dict(type="DraftTranslated", step=3, position=5, assistant_tokens=[7, 8], assistant_ends=[2, 5],
                target_tokens=[1, 2], target_ends=[3, 5], text=list(b"<b>&'"), assistant_q=[0.9, 0.5],
                intersection=False)
    base.update(fields)
    return base


def test_the_view_draws_both_rows_over_the_same_bytes_and_escapes_everything():
    verdicts = [{"type": "TokenVerified", "step": 3, "position": 5, "token": 1, "accepted": True,
                 "p_target": 0.9, "q_draft": 1.0, "u": None},
                {"type": "TokenVerified", "step": 3, "position": 6, "token": 2, "accepted": False,
                 "p_target": 0.1, "q_draft": 1.0, "u": None}]
    html = crosstok_html({"events": [_doc_event()] + verdicts}, step=4)
    assert "&lt;b" in html and "<b>&" not in html and "colspan='3'" in html and "colspan='2'" in html
    assert "dp-ok" in html and "dp-no" in html and "1 accepted" in html
    cut = crosstok_html({"events": [_doc_event(text=list("é".encode() + b"x"), assistant_ends=[1, 3],
                                               target_tokens=[1], target_ends=[2])]})
    assert "\\xc3" in cut and "not drafted" in cut                  # half a character; the held-back byte
    bad = crosstok_html({"events": [_doc_event(target_ends=[3, 9])]})
    assert "inconsistent" in bad
    assert "No cross-tokenizer draft yet" in crosstok_html({"events": [_doc_event()]}, step=2)
    assert "gemma-3-270m" in crosstok_view({"results": [{"events": []}]}, 0)


def test_the_view_does_not_import_torch():
    code = "import sys, visualize.crosstok; assert 'torch' not in sys.modules, 'torch imported'"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def test_the_hf_assisted_anchor_runs_transformers_universal_assisted_decoding(one_thread):
    target, helper = toy_target(), toy_assistant()
    ids = TARGET_TOK("ab a ba", add_special_tokens=False)["input_ids"]
    run = _runner(Method("hf_assisted", None, anchor="hf_assisted"), ModelPair(target, helper), 12, 0, 10)
    tokens, _, _, _ = run(ids)
    assert tokens == _greedy(ModelPair(target), ids, 12)
