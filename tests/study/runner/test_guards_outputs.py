"""Every output of a study written whole (issue #33): the report, the executed notebooks, the
figures and the tables go through the atomic writes (temporary file + rename), so a full disk is
one error naming the file and leaves the previous version. The disk-full cases mount a small
tmpfs and skip where mounting is not allowed."""
from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from contextlib import contextmanager

import nbformat
import pandas as pd
import pytest
from nbformat.v4 import new_markdown_cell, new_notebook

from studylib.storage.files import DiskFullError
from studylib.study.analysis.plots import save_figure, save_table
from studylib.study.runner.execute import StudyError, execute_notebook
from studylib.study.runner.report import write_report


@contextmanager
def tmpfs(parent, size):
    """A tmpfs of ``size`` mounted at a new folder under ``parent`` (skips where that is not allowed)."""
    if shutil.which("mount") is None:
        pytest.skip("no mount command here")
    d = parent / f"tmpfs-{uuid.uuid4().hex[:6]}"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        d.rmdir()
        pytest.skip(f"cannot mount here: {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", str(d)], check=False)
        d.rmdir()


def _fill(folder, leave: int) -> None:
    """Fill ``folder``'s filesystem up to ``leave`` free bytes."""
    free = shutil.disk_usage(folder).free
    with open(folder / "ballast", "wb") as f:
        f.write(b"\0" * max(0, free - leave))


def _no_temporaries(folder) -> bool:
    return not [p for p in folder.rglob("*") if p.name.startswith(".tmp-")]


def test_a_full_disk_keeps_the_previous_report(tmp_path):
    nb = new_notebook(cells=[new_markdown_cell("x" * 300_000)])
    src = tmp_path / "01_big.ipynb"
    nbformat.write(nb, str(src))
    with tmpfs(tmp_path, "256k") as small:
        report = small / "report.html"
        report.write_text("the previous report")
        _fill(small, 64 * 1024)
        with pytest.raises(DiskFullError) as e:
            write_report([src], report)
        assert str(e.value).startswith(f"{report}: no space left on device writing this file")
        assert report.read_text() == "the previous report" and _no_temporaries(small)
    out = write_report([src], tmp_path / "report.html")  # room: the whole report
    assert out.read_text().rstrip().endswith("</html>")


def test_a_full_disk_keeps_the_previous_table_and_figure(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = pd.DataFrame({"seed": range(20_000), "loss": [2.0] * 20_000})
    fig, ax = plt.subplots(figsize=(30, 30), dpi=100)
    ax.imshow([[i * j % 7 for i in range(500)] for j in range(500)])
    with tmpfs(tmp_path, "128k") as small:
        (small / "tables").mkdir()
        (small / "figures").mkdir()
        (small / "tables" / "t.csv").write_text("previous table\n")
        (small / "figures" / "f.png").write_bytes(b"previous figure")
        _fill(small, 32 * 1024)
        with pytest.raises(DiskFullError, match=r"t\.csv: no space left on device"):
            save_table(df, "t", small)
        with pytest.raises(DiskFullError, match=r"f\.png: no space left on device"):
            save_figure(fig, "f", small)
        assert (small / "tables" / "t.csv").read_text() == "previous table\n"
        assert (small / "figures" / "f.png").read_bytes() == b"previous figure"
        assert _no_temporaries(small)
    assert save_figure(fig, "f", tmp_path).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")  # room: the whole figure
    plt.close(fig)
    assert pd.read_csv(save_table(df, "t", tmp_path), index_col=0).equals(df)


def _notebook(tmp_path, body: str):
    py = tmp_path / "01_t.py"
    py.write_text('# %% tags=["parameters"]\nx = 1\n# %%\n' + body + "\n")
    return py


def test_a_full_disk_keeps_the_previous_executed_notebook(tmp_path):
    """The issue's case: with little space under the outputs the executed notebook was left
    truncated (not JSON) and no line named it."""
    py = _notebook(tmp_path, 'print("y" * 400_000)')
    with tmpfs(tmp_path, "256k") as small:
        out = small / "notebooks" / "01_t.ipynb"
        out.parent.mkdir()
        out.write_text('{"the previous": "notebook"}')
        with pytest.raises(DiskFullError) as e:
            execute_notebook(py, out, {"x": 2}, tmp_path, progress=False)
        assert str(e.value).startswith(f"{out}: no space left on device writing this file")
        assert json.loads(out.read_text()) == {"the previous": "notebook"} and _no_temporaries(small)


def test_the_executed_notebook_names_where_it_is(tmp_path):
    py = _notebook(tmp_path, "print(x + 1)")
    out = tmp_path / "out" / "01_t.ipynb"
    execute_notebook(py, out, {"x": 41}, tmp_path, progress=False)
    nb = nbformat.read(str(out), as_version=4)
    assert nb.metadata.papermill["output_path"] == str(out)
    assert "42" in "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))


def test_a_failing_cell_still_leaves_the_partly_executed_notebook(tmp_path):
    py = _notebook(tmp_path, "print('before')\nraise ValueError('boom')")
    out = tmp_path / "out" / "01_t.ipynb"
    with pytest.raises(StudyError, match=rf"ValueError: boom[\s\S]*the partly executed notebook \(with the "
                                         rf"traceback\) is {out}"):
        execute_notebook(py, out, {"x": 1}, tmp_path, progress=False)
    nb = nbformat.read(str(out), as_version=4)
    assert any(o.get("ename") == "ValueError" for c in nb.cells for o in c.get("outputs", []))


@pytest.mark.slow
def test_a_kill_while_the_report_is_written_leaves_the_previous_report(tmp_path):
    """SIGKILL between writing the new report and putting it in place (the rename is held back
    in the child): the previous report stays whole (it was left at 0 bytes), and the temporary
    file the kill left goes with the next report."""
    import os
    import signal
    import sys
    import time

    src = tmp_path / "01_nb.ipynb"
    nbformat.write(new_notebook(cells=[new_markdown_cell("x" * 100_000)]), str(src))
    report = tmp_path / "report.html"
    report.write_text("the previous report")
    child = subprocess.Popen([sys.executable, "-c", (
        "import os, time, sys\n"
        "real = os.replace\n"
        "os.replace = lambda a, b: ((open(sys.argv[3], 'w').close(), time.sleep(600)) if str(b) == sys.argv[2]\n"
        "                           else real(a, b))\n"
        "from studylib.study.runner.report import write_report\n"
        "write_report([sys.argv[1]], sys.argv[2])\n"), str(src), str(report), str(tmp_path / "renaming")])
    try:
        deadline = time.time() + 120
        while not (tmp_path / "renaming").exists() and child.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "renaming").exists(), "the report was written without the atomic rename"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
    assert report.read_text() == "the previous report"
    left = tmp_path / f".tmp-report.html.{child.pid}"
    assert left.is_file()  # what the kill left; the next report removes it (issue #41: it stayed for good)
    write_report([src], report)
    assert not left.exists() and _no_temporaries(tmp_path) and "x" * 1000 in report.read_text()
