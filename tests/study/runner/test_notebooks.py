"""The study runner: Jupytext -> papermill (parameters injected, cwd = root) -> report; failures
name the notebook and the cell; notebook_context resolves everything from the root without
changing the working directory, and applies the seeds / overrides parameters the same way whether
they come from ``studylib study -p`` or from plain ``papermill -p``. Uses trivial notebooks written
to a temporary repository (and reads the real notebooks' parameters cells)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from pathlib import Path

import nbformat
import pytest
import yaml

from _tiny import tiny_raw
from studylib.study.runner import notebooks as study
from studylib.study.runner import parameters, report
from studylib.cli import main

HEADER = textwrap.dedent("""\
    # ---
    # jupyter:
    #   jupytext:
    #     formats: py:percent
    #     text_representation:
    #       extension: .py
    #       format_name: percent
    #   kernelspec:
    #     display_name: Python 3
    #     language: python
    #     name: python3
    # ---
    """)

OK = HEADER + textwrap.dedent("""\

    # %% [markdown]
    # # A trivial notebook

    # %% tags=["parameters"]
    params = "params/other.yaml"
    jobs = None

    # %%
    import os
    from studylib.study.runner.notebooks import notebook_context
    ctx = notebook_context(params, jobs)
    print("PARAMS", params, "JOBS", jobs, "PRESET", ctx.preset.name)
    print("CWD", os.getcwd())
    assert ctx.jobs == 3
    """)

FAIL = HEADER + textwrap.dedent("""\

    # %% tags=["parameters"]
    params = "params/other.yaml"
    jobs = None

    # %%
    x = 1

    # %%
    raise ValueError("boom: the invariant broke")
    """)


SHOW = HEADER + textwrap.dedent("""\

    # %% tags=["parameters"]
    params = "params/other.yaml"
    jobs = None
    seeds = None
    overrides = None

    # %%
    from studylib.study.runner.notebooks import notebook_context
    ctx = notebook_context(params, jobs, seeds, overrides)
    print("CTX", ctx.preset.name, ctx.seeds, ctx.first_seed, sorted(ctx.overrides.items()), ctx.preset.train.amp,
          ctx.out.relative_to(ctx.root))
    """)


@pytest.fixture
def repo(tmp_path, monkeypatch):
    monkeypatch.delenv("STUDYLIB_OUTPUTS", raising=False)
    monkeypatch.delenv("STUDYLIB_ROOT", raising=False)
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "t.yaml").write_text(yaml.safe_dump(tiny_raw(name="t")))
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    (nbs / "01_ok.py").write_text(OK)
    (nbs / "02_fail.py").write_text(FAIL)
    (nbs / "03_show.py").write_text(SHOW)
    (nbs / "helper.py").write_text("# not a study notebook\n")
    return tmp_path


def _stream_text(nb) -> str:
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.get("outputs", []) if o.get("output_type") == "stream")


def test_find_notebooks(repo):
    nbs = study.find_notebooks(repo / "notebooks")
    assert [p.name for p in nbs] == ["01_ok.py", "02_fail.py", "03_show.py"]
    assert [p.name for p in study.find_notebooks(repo / "notebooks", ["2"])] == ["02_fail.py"]
    assert [p.name for p in study.find_notebooks(repo / "notebooks", ["01_ok"])] == ["01_ok.py"]
    with pytest.raises(study.ConfigError, match="no notebook '07'"):
        study.find_notebooks(repo / "notebooks", ["07"])


def test_runs_notebook_with_parameters_and_writes_report(repo, monkeypatch, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("cwd")
    monkeypatch.chdir(elsewhere)  # the runner resolves the params path and runs the kernel in the root
    res = study.run_study(str(repo / "params" / "t.yaml"), notebooks=["01"], jobs=3, root=repo,
                          progress=False, echo=lambda m: None)
    out = repo / "outputs" / "t" / "notebooks" / "01_ok.ipynb"
    assert out.is_file()
    nb = nbformat.read(str(out), as_version=4)
    tags = [c.metadata.get("tags", []) for c in nb.cells]
    assert ["injected-parameters"] in tags
    text = _stream_text(nb)
    assert "PARAMS params/t.yaml JOBS 3 PRESET t" in text
    assert f"CWD {repo}" in text
    assert set(res["notebooks"]) == {"01_ok"}
    report = repo / "outputs" / "t" / "report.html"
    assert res["report"] == report and report.is_file()
    html = report.read_text()
    assert "A trivial notebook" in html and "PARAMS params/t.yaml" in html
    assert "notebook_context(params" not in html  # code cells are hidden in the report


def test_failing_cell_is_named(repo):
    with pytest.raises(study.StudyError) as ei:
        study.run_study(str(repo / "params" / "t.yaml"), notebooks=["01", "02"], jobs=3, root=repo, report=True,
                        progress=False, echo=lambda m: None)
    msg = str(ei.value)
    assert "notebook 02_fail.py failed in cell" in msg
    assert "ValueError: boom: the invariant broke" in msg
    assert 'raise ValueError("boom' in msg  # the failing cell's source
    assert "02_fail.ipynb" in msg
    # the first notebook ran; the failed one is kept (with its traceback); no report after a failure
    outdir = repo / "outputs" / "t"
    assert (outdir / "notebooks" / "01_ok.ipynb").is_file()
    failed = nbformat.read(str(outdir / "notebooks" / "02_fail.ipynb"), as_version=4)
    assert any(o.get("output_type") == "error" for c in failed.cells if c.cell_type == "code"
               for o in c.get("outputs", []))
    assert not (outdir / "report.html").exists()


def test_cli_reports_failure(repo, monkeypatch, capsys):
    monkeypatch.chdir(repo)
    rc = main(["study", "--params", "params/t.yaml", "--notebooks", "02", "--no-report", "--no-progress"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "error: notebook 02_fail.py failed in cell" in err and "ValueError" in err


def test_merge_notebooks_drops_parameters_and_stderr(repo):
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    nb = new_notebook(cells=[
        new_code_cell("params = 1", metadata={"tags": ["parameters"]}),
        new_code_cell("print(1)", outputs=[new_output("stream", name="stdout", text="1\n"),
                                           new_output("stream", name="stderr", text="progress\n")]),
    ])
    p = repo / "x.ipynb"
    nbformat.write(nb, str(p))
    merged = report.merge_notebooks([p, p], title="T")
    code = [c for c in merged.cells if c.cell_type == "code"]
    assert len(code) == 2 and all(len(c.outputs) == 1 for c in code)
    assert len({c["id"] for c in merged.cells}) == len(merged.cells)


def test_notebook_context_resolves_from_the_root_and_keeps_the_cwd(repo, monkeypatch, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("cwd")
    monkeypatch.chdir(elsewhere)  # e.g. nbval runs a notebook from its own folder
    monkeypatch.setenv("STUDYLIB_ROOT", str(repo))
    ctx = study.notebook_context("params/t.yaml", jobs=2)
    assert os.getcwd() == str(elsewhere)
    assert ctx.root == repo.resolve() and ctx.params == str(repo.resolve() / "params" / "t.yaml")
    assert ctx.out == repo.resolve() / "outputs" / "t" and ctx.out.is_dir()
    assert ctx.preset.name == "t" and ctx.jobs == 2 and ctx.first_seed == ctx.seeds[0]
    assert not (elsewhere / "outputs").exists()
    # a relative $STUDYLIB_OUTPUTS is taken from the root as well
    monkeypatch.setenv("STUDYLIB_OUTPUTS", "elsewhere_out")
    assert study.notebook_context("params/t.yaml").out == repo.resolve() / "elsewhere_out" / "t"


def test_repo_root_falls_back_to_the_checkout_of_the_package(tmp_path, monkeypatch):
    monkeypatch.delenv("STUDYLIB_ROOT", raising=False)
    root = study.repo_root(tmp_path)  # nothing above tmp_path holds params/ and notebooks/
    assert (root / "params").is_dir() and (root / "notebooks").is_dir() and (root / "studylib").is_dir()


def test_importing_plots_leaves_matplotlib_alone():
    code = ("import matplotlib; import studylib.study.analysis.plots; "
            "assert matplotlib.rcParams._get_backend_or_none() is None, matplotlib.rcParams['backend']")
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


# --------------------------------------------------------------------------------------------
# the notebook phase: several notebooks at a time, run-alone notebooks, failures
# --------------------------------------------------------------------------------------------
def _timed(name: str, *, wait_for=(), sleep=0.0, fail=False, alone=False, after=()) -> str:
    """A notebook that writes ``stamps/<name>.start`` when its cell starts, waits (at most 30 s)
    until the notebooks ``wait_for`` have started, sleeps ``sleep`` s, writes ``stamps/<name>.end``
    (wall-clock times), then raises if ``fail``. ``alone``: marked run_alone in its header."""
    meta = ("#     run_alone: true\n" if alone else "") + (f"#     after: {list(after)!r}\n".replace("'", '"') if after else "")
    header = HEADER[:-len("# ---\n")] + ("#   studylib:\n" + meta if meta else "") + "# ---\n"
    return header + textwrap.dedent(f"""\

        # %% tags=["parameters"]
        params = "params/other.yaml"
        jobs = None

        # %%
        import pathlib, time
        stamps = pathlib.Path("stamps")  # the kernel runs in the repository root
        stamps.mkdir(exist_ok=True)
        (stamps / "{name}.start").write_text(repr(time.time()))
        deadline = time.time() + 30
        while time.time() < deadline and not all((stamps / (p + ".start")).exists() for p in {list(wait_for)!r}):
            time.sleep(0.05)
        time.sleep({sleep})
        (stamps / "{name}.end").write_text(repr(time.time()))
        if {fail}:
            raise RuntimeError("{name} broke")
        """)


def _write_timed(repo, **notebooks) -> None:
    """Replace the repository's notebooks by ``{stem: _timed source}``."""
    for old in (repo / "notebooks").glob("*.py"):
        old.unlink()
    for stem, source in notebooks.items():
        (repo / "notebooks" / (stem + ".py")).write_text(source)


