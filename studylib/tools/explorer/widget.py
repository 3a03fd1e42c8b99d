"""The explorer's ipywidgets front end (:class:`Explorer`, :func:`build_explorer`).

Pick a run and a checkpoint, type a prompt (or pick one), optionally a second run / checkpoint
to compare with, generate a continuation; the outputs are the routing grid (an image), the
token text, the expert-share and comparison tables and the router diagnostics over training
with their own step selector. Every callback is a plain method that calls the plain functions of
this package, so the explorer can be driven (and tested) from Python. The widgets themselves and
their layout are :mod:`studylib.tools.explorer.controls`; ipywidgets is imported when an explorer
is built (optional dependency).
"""
from __future__ import annotations

import html
import os
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd

from studylib.run.layout import CONFIG_FILE
from studylib.run.rundir import LoadedRun, RunDir
from studylib.tools.explorer.controls import NONE, SAME_RUN, build_widgets, nearest_eval, selected, set_options
from studylib.tools.explorer.diagnostics import ROUTER_METRICS, diagnostics_over_training
from studylib.tools.explorer.figures import diagnostics_figure, figure_png, routing_grid_figure
from studylib.tools.explorer.markup import table_html, tokens_html
from studylib.tools.explorer.routing import generate_and_route, route_ids, route_text
from studylib.tools.explorer.runs import list_runs, run_info
from studylib.tools.explorer.tables import compare_views, expert_shares
from studylib.tools.explorer.view import RoutingView

