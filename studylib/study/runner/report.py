"""The study's HTML report: the executed notebooks stitched into one notebook (a contents list,
parameters cells and stderr dropped, widget views dropped) and exported as one self-contained HTML
file with nbconvert (code hidden, figures embedded).
"""
from __future__ import annotations

import copy
import os
import time
from pathlib import Path
from typing import Sequence

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


def merge_notebooks(paths: Sequence[os.PathLike], title: str = "Study report"):
    """One notebook holding the cells of all ``paths`` (a heading and contents list first)."""
    import nbformat
    from nbformat.v4 import new_markdown_cell, new_notebook

    merged = new_notebook()
    merged.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Python 3", "language": "python"}
    toc = [f"# {title}", "", f"Generated {time.strftime('%Y-%m-%d %H:%M')}.", ""]
    body = []
    for n, p in enumerate(paths):
        nb = nbformat.read(str(p), as_version=4)
        anchor = f"nb-{n}"
        toc.append(f"{n + 1}. [{Path(p).stem}](#{anchor})")
        body.append(new_markdown_cell(f'<a id="{anchor}"></a>\n\n---\n\n*Notebook `{Path(p).name}`*'))
        for cell in nb.cells:
            c = copy.deepcopy(cell)
            if c.cell_type == "code":
                tags = c.metadata.get("tags", [])
                if "injected-parameters" in tags or "parameters" in tags:
                    continue
                c.outputs = _clean_outputs(c.get("outputs", []))
            body.append(c)
    merged.cells = [new_markdown_cell("\n".join(toc))] + body
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