def _stamps(repo) -> dict:
    """``{notebook: (start, end or None)}`` from the stamps its cell wrote."""
    out = {}
    for start in sorted((repo / "stamps").glob("*.start")):
        end = start.with_suffix(".end")
        out[start.stem] = (float(start.read_text()), float(end.read_text()) if end.exists() else None)
    return out


def _overlap(a, b) -> bool:
    return max(a[0], b[0]) < min(a[1], b[1])


def _study(repo, lines, **kw):
    return study.run_study(str(repo / "params" / "t.yaml"), jobs=3, root=repo, report=False, progress=False,
                           echo=lines.append, **kw)


def test_two_notebooks_run_at_once_and_times_stay_in_file_order(repo, monkeypatch, tmp_path_factory):
    """notebook_jobs=2: two kernels at once (their cells overlap: each waits for the other to
    start); 01 finishes after 02, yet ``times`` and the report order stay in file order; the
    process's working directory is left alone."""
    elsewhere = tmp_path_factory.mktemp("cwd")
    monkeypatch.chdir(elsewhere)
    # 01 outlives 02 by 5 s after its cell: enough for 02's kernel to shut down first on a busy
    # machine (2 s was not, once in four runs)
    _write_timed(repo, **{"01_a": _timed("01_a", wait_for=["02_b"], sleep=5.0),
                          "02_b": _timed("02_b", wait_for=["01_a"]),
                          "03_c": _timed("03_c")})
    lines = []
    res = _study(repo, lines, notebook_jobs=2)
    st = _stamps(repo)
    assert _overlap(st["01_a"], st["02_b"]), st
    assert st["02_b"][1] < st["01_a"][1] and st["02_b"][1] <= st["03_c"][0]  # 03 waits for a free kernel
    assert list(res["notebooks"]) == ["01_a", "02_b", "03_c"]
    done = [ln.split()[1] for ln in lines if " done in " in ln]
    assert done[0] == "02_b.py" and sorted(done) == ["01_a.py", "02_b.py", "03_c.py"], lines  # out of file order
    assert [ln for ln in lines if ln.endswith(" ...")] == ["[1/3] 01_a.py ...", "[2/3] 02_b.py ...",
                                                           "[3/3] 03_c.py ..."]
    assert os.getcwd() == str(elsewhere)


