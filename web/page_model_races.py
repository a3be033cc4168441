"""One-click model races: a preset trained from another (``trained_for`` a strategy) raced against its base on that
strategy. Each button sets the form to the race and clicks Run, so the race is the visitor's own Run."""

from __future__ import annotations

import dataclasses
from typing import Any

import gradio as gr

from decoding.runtime.models import runs_here
from decoding.strategies import registry
from web.page_names import param_input
from web.page_parts import Inputs


@dataclasses.dataclass(frozen=True)
class ModelRace:
    """A one-click example: ``strategy`` on ``model`` against the same on ``versus``, a preset trained from it to
    speed that strategy up (``trained_for``: a consistency-trained model for Jacobi)."""
    model: str
    versus: str
    strategy: str
    params: tuple = ()        # ((field, value), ...) of ``strategy`` the trained model was trained for

    @property
    def title(self) -> str:
        what = "consistency-trained" if self.strategy == "jacobi" else f"trained for {self.strategy}"
        label = registry()[self.strategy].label or self.strategy
        return f"Example: {label} on {self.model} vs {label} on {self.versus} ({what})"


def model_races(presets: dict) -> list[ModelRace]:
    """The one-click races the page offers: each preset with ``trained_for`` a known strategy and valid
    ``trained_params`` for it, whose base and it both load on this machine."""
    reg, races = registry(), []
    for name, p in presets.items():
        if p.trained_for not in reg or p.base not in presets or not (runs_here(p) and runs_here(presets[p.base])):
            continue
        try:
            params = dict(p.trained_params or {})
            reg[p.trained_for].parse(params)
        except (ValueError, TypeError) as exc:     # a preset's mistake: no button, and the log says why
            print(f"preset {name}: trained_params for {p.trained_for} ignored ({exc}); no race example")
            continue
        races.append(ModelRace(p.base, name, p.trained_for, tuple(sorted(params.items()))))
    return races


# clicks the Run button once the form shows the example's values: the example is the visitor's own Run
CLICK_RUN = "() => { document.querySelector('#run').click(); }"



def build_model_races(presets: dict) -> dict[ModelRace, Any]:
    """The row of example buttons (none when no preset qualifies here): race -> its button."""
    races = model_races(presets)
    if not races:
        return {}
    with gr.Row(elem_id="model-races"):      # one click: a trained model against its base, on its strategy
        return {race: gr.Button(race.title, size="sm", elem_classes=["dp-example"]) for race in races}


def _setter(values: tuple):
    return lambda: values


def wire_model_races(buttons: dict[ModelRace, Any], inputs: Inputs) -> None:
    """Each example button: the form set to the race (its two models, its one strategy and the parameters the
    trained model was trained for), then a click on Run, so the race is the request a visitor's Run sends (same
    checks, line, recording, views and autoplay)."""
    for race, button in buttons.items():
        fields = ("model", "versus", "assistant", "strategies",
                  *(param_input(race.strategy, f) for f, _ in race.params))
        values = (race.model, race.versus, "none", [race.strategy], *(v for _, v in race.params))
        button.click(_setter(values), None, inputs.list(fields), queue=False,
                     api_visibility="private").then(None, js=CLICK_RUN, api_visibility="private")
