"""The study's HTML report: the answer first (:func:`answer_cells`: the verdicts, their figures,
what they do not show, the runs' facts, computed from the study's tables), then a
contents list and the executed notebooks stitched into one notebook (parameters cells, stderr and
widget views dropped; the parameter accounting of notebook 01 last, as an appendix), exported as
one self-contained HTML file with nbconvert (code hidden, figures embedded).
"""
from __future__ import annotations

import base64
import copy
import json
import os
import platform
import time
from pathlib import Path
from typing import Optional, Sequence

from studylib.storage.files import write_atomic

KERNEL = "python3"
_WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def _clean_outputs(outputs: list) -> list:
    """Report copy of a cell's outputs: no stderr streams (progress bars, warnings) and no
    widget views (their state is not saved)."""
    out = []
    for o in outputs:
        if o.get("output_type") == "stream" and o.get("name") == "stderr":
            continue
        if o.get("output_type") in ("display_data", "execute_result") and _WIDGET_MIME in o.get("data", {}):
            continue
        out.append(o)
    return out


QUESTION = ("At a matched parameter budget, does a sparse mixture-of-experts decoder reach a lower validation "
            "loss than a dense one: ahead of the dense model with the same active parameters, behind the one "
            "with the same total parameters, as the paper finds?")
HEADLINE, MAP = "headline_gaps", "token_budget_gaps"  # the tables (and figures) notebooks 03 and 09 write


def _read_table(out_dir: Path, name: str):
    import pandas as pd

    path = out_dir / "tables" / f"{name}.csv"
    return pd.read_csv(path) if path.is_file() else None


def _figure_cell(path: Path):
    """A code cell (hidden in the report) whose output is the PNG at ``path``."""
    from nbformat.v4 import new_code_cell, new_output

    c = new_code_cell("")
    c.outputs = [new_output("display_data", data={"image/png": base64.b64encode(path.read_bytes()).decode(),
                                                  "text/plain": path.name})]
    return c


def headline_sentences(gaps, out_dir: Path) -> tuple[str, str]:
    """(the headline verdict, what it does not show) from ``headline_gaps.csv``'s rows: the words
    of :func:`studylib.study.analysis.text.headline_verdict`, as notebook 03 prints them."""
    from studylib.study.analysis import text

    g = gaps.copy()
    g.index = ["active", "total"]  # notebook 03 writes the matched-active row, then the matched-total one
    dense_active, moe, dense_total = g.loc["active", "a"], g.loc["active", "b"], g.loc["total", "b"]
    summaries = _summaries(out_dir, moe)
    tokens = summaries[0].get("tokens") if summaries else None
    preset = summaries[0].get("preset", "") if summaries else ""
    verdict, _, limits = text.headline_verdict(g, dense_active, moe, dense_total, preset, tokens).partition(
        "What this does not show: ")
    return verdict.strip(), limits.strip()


def map_sentences(out_dir: Path, table) -> list[str]:
    """The token-budget map's sentences, notebook 09's words rebuilt from its tables: each gap's
    points by verdict, the fits (when their tables exist) and the paper's range."""
    from studylib.study.analysis import budget_fits as bf
    from studylib.study.analysis import budget_map as bm

    out = [bm.point_sentences(table, gap) for gap in bm.GAPS]
    fits = [_read_table(out_dir, f"token_budget_{n}") for n in ("fit", "crossing", "loo", "loss_law", "extrapolation")]
    if all(f is not None for f in fits):
        out += bf.fit_sentences(*fits, loss_loo=_read_table(out_dir, "token_budget_loss_loo"))
    return out + [bm.paper_sentence(table)]


#: the comparison tables the notebooks write, one or more families each (notebook 10's is
#: :func:`studylib.study.analysis.downstream.metric_gaps`'s)
FAMILY_TABLES = (("02", "table1_gaps_vs_reference"), ("06", "granularity_gaps"), ("07", "iso_width_gap"),
                 ("10", "table10_downstream_gaps"), ("12", "router_variants_gaps"))


def family_sentences(out_dir: Path) -> list[str]:
    """One line per family table the study wrote (:data:`FAMILY_TABLES`), in the notebook's own
    words: :func:`studylib.study.analysis.text.comparison_sentences` (notebook 10:
    :func:`studylib.study.analysis.downstream.gap_sentences`). Tables without the family's columns
    (written before the verdicts) are left out."""
    from studylib.study.analysis import text

    out = []
    for nb, name in FAMILY_TABLES:
        t = _read_table(out_dir, name)
        if t is None or t.empty or "verdict" not in t or "p_holm" not in t:
            continue
        if nb == "10":
            from studylib.study.analysis import downstream

            out.append(f"Notebook {nb}: {downstream.gap_sentences(t)}")
            continue
        for fam, g in t.groupby("family", sort=False, dropna=False):
            out.append(f"Notebook {nb}: {text.comparison_sentences(g.set_index(g.columns[0]))}")
    return out


