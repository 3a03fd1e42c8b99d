"""The routing explorer: where the router sends which token, and how that changes over training.

Plain functions (unit-tested; the widgets only call them), by module:

* :mod:`.runs` -- :func:`list_runs` finds run directories under an outputs folder
  (``<root>/<preset>/runs/<model>/seed<N>/``, or a preset's own folder) as :class:`RunInfo`
  (path + preset / model / tag / seed labels; its saved steps, its model at a step), variants'
  runs included; :func:`runs_table` lists them;
* :mod:`.view` -- :class:`RoutingView`, how one model routed one token sequence;
* :mod:`.routing` -- :func:`route_text` / :func:`route_ids` run tokens through a model and return
  a view: the tokens (SentencePiece pieces) and, per layer, each token's chosen expert(s) and their
  gate weights (the renormalised top-k weights of the sparse MoE; the soft MoE's gate over all K
  experts); a dense model gives a view whose :attr:`RoutingView.status` says there is nothing to
  route. :func:`generate_and_route` continues a prompt with :func:`studylib.run.decode.generate`
  and routes the prompt and the generated tokens; :func:`samples_per_model` does it for one run
  of each model;
* :mod:`.tables` -- :func:`expert_shares` (per layer, the share of the text's tokens each expert
  got), :func:`compare_views` (two runs or two checkpoints on the same tokens: top-1 agreement per
  layer, also after the best relabelling of experts, overlap of the chosen sets, weight distance);
* :mod:`.diagnostics` -- :func:`diagnostics_over_training` (the per-layer router statistics of
  ``metrics.jsonl`` as a frame, with a step selector);
* :mod:`.figures` -- :func:`routing_grid_figure` (a view as a tokens x layers grid, optionally
  beside a second view), :func:`diagnostics_figure`, :func:`figure_png`;
* :mod:`.markup` -- HTML for the widgets (:func:`tokens_html`, :func:`table_html`);
* :mod:`.controls` -- the widgets themselves, their layout and the slider helpers.

:class:`Explorer` (:mod:`.widget`, ``build_explorer(outputs_root)``) wires these to ipywidgets: a
run dropdown, a checkpoint slider over the saved steps, a prompt box with preset prompts, an
optional second run / checkpoint to compare with, a generate button, and output areas (the grid as
an image, the shares and comparison tables, the diagnostics plot with its own step selector).
"""
from studylib.tools.explorer.diagnostics import ROUTER_METRICS, SOFT_METRICS, diagnostics_over_training
from studylib.tools.explorer.figures import DIAG_PLOT_METRICS, diagnostics_figure, figure_png, routing_grid_figure
from studylib.tools.explorer.markup import table_html, tokens_html
from studylib.tools.explorer.routing import generate_and_route, route_ids, route_text, samples_per_model
from studylib.tools.explorer.runs import RunInfo, list_runs, run_info, runs_table
from studylib.tools.explorer.tables import compare_views, expert_shares
from studylib.tools.explorer.view import RoutingView
from studylib.tools.explorer.widget import PRESET_PROMPTS, Explorer, build_explorer

__all__ = [
    "DIAG_PLOT_METRICS", "PRESET_PROMPTS", "ROUTER_METRICS", "SOFT_METRICS", "Explorer", "RoutingView", "RunInfo",
    "build_explorer", "compare_views", "diagnostics_figure", "diagnostics_over_training", "expert_shares",
    "figure_png", "generate_and_route", "list_runs", "route_ids", "route_text", "routing_grid_figure", "run_info",
    "runs_table", "samples_per_model", "table_html", "tokens_html",
]