def test_a_notebook_after_another_starts_once_that_one_has_finished(repo):
    """03 reads 01's tables (after: ["01"]): with two kernels it starts only once 01 has finished,
    while 02 runs beside 01; 04 (after a notebook this study does not run) is not held back."""
    _write_timed(repo, **{"01_a": _timed("01_a", wait_for=["02_b"], sleep=2.0),
                          "02_b": _timed("02_b", wait_for=["01_a"]),
                          "03_reads": _timed("03_reads", after=["01"]),
                          "04_d": _timed("04_d", after=["09"])})
    lines = []
    _study(repo, lines, notebook_jobs=2)
    st = _stamps(repo)
    assert _overlap(st["01_a"], st["02_b"])
    assert st["03_reads"][0] >= st["01_a"][1], st


def test_a_run_alone_notebook_overlaps_no_other(repo):
    """03 is marked run_alone: it starts after 01 and 02 have finished, and 04 starts after it."""
    _write_timed(repo, **{"01_a": _timed("01_a", wait_for=["02_b"], sleep=1.0),
                          "02_b": _timed("02_b", wait_for=["01_a"], sleep=1.0),
                          "03_alone": _timed("03_alone", sleep=1.5, alone=True),
                          "04_d": _timed("04_d", sleep=1.0),
                          "05_e": _timed("05_e", sleep=1.0)})
    lines = []
    res = _study(repo, lines, notebook_jobs=2)
    st = _stamps(repo)
    assert set(st) == {"01_a", "02_b", "03_alone", "04_d", "05_e"}
    assert _overlap(st["01_a"], st["02_b"])
    for other in ("01_a", "02_b", "04_d", "05_e"):
        assert not _overlap(st["03_alone"], st[other]), (other, st)
    assert list(res["notebooks"]) == ["01_a", "02_b", "03_alone", "04_d", "05_e"]
    assert "[3/5] 03_alone.py ... (alone)" in lines and "notebooks: 2 at a time; 03 alone (run_alone in the header)" \
        in lines