def _summaries(out_dir: Path, model: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out_dir / "runs" / model).glob("seed*/summary.json"))]


def _machine(summaries: list[dict]) -> str:
    """The runs' device (the GPU's name on CUDA) and this machine's CPU model and cores (the
    machine that executed the notebooks; runs trained on a Dask cluster may have used others)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    device = summaries[0].get("device", "?") if summaries else "?"
    if str(device).startswith("cuda"):
        try:
            import torch

            device = f"{device} ({torch.cuda.get_device_name(0)})"
        except Exception:  # noqa: BLE001 - the name is a nicety
            pass
    return f"device {device}; CPU {cpu}, {os.cpu_count()} cores ({platform.node()})"


def _facts(out_dir: Path, moe: Optional[str], paths: Sequence[Path]) -> str:
    """The preset, seeds, machine and times, as one list."""
    import nbformat

    runs = _summaries(out_dir, moe) if moe else []
    nb_s = 0.0
    for p in paths:
        nb_s += float(nbformat.read(str(p), as_version=4).metadata.get("papermill", {}).get("duration") or 0.0)
    trained = sorted((out_dir / "runs").glob("**/summary.json")) if (out_dir / "runs").is_dir() else []
    train_s = sum(float(json.loads(p.read_text()).get("wall_time_s") or 0.0) for p in trained)
    preset = runs[0].get("preset") if runs else out_dir.name
    lines = [f"* Preset `{preset}`" + (f"; the headline MoE `{moe}`" if moe else ""),
             f"* Seeds: {', '.join(str(r['seed']) for r in runs) or 'none found'}",
             f"* Machine (that executed the notebooks): {_machine(runs)}",
             f"* Time: {len(trained)} runs, {train_s:.0f} s of training wall time summed over runs (parallel jobs "
             f"overlap); the {len(paths)} notebooks executed in {nb_s:.0f} s summed"]
    return "\n".join(lines)


def answer_cells(out_dir: os.PathLike, paths: Sequence[Path] = ()) -> list:
    """The report's first section, ``## The answer``: the question, each headline and map verdict
    in the notebooks' own words (:func:`headline_sentences`, :func:`map_sentences`), the two gaps'
    numbers and verdicts as ``headline_gaps.csv`` holds them, the headline and map figures, the
    other notebooks' families of comparisons (:func:`family_sentences`), what the study does
    not show, and the preset, seeds, machine and time. A table the study did not write is named."""
    from nbformat.v4 import new_markdown_cell

    from studylib.study.analysis import text

    out_dir = Path(out_dir)
    cells, limits, moe = [], [], None
    md = ["## The answer", "", f"**The question.** {QUESTION}", ""]
    gaps = _read_table(out_dir, HEADLINE)
    if gaps is not None and len(gaps) == 2:
        verdict, lim = headline_sentences(gaps, out_dir)
        moe = gaps.iloc[0]["b"]
        judged = "verdict" in gaps and "p_tost" in gaps  # older tables: no TOST, no verdict
        md += [f"**Headline (notebook 03).** {verdict}", "",
               "| gap | mean | 95% CI | n | p | resolved |" + (" TOST p | verdict |" if judged else "") + " paper |",
               "|---|---|---|---|---|---|" + ("---|---|" if judged else "") + "---|"]
        md += [f"| {r.comparison} | {r.mean:+.4f} | [{r.ci_low:+.4f}, {r.ci_high:+.4f}] | {int(r.n)} | {r.p:.2g} "
               f"| {'yes' if r.resolved else 'no'} |"
               + (f" {r.p_tost:.2g} | {text.verdict_label(r._asdict(), r.a, r.b)} |" if judged else "")
               + f" {r.paper_mean:+.4f} ± {r.paper_std:.4f} |" for r in gaps.itertuples()]
        limits.append(lim)
    else:
        md.append(f"**Headline.** Not computed: no `tables/{HEADLINE}.csv` (notebook 03 did not run in this study).")
    cells.append(new_markdown_cell("\n".join(md)))
    if (out_dir / "figures" / f"{HEADLINE}.png").is_file():
        cells.append(_figure_cell(out_dir / "figures" / f"{HEADLINE}.png"))
    table = _read_table(out_dir, MAP)
    if table is not None and len(table):
        cells.append(new_markdown_cell("**The token-budget map (notebook 09).**\n\n"
                                       + "\n".join(f"* {s}" for s in map_sentences(out_dir, table))))
        for fig in (MAP, "token_budget_crossing"):
            if (out_dir / "figures" / f"{fig}.png").is_file():
                cells.append(_figure_cell(out_dir / "figures" / f"{fig}.png"))
    else:
        cells.append(new_markdown_cell(f"**The token-budget map.** Not computed: no `tables/{MAP}.csv` "
                                       "(notebook 09 did not run in this study)."))
    families = family_sentences(out_dir)
    if families:
        cells.append(new_markdown_cell(
            "**The other comparisons, one family per notebook** (Holm-corrected within each family; "
            "\"equivalent\": a TOST within the margin; docs/statistics.md).\n\n"
            + "\n".join(f"* {s}" for s in families)))
    limits.append("The map's points are few sizes and budgets with a handful of seeds each; the gap model is a "
                  "plane in log tokens/param and log size, and its crossing line is where that plane is zero. "
                  "Nothing here is measured at the paper's scale (the fits' predictions there are extrapolations, "
                  "compared in sign and ordering only); only the `paper` preset on a GPU measures its regime.")
    cells.append(new_markdown_cell("**What this does not show.**\n\n" + "\n".join(f"* {s}" for s in limits)
                                   + "\n\n**The runs.**\n\n" + _facts(out_dir, moe, paths)))
    return cells


APPENDIX = ("01_",)  # notebooks shown last: the parameter accounting (long tables, no verdict)


def report_order(paths: Sequence[os.PathLike]) -> list[Path]:
    """The notebooks in the report's order: file order, the APPENDIX ones last."""
    paths = [Path(p) for p in paths]
    return [p for p in paths if not p.name.startswith(APPENDIX)] + [p for p in paths if p.name.startswith(APPENDIX)]


