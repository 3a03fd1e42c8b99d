"""The study's HTML report: the answer first (:func:`answer_cells`: what each comparison adds to it,
from its tables and figures, then the families of every comparison, what they do not show, the
runs' facts), then a
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


QUESTION = ("Does a routed mixture-of-experts decoder reach a lower validation loss than the dense model with "
            "its active parameters, and a higher one than the dense model with its total parameters, as the paper "
            "finds?")


def _figure_cell(path: Path):
    """A code cell (hidden in the report) whose output is the PNG at ``path``."""
    from nbformat.v4 import new_code_cell, new_output

    c = new_code_cell("")
    c.outputs = [new_output("display_data", data={"image/png": base64.b64encode(path.read_bytes()).decode(),
                                                  "text/plain": path.name})]
    return c


def family_sentences(out_dir: Path) -> list[str]:
    """One line per family of every comparison table the study wrote (each comparison's
    ``tables``, in notebook order), in the notebook's own words (``Comparison.words``). Tables
    without the family's columns (written before the verdicts) are left out."""
    from studylib.study.comparisons import registry
    from studylib.study.comparisons.glance import read_table

    out = []
    for c in registry().values():
        nb = c.notebook.split("_")[0]
        for name in c.tables:
            t = read_table(out_dir, name)
            if t is None or t.empty or "verdict" not in t or "p_holm" not in t:
                continue
            out += [f"Notebook {nb}: {line}" for line in c.words(t)]
    return out


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

    from studylib.study.analysis.frames import model_summaries

    runs = model_summaries(out_dir, moe) if moe else []
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


def _details(summary: str, markdown: str, figures: Sequence[Path] = ()) -> str:
    """A folded section: ``summary`` shown, ``markdown`` and the figures (embedded) inside."""
    imgs = "".join(f'<img src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}" alt="{p.stem}">'
                   for p in figures)
    return f"<details><summary>{summary}</summary>\n\n{markdown}\n\n{imgs}\n\n</details>"


def _parts(out_dir: Path) -> list:
    """[(comparison, its Answer)] of every comparison with an answer, in notebook order."""
    from studylib.config import ConfigError
    from studylib.study.comparisons import registry

    parts = []
    for c in registry().values():
        if c.answer is None:
            continue
        try:
            parts.append((c, c.answer(out_dir)))
        except KeyError as e:  # a column or row its answer reads that no check named: still one line
            nb = c.notebook.split("_")[0]
            raise ConfigError(f"{Path(out_dir) / 'tables'}: a table of notebook {nb} lacks {e}, which its answer "
                              f"reads (a table of another version, or edited): run notebook {nb} again") from None
    return parts


def answer_cells(out_dir: os.PathLike, paths: Sequence[Path] = ()) -> list:
    """The report's first section, ``## The answer``. First screen
    (:func:`~studylib.study.comparisons.glance.glance_markdown`): the question, one table (each
    comparison's ``glance`` rows), at most three sentences (their ``lead``) and the key figure.
    Below it, folded (``<details>``): what each comparison adds in full (``Comparison.answer``, in
    notebook order, with its figures; a table the study did not write is named), the other
    notebooks' families of comparisons (:func:`family_sentences`), what the study does not show,
    and the preset, seeds, machine and time."""
    from nbformat.v4 import new_markdown_cell

    from studylib.study.comparisons.glance import glance_markdown

    out_dir = Path(out_dir)
    rows, lead, key, folded, limits, moe = [], [], None, [], [], None
    found = _parts(out_dir)
    covered = {t for _, part in found for t in part.covers}
    for c, part in found:
        rows += part.glance
        lead += part.lead_without(covered - set(part.covers))
        key = part.key_figure or key
        nb = c.notebook.split("_")[0]
        folded.append(_details(f"Notebook {nb} ({c.name.replace('_', ' ')}) in full", part.markdown,
                               [p for p in part.figures if p != part.key_figure]))
        limits += part.limits
        moe = moe or part.moe
    cells = [new_markdown_cell("## The answer\n\n" + glance_markdown(QUESTION, rows, lead))]
    if key is not None:
        cells.append(_figure_cell(key))
    families = family_sentences(out_dir)
    if families:
        folded.append(_details(
            "The other comparisons, one family per notebook",
            "Holm-corrected within each family; \"equivalent\": a TOST within the margin; docs/statistics.md.\n\n"
            + "\n".join(f"* {s}" for s in families)))
    folded.append(_details("What this does not show, and the runs",
                           "\n".join(f"* {s}" for s in limits) + "\n\n**The runs.**\n\n" + _facts(out_dir, moe, paths)))
    cells.append(new_markdown_cell("\n\n".join(folded)))
    return cells


def write_answer(out_dir: os.PathLike) -> Path:
    """``<out_dir>/answer.md``: the first screen's table and sentences, and the README's answer
    built from the same sentences (:func:`~studylib.study.comparisons.glance.readme_answer`)."""
    from studylib.study.comparisons.glance import glance_markdown, readme_answer

    out_dir = Path(out_dir)
    parts = [p for _, p in _parts(out_dir)]
    covered = {t for p in parts for t in p.covers}
    rows = [r for p in parts for r in p.glance]
    lead = [s for p in parts for s in p.lead_without(covered - set(p.covers))]
    text = (glance_markdown(QUESTION, rows, lead) + "\n\n## For the README (at most 150 words)\n\n"
            + readme_answer(lead, f"outputs/{out_dir.name}/report.html") + "\n")
    path = out_dir / "answer.md"
    write_atomic(path, text)
    return path


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