def test_the_timing_notebooks_are_marked_run_alone():
    """The real notebooks: those that time things (05 benchmarks, 07 times greedy decoding)."""
    nbs = study.find_notebooks(Path(__file__).parents[3] / "notebooks")
    assert [p.name for p in nbs if study.notebook_header(p).run_alone] == ["05_throughput.py", "07_iso_width.py"]
    # and those that read another's tables: 13 reads 09's map (its position against size)
    assert {p.name: study.notebook_header(p).after for p in nbs if study.notebook_header(p).after} == {
        "13_controls.py": ("09",), "14_size_ladder.py": ("09", "13")}


def test_run_alone_header_errors_name_the_file(repo):
    bad = repo / "notebooks" / "04_bad.py"
    bad.write_text(_timed("x").replace("# ---\n\n", "#   studylib:\n#     run_alone: yes please\n# ---\n\n", 1))
    with pytest.raises(study.ConfigError, match=r"04_bad.py: header metadata studylib: expected \{run_alone: true"):
        study.notebook_header(bad)
    with pytest.raises(study.ConfigError, match="04_bad.py"):  # before any run trains or kernel starts
        study.run_study(str(repo / "params" / "t.yaml"), root=repo, report=False, progress=False,
                        echo=lambda m: None)
    assert not (repo / "outputs" / "t" / "notebooks").exists()