PRESET_PROMPTS = (
    "Once upon a time",
    "Once upon a time, there was a little girl named Lily. She loved to",
    "The dog ran to the park and",
    "Tom and his mom went to the store. They wanted to buy",
    "One day, a big red ball",
)
class Explorer:
    """ipywidgets front end over the functions of :mod:`studylib.tools.explorer`.

    Widgets: ``run`` (Dropdown of :func:`list_runs`), ``step`` (SelectionSlider over
    :meth:`RunDir.checkpoint_steps`), ``prompt`` (Combobox with :data:`PRESET_PROMPTS`; Enter
    applies), ``compare_run`` (none / another checkpoint of the same run / another run) with
    ``compare_step``, ``n_new`` / ``temperature`` / ``generate`` (Button), ``diag_step``
    (SelectionSlider over the eval steps). Outputs: ``grid`` (Image), ``tokens`` / ``shares`` /
    ``comparison`` / ``diag_table`` / ``status`` (HTML), ``diag_plot`` (Image). The last results
    are kept as attributes (``view``, ``compare``, ``grid_figure``, ``shares_df``,
    ``comparison_df``, ``diag_df``, ``diag_figure``, ``error``) for tests and scripting.
    Display it with ``display(explorer)`` (or as a cell's last expression).
    """

    def __init__(self, outputs_root: str | os.PathLike, run: str | os.PathLike | None = None,
                 step: Optional[int] = None, prompt: str = PRESET_PROMPTS[0],
                 prompts: Sequence[str] = PRESET_PROMPTS, n_new: int = 24, cache_size: int = 8):
        self.root = Path(outputs_root)
        self.runs = list_runs(self.root)
        self.mode = "text"  # "text": route the prompt; "generate": continue it and route everything
        self.view: Optional[RoutingView] = None
        self.compare: Optional[RoutingView] = None
        self.grid_figure = self.diag_figure = None
        self.shares_df = self.comparison_df = self.diag_df = None
        self.diag_df_all = pd.DataFrame()  # all eval steps of the selected run
        self.error: Optional[str] = None
        self._models: OrderedDict = OrderedDict()
        self._cache_size = cache_size
        self._hold = False
        opts = self._run_options(run)
        self._build_widgets(opts, prompt, prompts, n_new)
        self._connect()
        if not opts:
            self.status.value = f"<b>no runs with checkpoints under {html.escape(str(self.root))}</b>"
            return
        with self._held():
            self.run.value = str(Path(run)) if run is not None else opts[0][1]
        self.on_run_change(step=step)

    # ---- construction -----------------------------------------------------------------------
    def _run_options(self, run) -> list[tuple[str, str]]:
        """(label, path) of the runs found, plus ``run`` if it is a run directory outside them."""
        opts = [(r.label, str(r.path)) for r in self.runs]
        if run is not None and str(Path(run)) not in [v for _, v in opts]:
            if (Path(run) / CONFIG_FILE).is_file():
                info = run_info(run)
                self.runs.append(info)
                opts.append((info.label, str(Path(run))))
        return opts

    def _build_widgets(self, opts, prompt: str, prompts: Sequence[str], n_new: int) -> None:
        build_widgets(self, opts, prompt, prompts, n_new)

    def _connect(self) -> None:
        self.run.observe(self.on_run_change, names="value")
        self.step.observe(self.on_step_change, names="value")
        self.prompt.observe(self.on_prompt_change, names="value")
        self.compare_run.observe(self.on_compare_change, names="value")
        self.compare_step.observe(self.on_compare_step_change, names="value")
        self.diag_step.observe(self.on_diag_step_change, names="value")
        self.generate.on_click(self.on_generate)
        self.route_button.on_click(self.on_route)

    # ---- plumbing ---------------------------------------------------------------------------
    @contextmanager
    def _held(self):
        """Callbacks fired while widget values are set programmatically do nothing."""
        prev, self._hold = self._hold, True
        try:
            yield
        finally:
            self._hold = prev

    def _repr_mimebundle_(self, **kwargs):
        data = self.widget._repr_mimebundle_(**kwargs)
        if isinstance(data, tuple):
            data, meta = data
        else:
            meta = {}
        data = dict(data or {})
        data["text/plain"] = self.summary()
        return data, meta

    def summary(self) -> str:
        v = self.view
        lines = [f"Routing explorer over {self.root} ({len(self.runs)} runs); the widgets need a live "
                 f"Jupyter kernel (JupyterLab / Notebook)."]
        if self.run.value:
            lines.append(f"run {self.run.value}, checkpoint step {selected(self.step)}")
        if v is not None:
            lines.append(f"{len(v.ids)} tokens, status: {v.status}")
        if self.error:
            lines.append(f"error: {self.error}")
        return "\n".join(lines)

    def load(self, run_dir, step) -> LoadedRun:
        """A run at a step (:meth:`RunDir.load_model`), from a small LRU cache."""
        key = (str(run_dir), step)
        if key in self._models:
            self._models.move_to_end(key)
            return self._models[key]
        got = RunDir(run_dir).load_model(step=step)
        self._models[key] = got
        while len(self._models) > self._cache_size:
            self._models.popitem(last=False)
        return got

    def _label(self, run_dir) -> str:
        for r in self.runs:
            if str(r.path) == str(run_dir):
                return r.short_label
        return Path(run_dir).name

    # ---- callbacks --------------------------------------------------------------------------
    def on_run_change(self, change=None, step: Optional[int] = None) -> None:
        """A run was picked: its checkpoints feed the slider, its evals the diagnostics."""
        if self._hold and change is not None:
            return
        rd = self.run.value
        with self._held():
            steps = RunDir(rd).checkpoint_steps() if rd else []
            set_options(self.step, steps, step if step is not None else (steps[-1] if steps else None))
            self._update_compare_runs(rd)
            self._update_compare_steps()
            self._update_max_new_tokens(rd, steps)
            self.diag_df_all = diagnostics_over_training(rd) if rd else pd.DataFrame()
            dsteps = self.diag_df_all.attrs.get("steps", [])
            set_options(self.diag_step, dsteps, nearest_eval(dsteps, selected(self.step)))
        self.refresh()
        self.refresh_diagnostics()

    def on_step_change(self, change=None) -> None:
        if self._hold:
            return
        with self._held():
            if self.compare_run.value == SAME_RUN:
                self._update_compare_steps()
            dsteps = [o for o in self.diag_step.options if o != NONE and not isinstance(o, tuple)]
            if dsteps:
                self.diag_step.value = nearest_eval(dsteps, selected(self.step))
        self.refresh()
        self.refresh_diagnostics()

    def on_prompt_change(self, change=None) -> None:
        if self._hold:
            return
        self.mode = "text"
        self.refresh()

    def on_route(self, button=None) -> None:
        self.mode = "text"
        self.refresh()

    def on_generate(self, button=None) -> None:
        self.mode = "generate"
        self.refresh()

    def on_compare_change(self, change=None) -> None:
        if self._hold:
            return
        with self._held():
            self._update_compare_steps()
        self.refresh()

    def on_compare_step_change(self, change=None) -> None:
        if self._hold:
            return
        self.refresh()

    def on_diag_step_change(self, change=None) -> None:
        if self._hold:
            return
        self.refresh_diagnostics()

    def _update_compare_runs(self, rd: str) -> None:
        """Compare with nothing, another checkpoint of ``rd`` or another run (kept if still offered)."""
        copts = [("(none)", ""), ("same run, another checkpoint", SAME_RUN)] + \
                [(r.label, str(r.path)) for r in self.runs if str(r.path) != rd]
        keep = self.compare_run.value if self.compare_run.value in [v for _, v in copts] else ""
        self.compare_run.options = copts
        self.compare_run.value = keep

    def _update_max_new_tokens(self, rd: str, steps: list[int]) -> None:
        try:
            ctx = self.load(rd, selected(self.step)).config.context if rd and steps else 64
            self.n_new.max = max(1, min(128, ctx - 1))
        except Exception:
            pass

    def _update_compare_steps(self) -> None:
        c = self.compare_run.value
        if not c:
            set_options(self.compare_step, [])
            self.compare_step.disabled = True
            return
        rd = self.run.value if c == SAME_RUN else c
        steps = RunDir(rd).checkpoint_steps()
        if c == SAME_RUN:  # default: the first checkpoint, to see how routing moved since
            others = [s for s in steps if s != selected(self.step)] or steps
            value = self.compare_step.value if self.compare_step.value in others else (others[0] if others else None)
            set_options(self.compare_step, steps, value)
            self.compare_step.disabled = len(steps) < 2
        else:
            value = self.compare_step.value if self.compare_step.value in steps else (steps[-1] if steps else None)
            set_options(self.compare_step, steps, value)

    # ---- rendering --------------------------------------------------------------------------
    def compute(self) -> tuple[RoutingView, Optional[RoutingView]]:
        """The current view (and comparison view) from the widget values."""
        rd = self.run.value
        loaded = self.load(rd, selected(self.step))
        text, label = self.prompt.value or "", self._label(rd)
        if self.mode == "generate":
            view = generate_and_route(loaded.model, loaded.tokenizer, text, self.n_new.value,
                                      temperature=self.temperature.value, seed=0, label=label, step=loaded.step)
        else:
            view = route_text(loaded.model, loaded.tokenizer, text, label=label, step=loaded.step)
        return view, self._compute_compare(view, loaded)

    def _compute_compare(self, view: RoutingView, loaded: LoadedRun) -> Optional[RoutingView]:
        """The comparison view: the same token ids through the other model when it shares the
        tokenizer (generated tokens included), else the prompt text through it; None if off."""
        c = self.compare_run.value
        if not c:
            return None
        crd = self.run.value if c == SAME_RUN else c
        other = self.load(crd, selected(self.compare_step))
        tok, ctok, text = loaded.tokenizer, other.tokenizer, self.prompt.value or ""
        clabel = self._label(crd)
        same_tok = ctok is not None and tok is not None and ctok.get_piece_size() == tok.get_piece_size() \
            and list(ctok.encode(text)) == list(tok.encode(text))
        if not same_tok:
            return route_text(other.model, ctok, text, label=clabel, step=other.step)
        cview = route_ids(other.model, ctok, view.ids, text=view.text, n_prefix=view.n_prefix,
                          n_prompt=view.n_prompt, label=clabel, step=other.step)
        cview.continuation = view.continuation
        return cview

    def refresh(self) -> None:
        """Recompute the view(s) and redraw the grid, the token text and the tables."""
        if self._hold or not self.run.value:
            return
        try:
            view, other = self.compute()
        except Exception as e:  # shown in the widget, not raised into the front end
            self.error = f"{type(e).__name__}: {e}"
            self.status.value = f"<span style='color:#b2182b'><b>error:</b> {html.escape(self.error)}</span>"
            return
        self.error = None
        self.view, self.compare = view, other
        self.grid_figure = routing_grid_figure(view, other)
        self.grid.value = figure_png(self.grid_figure)
        self.tokens.value = tokens_html(view)
        self.shares_df = expert_shares(view)
        what = {"moe": "share of token->expert assignments", "soft": "mean gate weight"}.get(view.kind, "shares")
        self.shares.value = table_html(self.shares_df, f"Expert shares for this text ({what})", gradient=True)
        self._render_comparison(view, other)
        self.status.value = self._status_html(view)

    def _render_comparison(self, view: RoutingView, other: Optional[RoutingView]) -> None:
        self.comparison_df = None
        self.comparison.value = ""
        if other is None:
            return
        try:
            self.comparison_df = compare_views(view, other)
            self.comparison.value = table_html(self.comparison_df, f"Comparison: {view.title} vs {other.title}")
        except ValueError as e:
            self.comparison.value = f"<i>{html.escape(str(e))}</i>"

    @staticmethod
    def _status_html(view: RoutingView) -> str:
        where = html.escape(view.title)
        if view.status == "ok":
            return (f"{where}: {view.kind} routing, {view.num_experts} experts, "
                    f"{view.top_k} per token; {len(view.routed_layers)} routed of {view.n_layers} layers")
        return f"{where}: <b>{html.escape(view.status)}</b>"

    def refresh_diagnostics(self) -> None:
        """Redraw the diagnostics plot and the table at the selected eval step."""
        if self._hold or not self.run.value:
            return
        full = self.diag_df_all
        if full is None or full.empty:
            self.diag_df, self.diag_figure = full, None
            self.diag_table.value = "<i>no evaluation records in metrics.jsonl yet</i>"
            return
        s = selected(self.diag_step)
        self.diag_figure = diagnostics_figure(full, step=s)
        self.diag_plot.value = figure_png(self.diag_figure)
        self.diag_df = diagnostics_over_training(self.run.value, step=s)
        cols = ["layer", "kind", "val_loss", *ROUTER_METRICS, *(["note"] if self.diag_df["note"].any() else [])]
        tab = self.diag_df[[c for c in cols if c in self.diag_df]].set_index("layer")
        self.diag_table.value = table_html(tab, f"At eval step {self.diag_df.attrs.get('selected_step')}")


def build_explorer(outputs_root: str | os.PathLike, run: str | os.PathLike | None = None, **kwargs) -> Explorer:
    """An :class:`Explorer` over the runs below ``outputs_root`` (``run`` selected first)."""
    return Explorer(outputs_root, run=run, **kwargs)
