"""The compiled forward's attention reductions as a C++ kernel of the project's own, built on the machine that runs
it (``attention_kernels.cpp``: why, and why it stays exact, is written there).

:func:`load` compiles the file once per machine, PyTorch version and source (g++ with ``-march=native``, so an
Intel Xeon gets AVX-512 and an AMD EPYC its own vectors; ``x86-64-v3`` where PyTorch's kernels are capped at AVX2,
:func:`target_arch`), keeps the library in the cache directory beside
inductor's, and registers its two operators (``torch.ops.decoding_attention.scores`` / ``.values``) with their
shapes for the compiler. Where it cannot be built (no compiler, another PyTorch, ``DECODING_ATTENTION_KERNEL=0``)
the compiled forward writes the same reductions for inductor instead (slower, equally exact) and says why.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from decoding import verify
from decoding.runtime.cpu import cpu_fingerprint, cpuinfo, pytorch_isa

PERSISTENT = Path("/data")     # a Hugging Face Space's persistent storage, when the Space has it


def _operator_inductor_dir() -> Optional[str]:
    """``TORCHINDUCTOR_CACHE_DIR`` when the operator set it. Inductor writes its own default (under the system's
    temporary folder) into that variable the first time anything asks for its folder (importing some of
    transformers' models does), so a value equal to that default is inductor's, not the operator's."""
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not chosen:
        return None
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
        if os.path.abspath(chosen) == os.path.abspath(default_cache_dir()):
            return None
    except Exception:  # noqa: BLE001: a PyTorch without that helper: take the variable as set
        pass
    return chosen


_MACHINE_FOLDER = re.compile(r"torch-.+-cpu-[0-9a-f]{16}")


def machine_folder() -> str:
    """The name of this machine's folder under the cache: PyTorch's version and the CPU's fingerprint (its flags
    and the instruction set its kernels run, caps included: ``runtime/cpu.cpu_fingerprint``). Inductor's graph
    cache does not key its entries by the kernels' instruction set: a graph compiled on an AVX-512 machine, read
    back with ``ATEN_CPU_CAPABILITY=avx2`` (or on a Space moved to another CPU with the same ``/data``), gave
    garbage tokens or aborted the process (an int8-weight model, measured). Each machine gets its own folder."""
    return f"torch-{torch.__version__}-cpu-{cpu_fingerprint()}"


def cache_dir() -> Path:
    """Where inductor keeps compiled graphs across restarts, in :func:`machine_folder` under:
    ``TORCHINDUCTOR_CACHE_DIR`` when set, else ``inductor`` under ``DECODING_CACHE_DIR``, else under a Space's
    persistent ``/data`` (a Space's temporary folders go at every restart), else under the user's cache
    (``$XDG_CACHE_HOME`` or ``~/.cache``), beside the converted models. Never inductor's default (the system's
    temporary folder)."""
    chosen = _operator_inductor_dir()
    if chosen:
        root = Path(chosen)
        if _MACHINE_FOLDER.fullmatch(root.name):      # set by compiled.use_cache_dir: the operator's is its parent
            root = root.parent
        return root / machine_folder()
    base = os.environ.get("DECODING_CACHE_DIR")
    if not base and PERSISTENT.is_dir() and os.access(PERSISTENT, os.W_OK):
        base = str(PERSISTENT / "decoding-playground")
    if not base:
        base = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                            "decoding-playground")
    return Path(base) / "inductor" / machine_folder()


SOURCE = Path(__file__).with_name("attention_kernels.cpp")
ENV_SWITCH = "DECODING_ATTENTION_KERNEL"       # "0": inductor's loops instead
_LOCK = threading.Lock()
_STATE: dict = {}


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def library_path(cache: Path) -> Path:
    """Where this machine's build lives: keyed by the source, PyTorch, the compiler's target and flags."""
    key = hashlib.sha256("\n".join([SOURCE.read_text(), torch.__version__, _cpu_flags(), " ".join(_flags())])
                         .encode()).hexdigest()[:16]
    return cache / f"attention-{key}.so"


WIDER_THAN_AVX2 = ("avx512f", "avx_vnni", "amx_tile")     # flags of a CPU that make's AVX2 caps narrow (Makefile)


