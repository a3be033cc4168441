"""A training command asked to stop (a leased GPU call's ``timeout``: SIGTERM) ends as its time budget would:
the step finishes, the last evaluation, checkpoint, summary and export follow (playground/training/stopping.py).
Before, SIGTERM killed it mid-step and the export and every step since the last checkpoint were lost."""

from __future__ import annotations

import signal
import threading

import torch

from playground.training.stopping import Stop, stop_requested
from tiny_models import prompt, tiny_causal


def test_sigterm_sets_the_flag_inside_and_the_old_handler_comes_back():
    before = signal.getsignal(signal.SIGTERM)
    with stop_requested() as stop:
        assert not stop and signal.getsignal(signal.SIGTERM) is not before
        signal.raise_signal(signal.SIGTERM)           # the default action would end this process
        assert stop and stop.signal == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before


def test_off_the_main_thread_nothing_is_installed():
    seen = []

    def run():
        with stop_requested() as stop:
            seen.append((bool(stop), signal.getsignal(signal.SIGTERM)))
    before = signal.getsignal(signal.SIGTERM)
    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen == [(False, before)]


def test_the_prophet_trainer_stops_at_the_step_it_was_asked_to(tmp_path):
    """A stop asked before the first step: one step, then the evaluation and the checkpoint (a trainer that
    ignored it would run all 50)."""
    from playground import train_prophet as tp
    from decoding.runtime.head import Prophet, ProphetConfig
    target = tiny_causal("llama", seed=0, scale=8.0)
    with torch.no_grad():
        out = target.model.generate(torch.tensor([prompt(4, seed=1)]), max_new_tokens=8, do_sample=False,
                                    output_hidden_states=True, return_dict_in_generate=True, pad_token_id=0,
                                    eos_token_id=None)
    hid = torch.cat([out.hidden_states[0][-1][:, -1:]] + [h[-1] for h in out.hidden_states[1:]], 1)
    records = [{"tokens": out.sequences[0, 4:], "hidden": hid[0].half()}] * 4
    args = tp.parse_args(["--steps", "50", "--batch", "2", "--eval-every", "50"])
    head = Prophet(ProphetConfig.for_target(target), target, tp.draft_vocabulary(records, 64, (2,)))
    data = tp.Answers(records, 3)
    stop = Stop()
    stop.signal = "SIGTERM"
    log = tp.train(head, data, data, args, out_dir=tmp_path, stop=stop)
    assert log["steps_done"] == 1 and "top1" in log
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=False)["step"] == 1


def test_the_consistency_command_exports_when_sigterm_arrives_mid_training(tmp_path, tiny_model, monkeypatch):
    """SIGTERM during step 2 of 40: the command still evaluates, checkpoints, exports and writes its summary,
    which says it was stopped."""
    import playground.train_consistency as tc
    calls = []
    real = tc.losses

    def losses(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            signal.raise_signal(signal.SIGTERM)
        return real(*args, **kwargs)
    monkeypatch.setattr(tc, "losses", losses)
    threads, before = torch.get_num_threads(), signal.getsignal(signal.SIGTERM)
    try:
        summary = tc.main(["--target", tiny_model, "--data-dir", str(tmp_path / "data"),
                           "--out-dir", str(tmp_path / "out"), "--threads", "1", "--batch", "2",
                           "--eval-every", "100", "--eval-records", "2", "--eval-prompts", "1", "--eval-tokens", "6",
                           "--no-eval-at-start", "--self-seeds", "1", "--per-seed", "3", "--held-seeds", "0",
                           "--templates", "4", "--held-templates", "3", "--held-records", "2", "--max-new", "10",
                           "--block", "4", "--max-iters", "3", "--shard-size", "4", "--steps", "40",
                           "--export", str(tmp_path / "a.safetensors")])
    finally:
        torch.set_num_threads(threads)
    assert summary["steps_done"] == 2 and summary["stopped"] == "SIGTERM"
    assert summary["last"]["stopped"] == "SIGTERM" and "decode" in summary["last"]     # the last, full evaluation
    assert (tmp_path / "a.safetensors").is_file() and (tmp_path / "out" / "checkpoint.pt").is_file()
    assert signal.getsignal(signal.SIGTERM) is before                                   # restored on the way out
