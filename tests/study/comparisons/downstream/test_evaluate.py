"""Notebook 10: the paired gaps' verdict follows the CI and each metric's direction; written
results are reused, and a failed evaluation names its run directory."""
from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from studylib.study.comparisons.downstream import evaluate as downstream
from studylib.study.analysis.stats import paired


def _frame():
    rows = []
    # moe: higher accuracy on every seed by ~0.05 (resolved); word ppl noisy (not resolved);
    # bits per byte lower by ~0.02 on every seed (lower is better: resolved for the MoE)
    for seed, acc_d, acc_m, ppl_d, ppl_m, bpb_d, bpb_m in [(1, 0.30, 0.35, 10.0, 9.0, 1.20, 1.18),
                                                              (2, 0.31, 0.36, 10.0, 11.5, 1.21, 1.19),
                                                              (3, 0.29, 0.35, 10.0, 10.2, 1.19, 1.17)]:
        for model, acc, ppl, bpb in (("dense", acc_d, ppl_d, bpb_d), ("moe", acc_m, ppl_m, bpb_m)):
            rows.append({"model": model, "seed": seed, "lastword_acc": acc, "lastword_ppl": ppl,
                         "word_ppl": ppl, "bits_per_byte": bpb})
    return pd.DataFrame(rows)


def test_verdicts_are_worded_from_the_ci_and_the_metric_direction():
    g = downstream.metric_gaps(_frame(), "moe", ["dense"]).set_index("metric")
    want = paired([0.35, 0.36, 0.35], [0.30, 0.31, 0.29])
    assert g.loc["lastword_acc", "gap"] == pytest.approx(want.mean)
    assert (g.loc["lastword_acc", "ci_low"], g.loc["lastword_acc", "ci_high"]) == pytest.approx((want.ci_low, want.ci_high))
    # one family of 4 comparisons (one baseline): Holm over 4; A = the MoE
    assert (g["family_size"] == 4).all() and g.loc["lastword_acc", "p_holm"] == pytest.approx(
        min(1.0, 4 * g.loc["lastword_acc", "p"]) if g["p"].min() == g.loc["lastword_acc", "p"] else g.loc["lastword_acc", "p_holm"])
    assert g.loc["lastword_acc", "verdict"] == "A better" and g.loc["lastword_acc", "resolved"]
    assert g.loc["lastword_acc", "verdict_label"] == "moe better"
    assert g.loc["bits_per_byte", "verdict"] == "A better"  # lower is better, resolved after Holm
    assert g.loc["word_ppl", "verdict"] == "inconclusive" and not g.loc["word_ppl", "resolved"]
    s = downstream.gap_sentences(g.reset_index())
    assert s.startswith('Family "10 downstream') and "moe - dense, word_ppl: inconclusive" in s
    assert "moe - dense, lastword_acc: moe better, +0.0533" in s


# --- evaluating the runs ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """(root, {(model, seed): trained run dir}): two tiny runs trained on local synthetic stories."""
    pytest.importorskip("lm_eval")
    import torch
    from _tiny import tiny_preset, write_stories

    from studylib.run.trainer import train_run

    root = tmp_path_factory.mktemp("downstream")
    write_stories(root / "data", 600)
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {"STUDYLIB_DATA_DIR": root / "data", "STUDYLIB_CACHE_DIR": root / "cache",
                     "HF_HUB_OFFLINE": 1, "HF_DATASETS_OFFLINE": 1}.items():
            mp.setenv(k, str(v))
        n = torch.get_num_threads()
        torch.set_num_threads(1)
        preset = tiny_preset(data={"source": "local", "vocab_size": 320, "context": 33, "val_fraction": 0.2,
                                   "tokenizer_threads": 1},
                             train={"max_steps": 20, "eval_every": 20, "lr": 1e-2, "min_lr": 1e-3})
        runs = {}
        for model in ("dense", "moe"):
            runs[(model, 1)] = root / "trained" / model
            train_run(preset, model, 1, run_dir=runs[(model, 1)], progress=False)
        yield root, runs
        torch.set_num_threads(n)


def _copies(tiny_runs, name, monkeypatch):
    """Fresh copies (no lm-eval results) of the trained runs under ``name``; RunDir.of maps
    (model, seed) to them."""
    import shutil

    root, runs = tiny_runs
    dirs = {k: root / name / f"{k[0]}-{k[1]}" for k in runs}
    for k, d in dirs.items():
        shutil.copytree(runs[k], d)
    monkeypatch.setattr(downstream.RunDir, "of", classmethod(lambda cls, preset, m, s: cls(dirs[(m, s)])))
    return dirs


def _results(d):
    out = json.loads((d / "lm_eval" / "results.json").read_text())
    out.pop("run")  # the run's own path
    return out


def test_each_run_is_evaluated_once_and_its_results_reused(tiny_runs, monkeypatch):
    kw = dict(max_docs=40, batch_size=8)
    dirs = _copies(tiny_runs, "seq", monkeypatch)
    df = downstream.downstream_frame(None, ["dense", "moe"], [1], **kw)
    assert list(zip(df["model"], df["seed"])) == [("dense", 1), ("moe", 1)]
    for (m, s), d in dirs.items():  # each row holds its own run's results
        res = _results(d)["results"]
        assert df.set_index("model").loc[m, "word_ppl"] == float(res["tinystories_ppl"]["word_perplexity,none"])
    assert df["word_ppl"].nunique() == 2
    stamps = {k: (d / "lm_eval" / "results.json").stat().st_mtime_ns for k, d in dirs.items()}
    pd.testing.assert_frame_equal(downstream.downstream_frame(None, ["dense", "moe"], [1], **kw), df)
    assert stamps == {k: (d / "lm_eval" / "results.json").stat().st_mtime_ns for k, d in dirs.items()}


def test_a_failed_evaluation_names_its_run(tiny_runs, monkeypatch):
    """Both runs lack their data section (they fail fast, before loading lm-eval's model); the
    error is the first run's, naming its directory."""
    import yaml

    dirs = _copies(tiny_runs, "fail", monkeypatch)
    for d in dirs.values():
        doc = yaml.safe_load((d / "config.yaml").read_text())
        del doc["preset"]["data"]
        (d / "config.yaml").write_text(yaml.safe_dump(doc))
    first = re.escape(str(dirs[("dense", 1)]))
    with pytest.raises(downstream.DownstreamError, match=f"^downstream evaluation of {first} failed: ConfigError"):
        downstream.downstream_frame(None, ["dense", "moe"], [1], max_docs=40, batch_size=8)