def target_arch() -> str:
    """g++'s ``-march``: ``native``, or ``x86-64-v3`` (AVX2, FMA, F16C: what an AMD EPYC Zen 3 builds) where
    PyTorch's kernels are capped at AVX2 on a wider CPU (``ATEN_CPU_CAPABILITY=avx2``: ``make test``'s second pass,
    which inductor's code generation honours too), so the capped run computes with the code an AVX2-only machine
    builds: 8-float vectors instead of 16, and so other sums (``attention_kernels.cpp``)."""
    wider = set(cpuinfo("flags").split()) & set(WIDER_THAN_AVX2)
    return "x86-64-v3" if pytorch_isa().upper() == "AVX2" and wider else "native"


def _flags() -> list[str]:
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return ["-O3", f"-march={target_arch()}", "-mtune=native", "-ffp-contract=off", "-fno-fast-math", "-fopenmp",
            "-std=c++17", "-fPIC", "-shared", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-DAT_PARALLEL_OPENMP=1"]


def _build(target: Path) -> None:
    from torch.utils.cpp_extension import include_paths, library_paths
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise RuntimeError("no C++ compiler")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        cmd = [cxx, str(SOURCE), "-o", str(out), *_flags()]
        cmd += [f"-I{p}" for p in include_paths()]
        cmd += [f"-L{p}" for p in library_paths()] + ["-lc10", "-ltorch_cpu"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"{Path(cxx).name} failed: {done.stderr.strip()[-400:]}")
        os.replace(out, target)           # atomic: another process building the same file sees all or nothing


def load(cache: Path) -> Optional[str]:
    """Build (once) and register the operators; None when they are ready, else why not (then the caller keeps
    inductor's loops)."""
    with _LOCK:
        if "reason" in _STATE:
            return _STATE["reason"]
        reason = None
        if os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "off", "no"):
            reason = f"turned off ({ENV_SWITCH}=0)"
        else:
            try:
                path = library_path(cache)
                if not path.exists():
                    _build(path)
                torch.ops.load_library(str(path))
                _register_fakes()
                verify.use_argmax(argmax_rows)
                _STATE["half_width"] = choose_half_width()
            except Exception as exc:            # a build that fails serves the same forward without it
                reason = f"the attention kernel could not be built here ({type(exc).__name__}: {exc})"[:300]
        _STATE["reason"] = reason
        return reason


def load_default() -> Optional[str]:
    """:func:`load` from this machine's build folder (``cache_dir() / "decoding-attention"``)."""
    return load(cache_dir() / "decoding-attention")


