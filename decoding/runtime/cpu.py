"""What names this CPU in every per-machine key: /proc/cpuinfo's fields, the instruction set PyTorch's kernels run
(and any cap put on oneDNN or MKL), and a short fingerprint of both. No project imports: every runtime module
that keys a cache by the machine (``kernel_choice``, ``routes``, ``attention_kernels``' build and inductor folders)
can use it without an import cycle."""

from __future__ import annotations

import hashlib
import os

import torch


def cpuinfo(field_name: str) -> str:
    """A field of /proc/cpuinfo (the first CPU's), or "" where it cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.split(":", 1)[0].strip() == field_name:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


CAPS_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def pytorch_isa() -> str:
    """The instruction set PyTorch's kernels run here (``AVX512``, ``AVX2``, ``DEFAULT``: ``ATEN_CPU_CAPABILITY``
    caps it), "?" where this PyTorch cannot say."""
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):
        return "?"


def kernel_isa() -> str:
    """The instruction set PyTorch's kernels run here, and any cap put on oneDNN or MKL (``make test`` runs the
    kernel-sensitive tests under AVX2 caps): part of every cached measurement's key, since a capped AVX-512
    machine computes and times like an AVX2 one."""
    caps = [f"{name}={os.environ[name]}" for name in CAPS_ENV[1:] if os.environ.get(name)]
    return ",".join([pytorch_isa(), *caps])


def cpu_fingerprint() -> str:
    """A short hash of the CPU's flags and the kernels' instruction set (:func:`kernel_isa`)."""
    return hashlib.sha1((cpuinfo("flags") + "|" + kernel_isa()).encode()).hexdigest()[:16]
