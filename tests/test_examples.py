"""The page's default example (decoding/harness/examples.py): one prompt, the same everywhere it is used."""

from __future__ import annotations

from decoding.harness import examples, steps
from decoding.harness.examples import default_example, example_prompts, examples_default_first


def test_the_default_example_is_the_bug_fix_and_everything_uses_the_same_one():
    """The page's prompt box and pickers, the start's race (``harness/steps.PROMPT``) and the recorder's first
    prompt are one text: a page left on the chat question while the start judges the summary (or the other way
    round) would tick strategies on one prompt and show another."""
    import app
    from web.settings import Settings
    category, text = default_example()
    assert category == "summarization" and text.startswith("Summarize the following in two sentences")
    assert "Bees" in text
    assert text in example_prompts()[category] and steps.PROMPT == text
    demo = app.build_demo(Settings())
    values = {getattr(b, "label", None): getattr(b, "value", None) for b in demo.blocks.values()}
    assert values["Prompt"] == text and values["Example prompt"] == text and values["Example category"] == category


def test_the_recorder_takes_the_default_example_first_and_every_example_once():
    order = examples_default_first()
    every = [p for group in example_prompts().values() for p in group]
    assert order[0] == default_example()[1] and sorted(order) == sorted(every) and len(set(order)) == len(order)


def test_example_prompts_is_a_copy_callers_may_change():
    got = example_prompts()
    got["chat"].clear()
    assert example_prompts()["chat"] and examples.DEFAULT_EXAMPLE[0] in example_prompts()