def pack_half(weight: torch.Tensor) -> torch.Tensor:
    """A ``[N, K]`` weight (N a multiple of 4, K of 8) as :func:`half_linear` reads it: float16, ``[N / 4, K / 8,
    4, 8]`` (each tile of 4 outputs one contiguous run). Packs of two weights concatenate along dim 0."""
    n, k = weight.shape
    if n % 4 or k % 8:
        raise ValueError(f"pack_half takes [N, K] with N a multiple of 4 and K of 8, got {tuple(weight.shape)}")
    return weight.detach().half().reshape(n // 4, 4, k // 8, 8).transpose(1, 2).contiguous()


def half_linear(rows: torch.Tensor, packed: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``[M, K]`` float32 rows times a :func:`pack_half` weight (+ bias) -> ``[M, N]`` float32, each row's bits the
    same at any M (``half_linear`` in attention_kernels.cpp). The kernel must be loaded."""
    return torch.ops.decoding_attention.half_linear(rows, packed, bias)


def pack_bf16(weight: torch.Tensor) -> torch.Tensor:
    """A ``[N, K]`` weight as :func:`bf16_linear` reads it: bfloat16 (rounded to nearest), ``[Np / 4, Kp / 32, 4, 32]``
    with N and K padded with zeros to multiples of 4 and 32 (each tile of 4 outputs one contiguous run; a register
    holds one output's 32 weights of a k-chunk). Packs of two weights concatenate along dim 0 when N is a multiple
    of 4."""
    n, k = weight.shape
    padded = torch.nn.functional.pad(weight.detach().float(), (0, -k % 32, 0, -n % 4)).to(torch.bfloat16)
    return padded.reshape(padded.shape[0] // 4, 4, padded.shape[1] // 32, 32).transpose(1, 2).contiguous()


def bf16_linear(rows: torch.Tensor, packed: torch.Tensor, bias: Optional[torch.Tensor], n: int) -> torch.Tensor:
    """``[M, K]`` float32 rows times a :func:`pack_bf16` weight -> ``[M, n]`` float32: the rows rounded to bfloat16,
    float32 sums, + ``bias`` (float32 holding bfloat16 values), rounded to bfloat16 (``kernels.Bf16Linear``'s
    arithmetic), each row's bits the same at any M (``bf16_linear`` in attention_kernels.cpp). The kernel must be
    loaded."""
    return torch.ops.decoding_attention.bf16_linear(rows, packed, bias, n)


def bf16_info() -> dict:
    """Whether this build multiplies bfloat16 pairs in one instruction (AVX-512 BF16's ``vdpbf16ps``; else float32
    multiply-adds on widened pairs), the products :func:`bf16_linear` has run in this process, and the rows one
    group of a product holds."""
    dot, calls, rows = torch.ops.decoding_attention.bf16_info(torch.empty(0))
    return {"dot": bool(dot), "calls": int(calls), "rows": int(rows)}


I8_GROUP = 64         # inputs per activation scale (attention_kernels.cpp)
I8_TILE = 48          # outputs per packed tile


def pack_int8(q: torch.Tensor) -> torch.Tensor:
    """A ``[N, K]`` int8 weight (values within [-127, 127]) as :func:`i8_linear` reads it: ``[Np / 48, Kp / 4, 48, 4]``
    bytes, N and K padded with zeros to multiples of 48 and 64 (a tile of 48 outputs one contiguous run; a register
    holds 16 outputs' 4 weights of a k-quad). A build with AVX-512 VNNI multiplies an unsigned byte by a signed one,
    so there the weights are stored shifted by 128 (as ``uint8``); elsewhere as they are (``int8``). Packs of two
    weights concatenate along dim 0 when N is a multiple of 48."""
    if q.dtype != torch.int8 or q.dim() != 2:
        raise ValueError(f"pack_int8 takes an int8 [N, K] weight, got {q.dtype} {tuple(q.shape)}")
    if q.numel() and int(q.min()) < -127:
        raise ValueError("pack_int8 takes weights within [-127, 127] (-128 has no negation in int8)")
    n, k = q.shape
    padded = torch.nn.functional.pad(q, (0, -k % I8_GROUP, 0, -n % I8_TILE))
    tiles = padded.reshape(padded.shape[0] // I8_TILE, I8_TILE, padded.shape[1] // 4, 4).transpose(1, 2).contiguous()
    if i8_info()["dot"]:
        return (tiles.to(torch.int16) + 128).to(torch.uint8)
    return tiles


def i8_linear(rows: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, bias: Optional[torch.Tensor],
              n: int) -> torch.Tensor:
    """``[M, K]`` float32 rows times a :func:`pack_int8` weight -> ``[M, n]`` float32: each row quantized to int8 per
    group of 64 inputs, integer dot products per group, the groups' float32 scales applied in order, then the
    weight's per-output ``scales`` and ``bias`` (``kernels.W8A8Linear``'s arithmetic), each row's bits the same at
    any M and on every path of the kernel (``i8_linear`` in attention_kernels.cpp). The kernel must be loaded."""
    return torch.ops.decoding_attention.i8_linear(rows, packed, scales, bias, n)


def i8_info() -> dict:
    """Whether this build multiplies bytes with AVX-512 VNNI (``vpdpbusd``; else AVX2's ``vpmaddubsw``), the products
    :func:`i8_linear` has run in this process, and the rows one group of a product holds."""
    dot, calls, rows = torch.ops.decoding_attention.i8_info(torch.empty(0))
    return {"dot": bool(dot), "calls": int(calls), "rows": int(rows)}


HALF_WIDTH_SWITCH = "DECODING_HALF_WIDTH"       # "8" or "16": that path of half_linear, unmeasured


def half_width(width: int = 0) -> int:
    """The path ``half_linear`` takes over more than 2 rows, in floats per register: ``width`` 8 or 16 sets it (16
    only where the build has AVX-512: up to 4 rows then run as one group, more on 16-float registers). Both paths
    give every row the same bits (attention_kernels.cpp), so the choice is speed."""
    return int(torch.ops.decoding_attention.half_width(int(width)))


def half_three(set_to: Optional[bool] = None) -> bool:
    """Whether the 8-float path runs a product over three rows as one group (else 2 + 1: the weights widened twice);
    ``set_to`` sets it. The same bits either way (each row's sums are its own)."""
    return bool(torch.ops.decoding_attention.half_three(-1 if set_to is None else int(bool(set_to))))


def half_calls() -> tuple[int, int]:
    """How many products ``half_linear`` has run on each path (8 floats, 16 floats) in this process."""
    narrow, wide = torch.ops.decoding_attention.half_calls(torch.empty(0))
    return int(narrow), int(wide)


def _fastest(options: tuple, use: Callable[[Any], Any], run: Callable[[], Any], repeats: int) -> tuple[Any, dict]:
    """The option under which ``run`` takes least time (each set with ``use``), and each one's median ms: the
    options timed in turn, ``repeats`` rounds after one that warms them all."""
    times: dict = {option: [] for option in options}
    for round_ in range(repeats + 1):
        for option in options:
            use(option)
            t0 = time.perf_counter()
            run()
            if round_:
                times[option].append(time.perf_counter() - t0)
    ms = {option: 1e3 * sorted(t)[len(t) // 2] for option, t in times.items()}
    best = min(ms, key=ms.get)
    use(best)
    return best, ms


def choose_half_width(repeats: int = 7) -> dict:
    """Set ``half_linear``'s path to the faster one on this machine, measured: the median of ``repeats``
    interleaved timings of a 3072 x 576 product (a layer's gate|up) over 4, 10 and 16 rows (a verify forward's
    widths), where the products are bound by the cores, not by memory. First, whether the 8-float path runs three
    rows as one group (8 products over 3 rows, timed the same way). ``DECODING_HALF_WIDTH=8|16`` sets the path
    unmeasured. Returns what was chosen and why (the start's log shows it)."""
    op = torch.ops.decoding_attention.half_linear
    gen = torch.Generator().manual_seed(0)
    packed = pack_half(torch.randn(3072, 576, generator=gen) * 0.02)
    half_width(8)
    three_rows = torch.randn(3, 576, generator=gen)
    three, _ = _fastest((True, False), half_three, lambda: [op(three_rows, packed, None) for _ in range(8)], repeats)
    widest = half_width(16)
    forced = os.environ.get(HALF_WIDTH_SWITCH, "").strip()
    if forced in ("8", "16"):
        return {"width": half_width(int(forced)), "widest": widest, "three": three,
                "why": f"{HALF_WIDTH_SWITCH}={forced}"}
    if widest == 8:
        return {"width": half_width(8), "widest": 8, "three": three, "why": "this build has only 8-float registers"}
    inputs = [torch.randn(rows, 576, generator=gen) for rows in (4, 10, 16)]
    best, ms = _fastest((8, 16), half_width, lambda: [op(x, packed, None) for x in inputs], repeats)
    return {"width": half_width(), "widest": 16, "three": three,
            "ms": {str(w): round(v, 3) for w, v in ms.items()},
            "why": f"measured: 8 floats {ms[8]:.2f} ms, 16 floats {ms[16]:.2f} ms (4 + 10 + 16 rows of 3072 x 576)"}


def half_choice() -> Optional[dict]:
    """What :func:`choose_half_width` chose when the kernel was loaded (None when it is not loaded)."""
    return _STATE.get("half_width")


def half_note() -> str:
    """One line for the start's log: which path the float16-weight products take here, and why ('' when the
    kernel is not loaded)."""
    chosen = half_choice()
    if not ready() or not chosen:
        return ""
    three = "; three rows as one group" if chosen.get("three") else "; three rows as 2 + 1"
    return (f"float16 products past 2 rows on the {half_width()}-float path ({chosen['why']})"
            + (three if half_width() == 8 else ""))


def ready() -> bool:
    return _STATE.get("reason", "not loaded") is None


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(-1)`` of a ``[rows, n]`` tensor: the kernel's when it is loaded and ``x`` is a float32 CPU
    tensor (same indices, first maximum, a NaN counting as largest), else PyTorch's."""
    if ready() and x.dim() == 2 and x.dtype == torch.float32 and x.device.type == "cpu" and x.shape[1] > 0:
        return (_argmax_op or torch.ops.decoding_attention.argmax_rows)(x)
    return x.argmax(-1)


def fma_gflops(seconds: float = 0.2, repeats: int = 3, loads: bool = True) -> Optional[float]:
    """What this machine's cores multiply-add per second, GFLOP/s, over all of PyTorch's threads (the kernel's
    ``fma_probe``: 12 independent multiply-add chains per worker, on the registers ``half_linear``'s wide products
    use): the best of ``repeats`` timings of about ``seconds`` each. ``loads``: each multiply-add takes an operand
    from L1, as a product's inner loop does (the rate that bounds a product); else registers only (the arithmetic
    units' peak). None when the kernel is not loaded. The compute floor under a wide forward
    (``forward_cost.compute_floor_ms``) divides a forward's products by it."""
    if not ready():
        return None
    return _rate(lambda iters: torch.ops.decoding_attention.fma_probe(torch.empty(0), iters, loads), seconds, repeats)


def i8_gmacs(seconds: float = 0.2, repeats: int = 3) -> Optional[float]:
    """What this machine's cores do of ``i8_linear``'s inner step per second, in billions of byte multiply-adds over
    all of PyTorch's threads (the kernel's ``i8_probe``: AVX-512 VNNI's ``vpdpbusd`` where the build has it, else
    AVX2's sign / ``vpmaddubsw`` / ``vpmaddwd`` step), registers only: the best of ``repeats`` timings of about
    ``seconds`` each. None when the kernel is not loaded or the build has neither path. Twice it, in GFLOP/s, is the
    int8 version's ``compute_floor_ms`` rate."""
    if not ready():
        return None
    rate = _rate(lambda iters: torch.ops.decoding_attention.i8_probe(torch.empty(0), iters), seconds, repeats)
    return rate if rate else None


def _rate(probe: Callable[[int], float], seconds: float, repeats: int) -> float:
    """``probe(iters)`` returns the operations it ran: the best of ``repeats`` rates, in billions a second, each
    timed over about ``seconds`` (the iterations sized by a first, short timing)."""
    iters, spent = 100_000, 0.0
    while spent < seconds / 4 and iters < 1 << 34:           # size one timing to about ``seconds``
        t0 = time.perf_counter()
        probe(iters)
        spent = time.perf_counter() - t0
        if spent < seconds / 4:
            iters *= 4
    iters = max(1, int(iters * seconds / max(spent, 1e-6)))
    best = 0.0
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        done = probe(iters)
        best = max(best, done / (time.perf_counter() - t0) / 1e9)
    return best


_argmax_op = None          # tests put a counting wrapper here


def _register_fakes() -> None:
    @torch.library.register_fake("decoding_attention::half_linear")
    def _(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        return x.new_empty(x.shape[0], w.shape[0] * 4)

    @torch.library.register_fake("decoding_attention::bf16_linear")
    def _(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor], n: int) -> torch.Tensor:
        return x.new_empty(x.shape[0], n)

    @torch.library.register_fake("decoding_attention::i8_linear")
    def _(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, bias: Optional[torch.Tensor], n: int) -> torch.Tensor:
        return x.new_empty(x.shape[0], n)

    @torch.library.register_fake("decoding_attention::scores")
    def _(rows: torch.Tensor, keys_t: torch.Tensor, span: int) -> torch.Tensor:
        kv, d = keys_t.shape[0], keys_t.shape[1]
        heads = rows.shape[1] // d
        return rows.new_empty(rows.shape[0], kv, heads // kv, span)

    @torch.library.register_fake("decoding_attention::values")
    def _(weights: torch.Tensor, values: torch.Tensor, span: int) -> torch.Tensor:
        return weights.new_empty(weights.shape[0], weights.shape[1], weights.shape[2], values.shape[3])