def merge_notebooks(paths: Sequence[os.PathLike], title: str = "Study report", out_dir: Optional[os.PathLike] = None):
    """One notebook: the title and the answer (from ``out_dir``'s tables and figures; default:
    the folder above the notebooks' own), a contents list, then the cells of all ``paths``
    (:func:`report_order`)."""
    import nbformat
    from nbformat.v4 import new_markdown_cell, new_notebook

    paths = report_order(paths)
    if out_dir is None and paths:
        out_dir = Path(paths[0]).resolve().parent.parent  # outputs/<preset>/notebooks/NN.ipynb
    merged = new_notebook()
    merged.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Python 3", "language": "python"}
    head = [new_markdown_cell(f"# {title}\n\nGenerated {time.strftime('%Y-%m-%d %H:%M %Z')}.")]
    head += answer_cells(out_dir, paths) if out_dir is not None else []
    toc = ["## Contents", ""]
    body = []
    for n, p in enumerate(paths):
        nb = nbformat.read(str(p), as_version=4)
        anchor = f"nb-{n}"
        toc.append(f"{n + 1}. [{Path(p).stem}](#{anchor})"
                   + (" (appendix: the parameter accounting)" if Path(p).name.startswith(APPENDIX) else ""))
        body.append(new_markdown_cell(f'<a id="{anchor}"></a>\n\n---\n\n*Notebook `{Path(p).name}`*'))
        for cell in nb.cells:
            c = copy.deepcopy(cell)
            if c.cell_type == "code":
                tags = c.metadata.get("tags", [])
                if "injected-parameters" in tags or "parameters" in tags:
                    continue
                c.outputs = _clean_outputs(c.get("outputs", []))
            body.append(c)
    merged.cells = head + [new_markdown_cell("\n".join(toc))] + body
    for i, c in enumerate(merged.cells):
        c["id"] = f"cell-{i}"
    return merged


def write_report(paths: Sequence[os.PathLike], out_path: os.PathLike, title: str = "Study report",
                 hide_code: bool = True) -> Path:
    """Export the executed notebooks as one self-contained HTML file (figures embedded)."""
    from nbconvert import HTMLExporter

    nb = merge_notebooks(paths, title)
    exporter = HTMLExporter(exclude_input=hide_code, exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": title}})
    out_path = Path(out_path)
    write_atomic(out_path, body)  # whole or not at all: a kill or a full disk leaves the previous report
    return out_path
