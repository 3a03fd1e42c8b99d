"""``studylib study``'s known errors (issue #33): a run that fails to train is one line and exit 2
(it was wrapped and exited 1), and the ``-p seeds`` limit counts the runs of the study's plan, not
the seeds, refused with the count before anything trains."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from conftest import require_subset
from studylib.cli import main
from studylib.config import ConfigError, load_preset
from studylib.study.comparisons import comparison, study_of
from studylib.study.orchestration.plan import MAX_RUNS, check_plan_size, plan_size
from studylib.study.runner.parameters import apply_parameters

ROOT = Path(__file__).resolve().parents[1]
CI = str(ROOT / "params" / "ci.yaml")
#: diverges at its first step (NonFiniteLossError): a real failed training run
DIVERGE = {"train.lr": 1.0e6, "train.min_lr": 1.0e5, "train.grad_clip": 0}


@pytest.fixture
def box(scratch, monkeypatch):
    """:func:`scratch` without $STUDYLIB_SCHEDULER."""
    monkeypatch.delenv("STUDYLIB_SCHEDULER", raising=False)
    return scratch


def _errors(argv, capsys) -> tuple[int, list[str], str]:
    rc = main(argv)
    err = capsys.readouterr().err
    return rc, [ln for ln in err.splitlines() if ln.startswith("error:")], err


@pytest.mark.parametrize("jobs", ["1", pytest.param("2", marks=pytest.mark.slow)])
def test_a_run_that_fails_to_train_stops_the_study_with_one_line_and_exit_2(box, capsys, monkeypatch, jobs):
    """--jobs 1 trains in this process, --jobs 2 on a local Dask cluster: the same one line."""
    monkeypatch.setenv("STUDYLIB_DATA_DIR", str(require_subset()))
    rc, errors, err = _errors(["study", "--params", CI, "--notebooks", "03", "--no-report", "--no-progress",
                               "--jobs", jobs, "-p", "overrides", yaml.safe_dump(DIVERGE, default_flow_style=True)],
                              capsys)
    assert rc == 2, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    assert len(errors) == 1 and err.rstrip().splitlines()[-1] == errors[0], err[-2000:]
    # the run that fails first names itself: with two workers, either of the first two seeds
    assert "failed" in errors[0] and "NonFiniteLossError" in errors[0], errors
    assert re.search(r"training \w+ seed (1337|1338) failed", errors[0]), errors
    assert not list((box / "out").rglob("*.ipynb"))  # no notebook started after the failed run


# ---- the seeds limit counts runs -------------------------------------------------------------------
def _grids(q, *stems):
    """The grids of the named notebooks' comparisons (their plans), in order."""
    study = study_of(q)
    return [g for stem in stems for g in comparison(stem).plan(study)]


def test_the_plan_size_counts_runs_seeds_times_models_shared_runs_once():
    q, _ = apply_parameters(load_preset(CI), "1-10")
    headline = _grids(q, "03_headline_sweep")
    assert plan_size(q, headline[:1]) == len(study_of(q).headline) * 10  # the trio x 10 seeds
    assert plan_size(q, headline) > plan_size(q, headline[:1])  # + the noise split's runs around seed 1
    # notebooks 03 and 04 read the same runs: counted once
    assert plan_size(q, _grids(q, "03_headline_sweep", "04_routing_diagnostics")) == plan_size(q, headline)
    assert plan_size(q, _grids(q, "01_budget_matching")) == 0  # reads configs only


def test_seeds_under_the_limit_that_give_more_runs_than_it_are_refused_with_the_count():
    q, _ = apply_parameters(load_preset(CI), "1-400")  # 400 seeds: under the limit, but more runs than it
    n = plan_size(q, _grids(q, "03_headline_sweep"))
    assert n > MAX_RUNS
    with pytest.raises(ConfigError, match=rf"^seeds: 400 seeds give {n:,} runs in the plan of notebook 03 .*more "
                                          rf"than the {MAX_RUNS:,} runs a study takes"):
        check_plan_size(q, _grids(q, "03_headline_sweep"), "notebook 03")
    assert check_plan_size(q, [], "notebook 01") == 0


