"""The explorer's controls: its ipywidgets and their layout (:func:`build_widgets`), and the
SelectionSlider helpers its callbacks share (a slider needs one option at least: :data:`NONE`
stands for "no step"). :class:`studylib.tools.explorer.widget.Explorer` wires them to the plain
functions of the explorer; ipywidgets is imported when they are built."""
from __future__ import annotations

from typing import Sequence

from studylib.tools.explorer.diagnostics import nearest_step_at_or_before

SAME_RUN = "__same_run__"
NONE = -1  # a SelectionSlider's stand-in for "no step"
HEAD = ("<h3 style='margin:4px 0'>Routing explorer</h3><div style='font-size:90%'>"
        "Colour = a token's top expert at that layer, shade and number = its weight. "
        "Pick a run and a checkpoint; type a prompt (Enter) or press <i>generate</i>.</div>")


def set_options(slider, options, value=None) -> None:
    """Options of a SelectionSlider (which needs at least one: ``-`` stands for none)."""
    options = list(options)
    if not options:
        slider.options = [("-", NONE)]
        slider.value = NONE
        slider.disabled = True
        return
    if value not in options:
        value = options[-1]
    slider.options = options
    slider.value = value
    slider.disabled = len(options) < 2


def selected(slider):
    """A SelectionSlider's value, None for :data:`NONE`."""
    return None if slider.value == NONE else slider.value


def nearest_eval(steps, step):
    """The eval step to show for checkpoint ``step``: the last one at or before it."""
    steps = [s for s in steps if s is not None]
    if not steps:
        return None
    return steps[-1] if step is None else nearest_step_at_or_before(steps, step)


def build_widgets(ex, opts, prompt: str, prompts: Sequence[str], n_new: int) -> None:
    """The explorer's widgets as attributes of ``ex`` (an :class:`~studylib.tools.explorer.widget.Explorer`):
    ``run``, ``step``, ``prompt``, ``compare_run``, ``compare_step``, ``n_new``, ``temperature``,
    ``generate``, ``route_button``, ``diag_step``, the outputs, and ``widget`` (the whole layout)."""
    import ipywidgets as W

    wide = W.Layout(width="520px")
    ex.run = W.Dropdown(options=opts, description="run", layout=wide)
    ex.step = W.SelectionSlider(options=[("-", NONE)], description="checkpoint", continuous_update=False,
                                  layout=W.Layout(width="420px"))
    ex.prompt = W.Combobox(value=prompt, options=list(prompts), description="prompt", ensure_option=False,
                             continuous_update=False, placeholder="type a story start, press Enter",
                             layout=W.Layout(width="620px"))
    ex.compare_run = W.Dropdown(description="compare", layout=wide)
    ex.compare_step = W.SelectionSlider(options=[("-", NONE)], description="its step", continuous_update=False,
                                          layout=W.Layout(width="420px"))
    ex.n_new = W.IntSlider(value=n_new, min=1, max=64, description="new tokens", continuous_update=False,
                             style={"description_width": "initial"})
    ex.temperature = W.FloatSlider(value=0.0, min=0.0, max=1.5, step=0.1, description="temperature",
                                     continuous_update=False, style={"description_width": "initial"})
    ex.generate = W.Button(description="generate", icon="play", tooltip="continue the prompt and route it")
    ex.route_button = W.Button(description="route prompt", tooltip="route the prompt text only")
    ex.diag_step = W.SelectionSlider(options=[("-", NONE)], description="diag step", continuous_update=False,
                                       layout=W.Layout(width="420px"))
    ex.status, ex.tokens, ex.shares, ex.comparison, ex.diag_table = (W.HTML() for _ in range(5))
    ex.grid = W.Image(format="png", layout=W.Layout(max_width="100%"))
    ex.diag_plot = W.Image(format="png", layout=W.Layout(max_width="100%"))
    ex.widget = W.VBox([
        W.HTML(HEAD),
        W.HBox([ex.run, ex.step]),
        W.HBox([ex.compare_run, ex.compare_step]),
        ex.prompt,
        W.HBox([ex.route_button, ex.generate, ex.n_new, ex.temperature]),
        ex.status, ex.tokens,
        W.HBox([ex.grid, W.VBox([ex.shares, ex.comparison])]),
        W.HTML("<h4 style='margin:4px 0'>Router diagnostics over training (metrics.jsonl)</h4>"),
        ex.diag_step, ex.diag_plot, ex.diag_table,
    ])
    ex.widget.add_class("studylib-explorer")
    for w, name in ((ex.status, "status"), (ex.grid, "grid"), (ex.shares, "shares"),
                    (ex.comparison, "comparison"), (ex.diag_plot, "diag-plot"), (ex.prompt, "prompt")):
        w.add_class(f"studylib-{name}")