def test_after_a_failure_nothing_new_starts_and_the_first_failure_in_file_order_is_raised(repo):
    # 01 fails at once; 02 runs alone, so it waits for 01, whose failure is then known: 02 and 03 never start
    _write_timed(repo, **{"01_fail": _timed("01_fail", fail=True),
                          "02_alone": _timed("02_alone", alone=True),
                          "03_c": _timed("03_c")})
    lines = []
    with pytest.raises(study.StudyError, match=r"notebook 01_fail.py failed in cell .*RuntimeError: 01_fail broke"):
        _study(repo, lines, notebook_jobs=2)
    assert set(_stamps(repo)) == {"01_fail"}
    assert not (repo / "outputs" / "t" / "notebooks" / "02_alone.ipynb").exists()
    assert "[1/3] 01_fail.py failed" in lines and not any(ln.startswith(("[2/3]", "[3/3]")) for ln in lines)

    # 01 and 02 run together and both fail, 02 first (01 sleeps on): 02's failure stops 03 from
    # starting, 01 runs to its end, and the error is 01's, the first in file order
    (repo / "stamps").rename(repo / "stamps-1")
    _write_timed(repo, **{"01_late": _timed("01_late", wait_for=["02_early"], sleep=2.0, fail=True),
                          "02_early": _timed("02_early", wait_for=["01_late"], fail=True),
                          "03_c": _timed("03_c")})
    with pytest.raises(study.StudyError, match="notebook 01_late.py failed in cell") as ei:
        _study(repo, [], notebook_jobs=2)
    assert str(ei.value).startswith("notebook 01_late.py") and "02_early.ipynb" not in str(ei.value)
    st = _stamps(repo)
    assert set(st) == {"01_late", "02_early"} and st["01_late"][1] > st["02_early"][1]  # both ran to their end


def test_notebook_jobs_1_runs_one_after_another_with_the_progress_bar(repo, monkeypatch, capsys):
    """``--notebook-jobs 1``: the old sequential behaviour (papermill's per-cell bar on); with 2,
    no bar (interleaved bars are unreadable)."""
    monkeypatch.chdir(repo)
    _write_timed(repo, **{"01_a": _timed("01_a", sleep=0.5), "02_b": _timed("02_b", sleep=0.5),
                          "03_c": _timed("03_c", sleep=0.5)})
    assert main(["study", "--params", "params/t.yaml", "--no-report", "--notebook-jobs", "1"]) == 0
    st = _stamps(repo)
    assert st["01_a"][1] <= st["02_b"][0] and st["02_b"][1] <= st["03_c"][0], st
    out, err = capsys.readouterr()
    assert "notebooks: 1 at a time" in out and "Executing" in err  # the bar (tqdm on stderr)
    assert [ln.split()[1] for ln in out.splitlines() if " done in " in ln] == ["01_a.py", "02_b.py", "03_c.py"]

    assert main(["study", "--params", "params/t.yaml", "--no-report", "--notebook-jobs", "2",
                 "--notebooks", "01", "02"]) == 0
    out, err = capsys.readouterr()
    assert "notebooks: 2 at a time" in out and "Executing" not in err
    with pytest.raises(SystemExit):
        main(["study", "--params", "params/t.yaml", "--notebook-jobs", "0"])
    assert "argument --notebook-jobs: expected a positive integer, got '0'" in capsys.readouterr().err
    with pytest.raises(study.ConfigError, match="notebook_jobs: must be a positive integer, got 0"):
        study.run_study("params/t.yaml", root=repo, notebook_jobs=0, echo=lambda m: None)


def _alive(pid: int) -> bool:
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()  # a zombie has ended
    except FileNotFoundError:
        return False