def test_study_with_seeds_that_give_too_many_runs_is_one_line_before_anything_is_written(box, capsys):
    rc, errors, err = _errors(["study", "--params", CI, "--notebooks", "03", "-p", "seeds", "1-400", "--no-report",
                               "--no-progress"], capsys)
    assert rc == 2 and len(errors) == 1 and "Traceback" not in err, err
    q, _ = apply_parameters(load_preset(CI), "1-400")
    assert f"seeds: 400 seeds give {plan_size(q, _grids(q, '03_headline_sweep')):,} runs in the plan of notebook(s) 03" \
        in errors[0]
    assert not (box / "out" / "ci" / "runs").exists() and not (box / "cache").exists()
    # the same seeds on a notebook that trains nothing are fine: the limit is on runs
    q, _ = apply_parameters(load_preset(CI), f"1-{MAX_RUNS}")
    assert check_plan_size(q, _grids(q, "01_budget_matching"), "notebook 01") == 0


# ---- a finished run's damaged metrics.jsonl (issue #41) ------------------------------------------
def _nan_loss(lines: list[str]) -> tuple[list[str], str]:
    at = next(i for i, line in enumerate(lines) if '"kind": "eval"' in line)
    lines[at] = re.sub(r'"val_loss": [^,]+', '"val_loss": NaN', lines[at])
    return lines, rf"line {at + 1}: val_loss is nan; expected a finite number"


def _not_json(lines: list[str]) -> tuple[list[str], str]:
    return lines[:2] + ["this is not json {\n"] + lines[2:], r"line 3 is not JSON \(Expecting value"


@pytest.mark.parametrize("damage", [_nan_loss, _not_json])
def test_a_finished_run_with_a_damaged_metrics_file_stops_the_study_before_anything_trains(box, capsys, monkeypatch,
                                                                                            damage):
    """It exited 0: the bad line dropped silently, the NaN kept in the curves."""
    monkeypatch.setenv("STUDYLIB_DATA_DIR", str(require_subset()))
    assert main(["train", "--params", CI, "--model", "moe_top2_z", "--seed", "1338"]) == 0
    run = box / "out" / "ci" / "runs" / "moe_top2_z" / "seed1338"
    metrics = run / "metrics.jsonl"
    lines, match = damage(metrics.read_text().splitlines(keepends=True))
    metrics.write_text("".join(lines))
    capsys.readouterr()
    rc, errors, err = _errors(["study", "--params", CI, "--notebooks", "04", "03", "--no-report", "--no-progress",
                               "--jobs", "1"], capsys)
    assert rc == 2 and len(errors) == 1 and "Traceback" not in err, err[-2000:]
    assert re.match(rf"error: {re.escape(str(metrics))}: {match}", errors[0]), errors
    assert [p.parent.relative_to(box / "out") for p in (box / "out").rglob("config.yaml")] == \
        [run.relative_to(box / "out")]  # no other run started
    assert not list((box / "out").rglob("*.ipynb"))


@pytest.mark.parametrize("notebook, name, value", [("04", "model", "5"), ("08", "run", "[a, b]"), ("08", "prompt", "5")])
def test_a_notebook_parameter_of_the_wrong_type_is_one_line_before_anything_trains(box, capsys, notebook, name, value):
    """-p run 5 trained notebook 08's default run, then failed in the notebook (exit 1)."""
    rc, errors, err = _errors(["study", "--params", CI, "--notebooks", notebook, "-p", name, value, "--no-report",
                               "--no-progress"], capsys)
    assert rc == 2 and len(errors) == 1 and "Traceback" not in err, err[-2000:]
    assert re.match(rf"error: {name}: expected a string or None, got ", errors[0]), errors
    assert not (box / "out").exists() and not (box / "cache").exists()


