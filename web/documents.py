"""What leaves the server: a finished run's documents (the page's trace document, the CLI's ``--json`` one)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from decoding.harness.runner import environment
from decoding.processors import GenerationSettings
from web.loading import Prepared
from web.redact import redact_all, redact_paths


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
    """The trace document of a finished run (server paths redacted) and its status line."""
    rows = [r.to_dict() for r in results]
    for row in rows:
        row["error"] = row["error"] and redact_paths(row["error"])
    doc = {"environment": redact_all(environment(prep.pair, prep.seed)), "prompt": prompt, "chat": chat,
           "prompt_ids": prep.prompt_ids, "max_new_tokens": prep.max_new, "results": rows}
    if generation is not None:
        doc["generation"] = dataclasses.asdict(generation)
    failed = [r for r in rows if r["error"]]
    models = list(dict.fromkeys(r["model"] for r in rows if r.get("model"))) or [prep.model]
    message = f"Ran {len(rows)} strategies on {' and '.join(models)}{prep.note}."
    if failed:
        message += " " + "; ".join(f"{r['strategy']}: {r['error']}" for r in failed)
    return doc, message


CLI_KEYS = ("environment", "prompt", "chat", "prompt_ids", "max_new_tokens", "generation", "results")


def cli_document(doc: dict, generation: GenerationSettings) -> dict:
    """The document ``python -m decoding run --json`` writes, from a run's trace document (:func:`run_document`,
    or a recording of one): the same keys in the same order, ``generation`` always present as the CLI has it."""
    out = {key: doc[key] for key in CLI_KEYS[:5]}
    out["generation"] = doc.get("generation") or dataclasses.asdict(generation)
    out["results"] = doc["results"]
    return out


def history_outputs(rows: list[dict]) -> list[list[int]]:
    """Outputs a session's history keeps from a run: those of suffix runs that drafted from history."""
    return [list(r["token_ids"]) for r in rows if r.get("strategy") == "suffix" and not r.get("error")
            and (r.get("params") or {}).get("history") and r.get("token_ids")]


# --------------------------------------------------------------------------- what leaves the server
# a path starts with / or ~/ (not inside a word, a URL or a relative path, and not the / of a closing tag
# such as </script>, which is markup to escape, not a path to hide)