@pytest.mark.slow
def test_ctrl_c_ends_the_running_kernels(repo):
    """SIGINT to ``studylib study`` while two notebooks sleep: it exits within seconds, not once the
    notebooks end, and their kernels are gone."""
    import signal
    import time

    sleeper = _timed("x", sleep=120).replace('(stamps / "x.start").write_text(repr(time.time()))',
                                            '(stamps / f"{__import__(\'os\').getpid()}.start").write_text("0")')
    _write_timed(repo, **{"01_a": sleeper, "02_b": sleeper})
    proc = subprocess.Popen([sys.executable, "-m", "studylib", "study", "--params", "params/t.yaml", "--no-report",
                             "--notebook-jobs", "2"], cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True,  # SIGINT as a terminal's Ctrl-C finds it (a CI started in the
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # background ignores it)
    try:
        deadline = time.time() + 60
        while len(list((repo / "stamps").glob("*.start"))) < 2 and time.time() < deadline:
            time.sleep(0.1)
        kernels = [int(p.stem) for p in (repo / "stamps").glob("*.start")]
        assert len(kernels) == 2 and all(_alive(k) for k in kernels)
        t0 = time.time()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert time.time() - t0 < 30 and proc.returncode != 0, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    time.sleep(1)
    assert not any(_alive(k) for k in kernels), out

# --------------------------------------------------------------------------------------------
# seeds / overrides: the parameters every notebook takes
# --------------------------------------------------------------------------------------------
def test_parse_seeds_forms_and_errors():
    assert parameters.parse_seeds(None) is None
    assert parameters.parse_seeds("1337-1346") == list(range(1337, 1347))
    assert parameters.parse_seeds("[1, 2]") == parameters.parse_seeds("1,2") == parameters.parse_seeds([1, 2]) == [1, 2]
    assert parameters.parse_seeds(7) == parameters.parse_seeds("7") == [7]
    for bad, msg in (("5-3", "ends before it starts"), ("[1, 1]", "repeats"), ("abc", "expected a list"),
                     ([1.5], r"seeds\[0\]: expected an integer seed"), ([], "expected a list"), (True, "expected")):
        with pytest.raises(study.ConfigError, match=msg):
            parameters.parse_seeds(bad)


def test_parse_overrides_forms_and_errors():
    want = {"train.amp": "off", "train.lr": 0.001}
    assert parameters.parse_overrides(want) == want
    assert parameters.parse_overrides('{"train.amp": "off", "train.lr": 0.001}') == want  # papermill -p: a string
    assert parameters.parse_overrides(["train.amp=off", "train.lr=0.001"]) == {"train.amp": False, "train.lr": 0.001}
    assert parameters.parse_overrides("train.max_steps=3") == {"train.max_steps": 3}
    assert parameters.parse_overrides(None) == parameters.parse_overrides("") == {}
    with pytest.raises(study.ConfigError, match="not 'key.path=value'"):
        parameters.parse_overrides(["train.amp"])
    with pytest.raises(study.ConfigError, match="expected a mapping"):
        parameters.parse_overrides("42")


def test_apply_parameters_derives_a_name_only_when_something_changes():
    base = study.load_preset(Path(__file__).parents[3] / "params" / "ci.yaml")
    assert base.train.max_steps != 3
    short, ov = parameters.apply_parameters(base, "1-3", {"train.max_steps": 3})
    assert short.train.max_steps == 3 and short.seeds == (1, 2, 3) and ov == {"train.max_steps": 3}
    assert short.name.startswith("ci-") and len(short.name) == len("ci-") + 8
    # the same change written as --set strings (values parsed as YAML) resolves to the same name
    assert parameters.apply_parameters(base, None, ["train.max_steps=3"])[0].name == short.name
    assert parameters.apply_parameters(base, None, '{"train.max_steps": 3}')[0].name == short.name
    assert parameters.apply_parameters(base, None, {"train.max_steps": 3, "train.lr": 0.001})[0].name != short.name
    same, _ = parameters.apply_parameters(base, None, {"train.lr": base.train.lr})  # changes nothing
    assert same.name == "ci" and same.seeds == base.seeds
    assert parameters.apply_parameters(base, [5], None)[0] == parameters.apply_parameters(base, "5", {})[0]
    with pytest.raises(study.ConfigError, match="train"):
        parameters.apply_parameters(base, None, {"train.nonsense": 1})


def test_notebook_context_applies_seeds_and_overrides(repo, monkeypatch, capsys):
    monkeypatch.setenv("STUDYLIB_ROOT", str(repo))
    ctx = study.notebook_context("params/t.yaml", None, "[4, 5]", {"train.max_steps": 3})
    assert ctx.seeds == [4, 5] and ctx.first_seed == 4 and ctx.preset.seeds == (4, 5)
    assert ctx.preset.train.max_steps == 3 and ctx.preset.name.startswith("t-")
    assert ctx.out == repo.resolve() / "outputs" / ctx.preset.name and ctx.overrides == {"train.max_steps": 3}
    printed = capsys.readouterr().out
    assert f"overrides: train.max_steps=3 -> preset {ctx.preset.name!r}" in printed and "seeds: [4, 5]" in printed


def _ctx_line(nb) -> str:
    return next(line for line in _stream_text(nb).splitlines() if line.startswith("CTX "))


def test_study_p_and_plain_papermill_give_the_same_parameters(repo, monkeypatch):
    """`studylib study -p seeds ... -p overrides ...` and `jupytext --to ipynb` + `papermill -p`
    on the same notebook reach the same preset, seeds and output folder."""
    monkeypatch.chdir(repo)
    rc = main(["study", "--params", "params/t.yaml", "--notebooks", "03", "--no-report", "--no-progress",
               "-p", "seeds", "1337-1339", "-p", "overrides", '{"train.amp": "off", "train.max_steps": 3}'])
    assert rc == 0
    name = parameters.apply_parameters(study.load_preset(repo / "params" / "t.yaml"), None,
                                  {"train.amp": "off", "train.max_steps": 3})[0].name
    via_study = nbformat.read(str(repo / "outputs" / name / "notebooks" / "03_show.ipynb"), as_version=4)
    bindir = Path(sys.executable).parent
    subprocess.run([str(bindir / "jupytext"), "--to", "ipynb", "-o", str(repo / "show.ipynb"),
                    str(repo / "notebooks" / "03_show.py")], check=True, capture_output=True)
    subprocess.run([str(bindir / "papermill"), str(repo / "show.ipynb"), str(repo / "show_out.ipynb"),
                    "-p", "params", "params/t.yaml", "-p", "seeds", "1337-1339",
                    "-p", "overrides", '{"train.amp": "off", "train.max_steps": 3}', "--cwd", str(repo),
                    "-k", "python3", "--no-progress-bar"], check=True, capture_output=True,
                   env={k: v for k, v in os.environ.items() if k not in ("STUDYLIB_ROOT", "STUDYLIB_OUTPUTS")})
    via_papermill = nbformat.read(str(repo / "show_out.ipynb"), as_version=4)
    line = _ctx_line(via_study)
    assert line == _ctx_line(via_papermill)
    assert line == (f"CTX {name} [1337, 1338, 1339] 1337 [('train.amp', 'off'), ('train.max_steps', 3)] off "
                    f"outputs/{name}")


def test_study_rejects_unknown_parameters_naming_the_allowed_ones(repo, monkeypatch, capsys):
    monkeypatch.chdir(repo)
    allowed = r"allowed: \['jobs', 'overrides', 'seeds'\]"
    with pytest.raises(study.ConfigError, match=r"-p seed: not a parameter .* " + allowed):
        study.run_study("params/t.yaml", notebooks=["03"], root=repo, parameters={"seed": 1}, report=False,
                        progress=False, echo=lambda m: None)
    # 01 declares params and jobs only: seeds is not one of its parameters
    with pytest.raises(study.ConfigError, match=r"allowed: \['jobs'\]"):
        study.run_study("params/t.yaml", notebooks=["01"], root=repo, parameters={"seeds": [1]}, report=False,
                        progress=False, echo=lambda m: None)
    with pytest.raises(study.ConfigError, match="give the preset with --params"):
        study.run_study("params/t.yaml", notebooks=["03"], root=repo, parameters={"params": "x"}, report=False,
                        progress=False, echo=lambda m: None)
    with pytest.raises(study.ConfigError, match="seeds: range '9-1' ends before it starts"):
        study.run_study("params/t.yaml", notebooks=["03"], root=repo, parameters={"seeds": "9-1"}, report=False,
                        progress=False, echo=lambda m: None)
    assert not (repo / "outputs").exists()  # nothing ran
    rc = main(["study", "--params", "params/t.yaml", "--notebooks", "03", "-p", "nope", "1"])
    assert rc == 2 and "error: -p nope: not a parameter" in capsys.readouterr().err


def _context_call(source: str) -> dict:
    """``{parameter of open_comparison: the name passed}`` of a notebook's one open_comparison call
    (its first argument is the comparison's name)."""
    import ast

    calls = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)
             and getattr(n.func, "id", getattr(n.func, "attr", None)) == "open_comparison"]
    assert len(calls) == 1, f"{len(calls)} open_comparison calls"
    bound = dict(zip(("params", "jobs", "seeds", "overrides"), calls[0].args[1:]))
    bound.update({k.arg: k.value for k in calls[0].keywords})
    return {k: getattr(v, "id", None) for k, v in bound.items()}


