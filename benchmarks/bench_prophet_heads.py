"""A/B prophet heads in the loop (usage: python benchmarks/bench_prophet_heads.py NAME:FILE ...): greedy and each head
on the held-out chat and math prompts, interleaved in one process, 64 new tokens, 2 repeats, medians."""
import sys, statistics, time, torch, yaml
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from decoding.models import load_model, PRESETS_DIR
from decoding.prophet import load_prophet
from decoding.result import ModelPair
from decoding.runner import run_one, encode_prompt
from decoding.strategies import get_strategy
torch.set_num_threads(2)
heads = [a.split(":") for a in sys.argv[1:]]
target = load_model("smollm2-135m-instruct")
sets = yaml.safe_load((PRESETS_DIR / "prompts.yaml").read_text())
prompts = sets["chat"] + sets["math"]
g = get_strategy("greedy"); p = get_strategy("prophet")
pairs = {n: ModelPair(target, None, prophet=load_prophet(path, target)) for n, path in heads}
gpair = ModelPair(target)
gp = g.parse({}); pp = p.parse({})
ids0 = encode_prompt(target.tokenizer, prompts[0], chat=True)
for n in pairs: run_one(p, pp, ids0, pairs[n], max_new_tokens=16, trace=False)
run_one(g, gp, ids0, gpair, max_new_tokens=16, trace=False)
rows = {n: [] for n in pairs}
for i, text in enumerate(prompts):
    ids = encode_prompt(target.tokenizer, text, chat=True)
    tg, tp = [], {n: [] for n in pairs}
    for rep in range(2):
        r, t, _ = run_one(g, gp, ids, gpair, max_new_tokens=64, trace=False); tg.append(t); gt = r.token_ids
        for n in pairs:
            rr, t, _ = run_one(p, pp, ids, pairs[n], max_new_tokens=64, trace=False); tp[n].append(t)
            eq = rr.token_ids == gt
            tpf = len(rr.token_ids) / max(1, rr.target_forwards)
    for n in pairs:
        rr, _, _ = run_one(p, pp, ids, pairs[n], max_new_tokens=64, trace=False)
        s = statistics.median(tg) / statistics.median(tp[n])
        rows[n].append((s, len(rr.token_ids) / max(1, rr.target_forwards), rr.token_ids == gt))
    print(i, " ".join(f"{n}:{rows[n][-1][0]:.2f}x/{rows[n][-1][1]:.2f}" for n in pairs), flush=True)
for n, rs in rows.items():
    sp = [r[0] for r in rs]
    print(n, "median", round(statistics.median(sp), 3), "geomean", round(statistics.geometric_mean(sp), 3),
          "tpf", round(sum(r[1] for r in rs) / len(rs), 3), "eq", sum(r[2] for r in rs), "/", len(rs))
