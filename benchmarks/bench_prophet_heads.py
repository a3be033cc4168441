"""A/B prophet heads in the loop: greedy and each head on the held-out chat and math prompts, interleaved in one
process after a warm-up, 64 new tokens, 2 repeats, medians.

    python benchmarks/bench_prophet_heads.py old:presets/prophet/old.safetensors new:presets/prophet/prophet.safetensors

Prints one line per prompt (speedup over greedy / tokens per target forward per head), then per head the median
and geometric mean of the speedups, the mean tokens per forward and how many outputs equal greedy's."""
import statistics
import sys
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from decoding.harness.runner import encode_prompt, run_one  # noqa: E402
from decoding.runtime.head import load_prophet  # noqa: E402
from decoding.runtime.kernel_choice import cpu_label  # noqa: E402
from decoding.runtime.models import PRESETS_DIR, load_model  # noqa: E402
from decoding.runtime.pair import ModelPair  # noqa: E402
from decoding.strategies import get_strategy  # noqa: E402

MAX_NEW, REPEATS = 64, 2


def main(args: list[str]) -> None:
    usage = "usage: bench_prophet_heads.py NAME:FILE [NAME:FILE ...]  (prophet heads against greedy)"
    if args and args[0] in ("-h", "--help"):
        print(usage)
        return
    if not args or any(":" not in a for a in args):
        raise SystemExit(usage)
    torch.set_num_threads(2)
    print(f"CPU: {cpu_label()}, {torch.get_num_threads()} threads, torch {torch.__version__}", flush=True)
    target = load_model("smollm2-135m-instruct")
    sets = yaml.safe_load((PRESETS_DIR / "prompts.yaml").read_text())
    prompts = sets["chat"] + sets["math"]
    greedy, prophet = get_strategy("greedy"), get_strategy("prophet")
    greedy_pair = ModelPair(target)
    pairs = {name: ModelPair(target, None, prophet=load_prophet(path, target))
             for name, path in (a.split(":", 1) for a in args)}
    g_params, p_params = greedy.parse({}), prophet.parse({})

    def timed(strategy, params, ids, pair, n=MAX_NEW):
        return run_one(strategy, params, ids, pair, max_new_tokens=n, trace=False)
    warm = encode_prompt(target.tokenizer, prompts[0], chat=True)
    timed(greedy, g_params, warm, greedy_pair, 16)
    for pair in pairs.values():
        timed(prophet, p_params, warm, pair, 16)
    rows: dict[str, list[tuple[float, float, bool]]] = {name: [] for name in pairs}
    for i, text in enumerate(prompts):
        ids = encode_prompt(target.tokenizer, text, chat=True)
        t_greedy, t_head = [], {name: [] for name in pairs}
        reference: list[int] = []
        for _ in range(REPEATS):
            result, seconds, _ = timed(greedy, g_params, ids, greedy_pair)
            t_greedy.append(seconds)
            reference = result.token_ids
            for name, pair in pairs.items():
                t_head[name].append(timed(prophet, p_params, ids, pair)[1])
        for name, pair in pairs.items():
            result = timed(prophet, p_params, ids, pair)[0]
            speedup = statistics.median(t_greedy) / statistics.median(t_head[name])
            rows[name].append((speedup, len(result.token_ids) / max(1, result.target_forwards),
                               result.token_ids == reference))
        print(i, " ".join(f"{n}:{rows[n][-1][0]:.2f}x/{rows[n][-1][1]:.2f}" for n in pairs), flush=True)
    for name, rs in rows.items():
        speedups = [r[0] for r in rs]
        print(f"{name}: median {statistics.median(speedups):.3f}x, geomean {statistics.geometric_mean(speedups):.3f}, "
              f"tokens/forward {statistics.fmean(r[1] for r in rs):.3f}, equal to greedy {sum(r[2] for r in rs)}/"
              f"{len(rs)}")


if __name__ == "__main__":
    main(sys.argv[1:])