def test_every_study_notebook_takes_seeds_and_overrides():
    """The real notebooks: params, jobs, seeds and overrides in the parameters cell, all four
    handed to open_comparison (and so to notebook_context)."""
    import jupytext

    nb_dir = Path(__file__).parents[3] / "notebooks"
    for py in study.find_notebooks(nb_dir):
        names = study.notebook_parameters(py)
        assert {"params", "jobs", "seeds", "overrides"} <= set(names), (py.name, names)
        code = "\n".join(c.source for c in jupytext.read(str(py)).cells if c.cell_type == "code"
                         and "parameters" not in c.metadata.get("tags", []))
        code = "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))
        four = ("params", "jobs", "seeds", "overrides")
        call = _context_call(code)  # and the notebook's own parameters its comparison plans with (04: model)
        assert {k: call.get(k) for k in four} == {k: k for k in four}, py.name
        assert all(call[k] == k for k in set(call) - set(four)), py.name


def test_the_presets_study_notebooks_choose_the_default_selection(repo):
    raw = tiny_raw(name="t", study={"notebooks": ["01", 3]})
    (repo / "params" / "t.yaml").write_text(yaml.safe_dump(raw))
    lines = []
    res = study.run_study("params/t.yaml", root=repo, jobs=3, report=False, progress=False, echo=lines.append)
    assert list(res["notebooks"]) == ["01_ok", "03_show"]  # 02 (which fails) is not run
    assert any("the preset's study.notebooks: 01, 03" in line for line in lines)
    # --notebooks still chooses
    res = study.run_study("params/t.yaml", notebooks=["01"], root=repo, jobs=3, report=False, progress=False,
                          echo=lambda m: None)
    assert list(res["notebooks"]) == ["01_ok"]
    for bad, msg in ((["07"], "study.notebooks: no notebook '07'"), ("01", "study.notebooks: expected a non-empty list")):
        raw["study"]["notebooks"] = bad
        (repo / "params" / "t.yaml").write_text(yaml.safe_dump(raw))
        with pytest.raises(study.ConfigError, match=msg):
            study.run_study("params/t.yaml", root=repo, report=False, progress=False, echo=lambda m: None)


