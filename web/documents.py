"""What leaves the server: a finished run's documents (the page's trace document, the CLI's ``--json`` one)."""

from __future__ import annotations

from typing import Optional

from decoding.harness.document import as_document, run_document as harness_document
from decoding.processors import GenerationSettings
from web.loading import Prepared
from web.redact import redact_all


def complete(doc: dict) -> bool:
    """Every strategy of the run finished on its own (no Stop, time limit or error): worth recording."""
    return all(not r.get("error") and r.get("stop_reason") != "cancelled" for r in doc.get("results", ()))


def device_text(doc: dict) -> str:
    """Where a run was measured, in words: the GPU, or the CPU and its thread count."""
    env = doc.get("environment") or {}
    if env.get("gpu"):
        return f"{env['gpu']} (GPU)"
    cpu = env.get("cpu") or env.get("processor") or "a CPU"
    threads = env.get("threads")
    return f"{cpu} (CPU, {threads} threads)" if threads else str(cpu)


def run_document(results: list, prep: Prepared, prompt: str, chat: bool,
                 generation: Optional[GenerationSettings] = None) -> tuple[dict, str]:
    """The run document of a finished run, as the CLI writes it (``decoding/harness/document.py``; server paths
    redacted), and its status line."""
    doc = harness_document(results, prep.pair, prep.seed, prompt, chat, prep.prompt_ids, prep.max_new, generation,
                           redact=redact_all)
    rows = doc["results"]
    failed = [r for r in rows if r["error"]]
    models = list(dict.fromkeys(r["model"] for r in rows if r.get("model"))) or [prep.model]
    message = f"Ran {len(rows)} strategies on {' and '.join(models)}{prep.note}."
    if failed:
        message += " " + "; ".join(f"{r['strategy']}: {r['error']}" for r in failed)
    return doc, message


def cli_document(doc: dict, generation: GenerationSettings) -> dict:
    """The document ``python -m playground run --json`` writes, from a run's document (:func:`run_document`, or a
    recording of one written before ``generation`` was always there): the same keys in the same order."""
    return as_document(doc, generation)


def history_outputs(rows: list[dict]) -> list[list[int]]:
    """Outputs a session's history keeps from a run: those of suffix runs that drafted from history."""
    return [list(r["token_ids"]) for r in rows if r.get("strategy") == "suffix" and not r.get("error")
            and (r.get("params") or {}).get("history") and r.get("token_ids")]