# ---- the map's budgets (issue #41) ------------------------------------------------------------------
@pytest.mark.parametrize("budgets, line", [
    ([1e9], r"study\.token_budget\.trios\[1\]\.tokens_per_param: 1e\+09 tokens per active parameter is [\d,]+ optimizer "
            r"steps, [\d,]+ times the preset's train\.max_steps = 12; at most 100"),
    ([0.001, 0.002, 0.003], r"study\.token_budget\.trios\[1\]\.tokens_per_param: 0\.001 tokens per active parameter is "
                            r"[\d.e-]+ optimizer steps, fewer than the preset's warm-up of 1"),
])
def test_a_map_budget_out_of_range_is_one_line_before_anything_trains(box, capsys, budgets, line):
    """A budget of 1e9 tokens/param queued runs of 41,709,677,419 steps (a hang); 0.001-0.003 became
    one map point of one step, silently."""
    raw = yaml.safe_load((ROOT / "params" / "ci.yaml").read_text())
    raw["study"]["token_budget"]["trios"][1]["tokens_per_param"] = budgets
    raw["study"]["token_budget"]["trios"][1].pop("repeat", None)  # its repeated budget is one of the old ones
    raw["name"] = "ci"
    params = box / "params" / "ci_budget.yaml"
    params.parent.mkdir()
    params.write_text(yaml.safe_dump(raw))
    rc, errors, err = _errors(["study", "--params", str(params), "--notebooks", "09", "--no-report", "--no-progress"],
                              capsys)
    assert rc == 2 and len(errors) == 1 and "Traceback" not in err, err[-2000:]
    assert re.match("error: " + line, errors[0]), errors
    assert not (box / "out" / "ci" / "runs").exists()


# ---- finished runs read on other stories (issue #49) ------------------------------------------------
def _edit_one_word(data: Path) -> None:
    import gzip

    text = gzip.decompress((data / "train.txt.gz").read_bytes()).decode()
    i = text.index(" the ")
    (data / "train.txt.gz").write_bytes(gzip.compress((text[:i] + " a " + text[i + 5:]).encode()))


def test_a_finished_run_read_on_other_stories_is_refused_by_train_and_by_the_studys_plan(box, capsys, monkeypatch):
    """``study`` refused it ("finished on other data"); ``train`` on the finished run said "skipping"
    and a notebook kernel on the study's plan (papermill by hand) wrote tables from it, exit 0."""
    import shutil

    from studylib.run.spec import RunSpec
    from studylib.study.orchestration.plan import Grid
    from studylib.study.orchestration.plan_file import read_plan, write_plan

    data = box / "stories"
    data.mkdir()
    shutil.copy(require_subset() / "train.txt.gz", data / "train.txt.gz")
    monkeypatch.setenv("STUDYLIB_DATA_DIR", str(data))
    argv = ["train", "--params", CI, "--model", "moe_top2_z", "--seed", "1338"]
    assert main(argv) == 0
    assert main(argv) == 0 and "finished run found" in capsys.readouterr().err  # the same stories: skipped
    spec = RunSpec.resolve(load_preset(CI), "moe_top2_z", 1338)
    plan = write_plan(box / "plan.json", "k", [Grid(["moe_top2_z"], [1338])], [[spec]])
    assert read_plan(plan, "k")[1][0][0].run_dir == spec.run_dir
    _edit_one_word(data)
    rc, errors, err = _errors(argv, capsys)
    assert rc == 2 and len(errors) == 1 and "Traceback" not in err, err[-2000:]
    assert errors[0].startswith(f"error: {spec.run_dir}: finished on other data than the stories read now "
                                f"(corpus (story texts) sha256 "), errors
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(spec.run_dir))}: finished on other data"):
        read_plan(plan, "k")  # the kernel's path: the plan's key holds, the stories changed


@pytest.mark.parametrize("damage", [lambda d: d.pop("grids"), lambda d: d["grids"][0].pop("runs"),
                                    lambda d: d["grids"][0]["runs"][0].pop()])
def test_a_plan_file_with_its_key_but_damaged_fields_is_one_line_naming_it(tmp_path, damage):
    import json

    from studylib.run.spec import RunSpec
    from studylib.study.orchestration.plan import Grid
    from studylib.study.orchestration.plan_file import read_plan, write_plan

    spec = RunSpec.resolve(load_preset(CI), "moe_top2_z", 1338, root=tmp_path)
    plan = write_plan(tmp_path / "plan.json", "k", [Grid(["moe_top2_z"], [1338])], [[spec]])
    doc = json.loads(plan.read_text())
    damage(doc)
    plan.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(plan))}: a damaged plan \(") as e:
        read_plan(plan, "k")
    assert "\n" not in str(e.value)
    assert read_plan(plan, "another key") is None  # another plan's file: the kernel plans by itself