PICK = HEADER + textwrap.dedent("""\

    # %% tags=["parameters"]
    params = "params/other.yaml"
    jobs = None
    model = None

    # %%
    print("MODEL", model)
    """)


def test_a_notebook_parameter_names_its_executed_copy_beside_the_default(repo, monkeypatch):
    """`-p model X` (a parameter other than params / jobs / seeds / overrides) writes
    NN_name-model=X.ipynb, so the default run's notebook (and its nbval test) is kept."""
    (repo / "notebooks" / "04_pick.py").write_text(PICK)
    monkeypatch.chdir(repo)
    quiet = dict(root=repo, report=False, progress=False, echo=lambda m: None)
    default = study.run_study("params/t.yaml", notebooks=["04"], **quiet)
    picked = study.run_study("params/t.yaml", notebooks=["04"], parameters={"model": "moe x/1"}, **quiet)
    assert list(default["notebooks"]) == ["04_pick"] and list(picked["notebooks"]) == ["04_pick-model=moe_x_1"]
    nbs = repo / "outputs" / "t" / "notebooks"
    assert "MODEL None" in _stream_text(nbformat.read(str(nbs / "04_pick.ipynb"), as_version=4))
    assert "MODEL moe x/1" in _stream_text(nbformat.read(str(nbs / "04_pick-model=moe_x_1.ipynb"), as_version=4))
