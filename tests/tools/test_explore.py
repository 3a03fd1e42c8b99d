"""Routing explorer (studylib.tools.explorer): the functions on tiny finished runs (sparse, soft, dense),
and the ipywidgets explorer driven from Python. The tiny study is built by ``conftest.py``."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ipywidgets")

from studylib.run.rundir import RunDir  # noqa: E402
from studylib.tools import explorer as explore  # noqa: E402

STEPS = [4, 8, 12]


@pytest.fixture(scope="session")
def study(explore_study):
    return explore_study


@pytest.fixture(scope="session")
def loaded(study):
    return {m: RunDir(rd).load_model() for m, rd in study["runs"].items()}


# --------------------------------------------------------------------------------------------
# runs and checkpoints
# --------------------------------------------------------------------------------------------
def test_list_runs_labels(study):
    found = explore.list_runs(study["root"] / "outputs")
    assert [(r.preset, r.model, r.seed, r.kind) for r in found] == [
        ("explore_tiny", "dense", 1, "dense"), ("explore_tiny", "moe", 1, "moe"), ("explore_tiny", "soft", 1, "soft")]
    assert all(r.finished for r in found)
    assert os.fspath(found[1]) == str(study["runs"]["moe"])
    assert "moe" in found[1].label and "seed1" in found[1].label
    # the preset's own folder and a run directory work as roots too; nonsense gives nothing
    assert [r.model for r in explore.list_runs(study["outputs"])] == ["dense", "moe", "soft"]
    assert [r.model for r in explore.list_runs(study["runs"]["soft"])] == ["soft"]
    assert explore.list_runs(study["root"] / "nope") == []


def test_list_runs_offers_variant_runs_and_names_the_configs_it_cannot_read(study, tmp_path):
    """A budget-map run lives in runs/<model>/<tag>/seed<N>: the explorer offers it, labelled
    with its tag; a run whose config.yaml is broken is left out with a warning naming the file."""
    out = tmp_path / "explore_tiny"
    shutil.copytree(study["outputs"], out)
    tag = "train.max_steps=6"
    variant = out / "runs" / "moe" / tag / "seed1"
    shutil.copytree(study["runs"]["moe"], variant)
    broken = out / "runs" / "soft" / "seed1" / "config.yaml"
    broken.write_text("run: [unclosed\n")
    with pytest.warns(UserWarning, match=r"soft/seed1/config.yaml: cannot be read .*not offered"):
        found = explore.list_runs(out)
    assert [(r.model, r.tag) for r in found] == [("dense", None), ("moe", None), ("moe", tag)]
    assert os.fspath(found[2]) == str(variant) and f"moe [{tag}]" in found[2].label
    assert RunDir(variant).preset_folder == out  # what notebook 08 offers: every run of the preset


def test_run_steps_and_loading_at_a_step(study, tmp_path):
    """What the checkpoint slider offers (RunDir.checkpoint_steps) and loads (RunDir.load_model),
    and the step carried into the views' captions."""
    rd = RunDir(study["runs"]["moe"])
    assert rd.checkpoint_steps() == STEPS  # one snapshot per evaluation (train.keep_checkpoints)
    # without keep_checkpoints only latest.pt exists: its step
    bare = tmp_path / "run"
    shutil.copytree(rd.path, bare)
    for p in (bare / "checkpoints").glob("step_*.pt"):
        p.unlink()
    assert RunDir(bare).checkpoint_steps() == [12]
    assert RunDir(tmp_path / "missing").checkpoint_steps() == []
    l4, l12, latest = rd.load_model(step=4), rd.load_model(step=12), rd.load_model()
    assert [r.step for r in (l4, l12, latest)] == [4, 12, 12]
    assert l4.tokenizer is not None and l4.tokenizer.get_piece_size() == 384 and l4.config.context == 32
    w4, w12, wl = (r.model.blocks[0].ffn.router.weight for r in (l4, l12, latest))
    assert not np.allclose(w4.detach().numpy(), w12.detach().numpy())
    assert np.array_equal(w12.detach().numpy(), wl.detach().numpy())
    with pytest.raises(ValueError, match=r"no checkpoint at step 5; saved steps: \[4, 8, 12\]"):
        rd.load_model(step=5)
    v = explore.route_text(l4.model, l4.tokenizer, TEXT, label="moe seed1", step=l4.step)
    assert v.step == 4 and v.title == "moe seed1 @ step 4"
    assert explore.route_text(l4.model, l4.tokenizer, TEXT).title == "moe"  # the model name; no step given


# --------------------------------------------------------------------------------------------
# routing a text
# --------------------------------------------------------------------------------------------
TEXT = "Once upon a time, there was a little dog."


def test_route_text_sparse(loaded):
    model, tok = loaded["moe"].model, loaded["moe"].tokenizer
    v = explore.route_text(model, tok, TEXT, label="moe")
    ids = [tok.eos_id()] + tok.encode(TEXT)
    assert v.ids == ids and v.n_prefix == 1
    assert v.tokens == [tok.id_to_piece(i) for i in ids] and v.tokens[0] == "</s>"
    assert v.status == "ok" and v.routed and v.kind == "moe"
    assert v.kinds == ["moe", "moe"] and (v.num_experts, v.top_k) == (4, 2)
    S = len(ids)
    for layer in range(2):
        w, p = v.weights[layer], v.probs[layer]
        assert w.shape == p.shape == (S, 4)
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
        np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)
        assert ((w > 0).sum(-1) == 2).all()
        for t in range(S):
            chosen = v.experts[layer][t]
            assert len(chosen) == 2 and w[t, chosen[0]] >= w[t, chosen[1]]
            assert set(chosen) == set(np.argsort(-p[t])[:2])  # top-2 of the router softmax
            np.testing.assert_allclose(w[t, chosen], p[t, chosen] / p[t, chosen].sum(), rtol=1e-5)
    assert (v.top_expert[:, 0] == v.weights[0].argmax(-1)).all()
    assert np.all(v.top_weight >= 0.5)
    assert np.isnan(v.nll[0]) and np.isfinite(v.nll[1:]).all()
    fr = v.to_frame()
    assert len(fr) == S * 2 * 2 and set(fr["rank"]) == {0, 1}
    assert not fr["by_bias"].any() and v.bias_share == {0: 0.0, 1: 0.0}  # no selection bias
    assert model.training is False


def _biased_sigmoid(loaded):
    """The tiny MoE's weights under a sigmoid router whose bias always adds expert 3 (saved as a
    checkpoint of the old layout, ``ffn.expert_bias_E``, which still loads)."""
    import dataclasses

    import torch

    from studylib.nn.model import Decoder

    base = loaded["moe"].model
    f = dataclasses.replace(base.cfg.ffn, score="sigmoid", bias_balance=True)
    model = Decoder(dataclasses.replace(base.cfg, ffn=f))
    state = dict(base.state_dict())
    state.update({f"blocks.{i}.ffn.expert_bias_E": torch.tensor([0.0, 0.0, 0.0, 5.0]) for i in range(2)})
    model.load_state_dict(state)
    return model.eval()


def test_route_text_with_a_sigmoid_router_and_a_selection_bias(loaded):
    """A sigmoid router whose bias forces expert 3: the view shows the model's own choice, the
    normalised sigmoid scores as probabilities, and marks expert 3 as picked by the bias wherever
    it was not among the two most probable."""
    model, tok = _biased_sigmoid(loaded), loaded["moe"].tokenizer
    v = explore.route_text(model, tok, TEXT, label="sigmoid+bias")
    fr = v.to_frame()
    for layer in range(2):
        p = v.probs[layer]
        np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)
        assert all(3 in c for c in v.experts[layer])
        for t, chosen in enumerate(v.experts[layer]):
            expect = {3} if 3 not in set(np.argsort(-p[t])[:2]) else set()
            assert v.picked_by_bias(layer, t) == expect
    assert fr["by_bias"].any() and 0 < v.bias_share[0] <= 0.5
    for layer in range(2):  # the model's own diagnostic, counted in its forward, agrees
        assert v.router_stats[layer]["bias_picked"] == pytest.approx(v.bias_share[layer], abs=1e-6)


@pytest.mark.parametrize("router", ["reference", "sigmoid_bias"])
def test_the_explorers_chosen_experts_are_the_forwards(loaded, router):
    """What the view shows as each token's experts is what the model's forward used: the experts
    of a per-token reference written out here (top-k of score + bias, from the input each FFN saw)."""
    import torch

    model = loaded["moe"].model if router == "reference" else _biased_sigmoid(loaded)
    tok = loaded["moe"].tokenizer
    v = explore.route_text(model, tok, TEXT)
    seen = {}
    hooks = [b.ffn.register_forward_pre_hook(lambda mod, a, i=i: seen.__setitem__(i, a[0][0]))
             for i, b in enumerate(model.blocks)]
    with torch.no_grad():
        model(torch.tensor([v.ids]))
    for h in hooks:
        h.remove()
    for layer, blk in enumerate(model.blocks):
        r, cfg = blk.ffn.router, blk.ffn.cfg
        for t in range(len(v.ids)):
            logit = (r.weight @ seen[layer][t]).detach() * cfg.router_scale
            s = torch.softmax(logit, -1) if cfg.score == "softmax" else torch.sigmoid(logit)
            pick = s + r.bias_E if cfg.bias_balance else s
            expect = sorted(range(cfg.num_experts), key=lambda e: -float(pick[e]))[:cfg.top_k]
            assert v.experts[layer][t] == sorted(expect, key=lambda e: -float(s[e]))  # by weight
    if router == "sigmoid_bias":
        assert all(3 in c for c in v.experts[0])


def test_a_hash_router_shows_no_scores_not_a_uniform_distribution(loaded):
    """The hash router has no scores: its entropy, gate, margin and log Z read ln 4, 0.25, 0 and
    ln 4 (the numbers of its all-zero stand-in logits) and its experts outside the first two were
    marked "picked by the bias". Now they are NaN with the reason, and nothing is marked."""
    import dataclasses

    from studylib.nn.model import Decoder
    from studylib.nn.router import hash_table

    base = loaded["moe"].model
    f = dataclasses.replace(base.cfg.ffn, router="hash", balance_coef=0.0, z_coef=0.0)
    model = Decoder(dataclasses.replace(base.cfg, ffn=f))
    model.load_state_dict({k: v for k, v in base.state_dict().items() if not k.endswith("router.weight")})
    tok = loaded["moe"].tokenizer
    v = explore.route_text(model, tok, TEXT, label="hash")
    table = hash_table(base.cfg.vocab_size, 4, 2)
    fr = v.to_frame()
    for layer in range(2):
        assert [sorted(c) for c in v.experts[layer]] == table[v.ids].tolist()  # the table's experts
        assert np.isnan(v.probs[layer]).all()
        st = v.router_stats[layer]
        assert all(np.isnan(st[m]) for m in ("entropy", "top1", "margin", "logz")), st
        assert st["note"] == "hash router: no scores" and np.isfinite(st["busiest"])
    assert fr["prob"].isna().all() and not fr["by_bias"].any() and v.bias_share == {}
    g = explore.generate_and_route(model, tok, "Once upon a time", 2).generation
    assert all(np.isnan(rec[layer]["probs"]).all() for rec in g.routing for layer in range(2))


def test_route_text_soft(loaded):
    model, tok = loaded["soft"].model, loaded["soft"].tokenizer
    v = explore.route_text(model, tok, TEXT)
    assert v.kind == "soft" and (v.num_experts, v.top_k) == (3, 3) and v.status == "ok"
    for layer in range(2):
        w = v.weights[layer]
        assert (w > 0).all()
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
        np.testing.assert_allclose(w, v.probs[layer], atol=1e-6)  # the gate is the router softmax
        assert all(sorted(c) == [0, 1, 2] for c in v.experts[layer])
    assert np.all(v.top_weight >= 1 / 3 - 1e-6)


def test_route_text_dense_says_nothing_to_route(loaded):
    model, tok = loaded["dense"].model, loaded["dense"].tokenizer
    v = explore.route_text(model, tok, TEXT, label="dense seed1")
    assert not v.routed and v.kind == "dense" and v.weights == [None, None]
    assert v.status.startswith("nothing to route") and "dense seed1" in v.status
    assert (v.top_expert == -1).all() and np.isnan(v.top_weight).all()
    sh = explore.expert_shares(v)
    assert sh.empty and sh.attrs["status"].startswith("nothing to route")
    fig = explore.routing_grid_figure(v)
    assert any("nothing to route" in t.get_text() for t in fig.axes[0].texts)
    assert explore.figure_png(fig)[:4] == b"\x89PNG"


def test_route_mixed_layers_and_long_text(loaded):
    import dataclasses

    from studylib.nn.model import Decoder

    model, tok, cfg = loaded["moe"].model, loaded["moe"].tokenizer, loaded["moe"].config
    mixed = Decoder(dataclasses.replace(cfg, ffn=dataclasses.replace(cfg.ffn, layers=(1,))))
    v = explore.route_text(mixed, tok, TEXT)
    assert v.kinds == ["dense", "moe"] and v.routed_layers == [1] and v.weights[0] is None
    assert list(explore.expert_shares(v).index) == [1]
    fig = explore.routing_grid_figure(v)
    assert "dense" in [t.get_text() for t in fig.axes[0].texts]
    long = explore.route_text(model, tok, " ".join([TEXT] * 10))
    assert len(long.ids) == cfg.context and long.truncated > 0
    with pytest.raises(ValueError, match="empty"):
        explore.route_text(model, tok, "", prepend_eos=False)


def test_routing_grid_figure_labels_and_compare(loaded, study):
    model, tok = loaded["moe"].model, loaded["moe"].tokenizer
    a = explore.route_text(model, tok, TEXT, label="a")
    b = explore.route_text(model, tok, "The cat sat on the mat.", label="b")
    fig = explore.routing_grid_figure(a)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == a.tokens
    assert [t.get_text() for t in ax.get_xticklabels()] == ["L0\nmoe", "L1\nmoe"]
    assert len([t for t in ax.texts if t.get_text().startswith("e")]) == 2 * len(a.ids)
    assert [t.get_text() for t in explore.routing_grid_figure(b).axes[0].get_yticklabels()] == b.tokens
    # side by side with another checkpoint of the same run
    m4 = RunDir(study["runs"]["moe"]).load_model(step=4).model
    c = explore.route_ids(m4, tok, a.ids, n_prefix=1, label="step 4")
    fig2 = explore.routing_grid_figure(a, c)
    assert len(fig2.axes) == 2 and "step 4" in fig2.axes[1].get_title()
    assert len(explore.figure_png(fig2)) > 1000
    # rows are capped
    fig3 = explore.routing_grid_figure(a, max_tokens=5)
    assert len(fig3.axes[0].get_yticklabels()) == 5


def test_expert_shares(loaded):
    model, tok = loaded["moe"].model, loaded["moe"].tokenizer
    v = explore.route_text(model, tok, TEXT)
    sh = explore.expert_shares(v)
    assert list(sh.index) == [0, 1] and list(sh.columns) == ["e0", "e1", "e2", "e3"]
    np.testing.assert_allclose(sh.sum(axis=1), 1.0)
    counts = np.zeros(4)
    for chosen in v.experts[1][1:]:  # without the </s> prefix
        counts[chosen] += 1
    np.testing.assert_allclose(sh.loc[1].to_numpy(), counts / counts.sum())
    assert sh.attrs["measure"] == "assign" and sh.attrs["tokens"] == len(v.ids) - 1
    top1 = explore.expert_shares(v, measure="top1", include_prefix=True)
    np.testing.assert_allclose(top1.loc[0].to_numpy(), np.bincount(v.top_expert[:, 0], minlength=4) / len(v.ids))
    soft = explore.route_text(loaded["soft"].model, loaded["soft"].tokenizer, TEXT)
    ssh = explore.expert_shares(soft)
    assert ssh.attrs["measure"] == "gate"
    np.testing.assert_allclose(ssh.loc[0].to_numpy(), soft.weights[0][1:].mean(0), rtol=1e-6)
    with pytest.raises(ValueError):
        explore.expert_shares(v, measure="bogus")


def test_compare_views(loaded, study):
    model, tok = loaded["moe"].model, loaded["moe"].tokenizer
    a = explore.route_text(model, tok, TEXT)
    same = explore.compare_views(a, a)
    assert (same["top1_agree"] == 1).all() and (same["top1_agree_matched"] == 1).all()
    assert (same["chosen_overlap"] == 1).all() and (same["weight_tv"] == 0).all()
    assert same["tokens"].iloc[0] == len(a.ids)
    # relabelled experts: raw agreement drops, matched agreement stays 1
    perm = [1, 2, 3, 0]
    b = explore.RoutingView(**{**a.__dict__, "weights": [w[:, np.argsort(perm)] for w in a.weights],
                               "probs": [p[:, np.argsort(perm)] for p in a.probs],
                               "experts": [[[perm[e] for e in c] for c in lay] for lay in a.experts]})
    rel = explore.compare_views(a, b)
    assert (rel["top1_agree"] == 0).all() and (rel["top1_agree_matched"] == 1).all()
    assert (rel["chosen_overlap"] < 1).all()
    # two checkpoints of one run on the same tokens
    m4 = RunDir(study["runs"]["moe"]).load_model(step=4).model
    c = explore.route_ids(m4, tok, a.ids, n_prefix=1)
    cmp = explore.compare_views(a, c)
    assert cmp["top1_agree"].between(0, 1).all()
    assert (cmp["top1_agree_matched"] >= cmp["top1_agree"]).all()
    assert (cmp["weight_tv"] > 0).all()
    # a dense view: nothing to compare, said per layer
    d = explore.route_text(loaded["dense"].model, loaded["dense"].tokenizer, TEXT)
    cd = explore.compare_views(a, d)
    assert cd["top1_agree"].isna().all() and cd["note"].str.contains("b is dense").all()
    assert (explore.compare_views(d, d)["note"] == "nothing to compare: a is dense and b is dense").all()
    # soft vs sparse: different expert counts, still top-1 agreement and overlap
    s = explore.route_text(loaded["soft"].model, loaded["soft"].tokenizer, TEXT)
    cs = explore.compare_views(a, s)
    assert cs["top1_agree"].notna().all() and cs["weight_tv"].isna().all()
    # only the common prefix is compared; nothing in common is an error
    short = explore.route_text(model, tok, "Once upon")
    assert explore.compare_views(a, short)["tokens"].iloc[0] == len(short.ids)
    with pytest.raises(ValueError, match="share no leading token"):
        explore.compare_views(a, explore.route_text(model, tok, "Hello", prepend_eos=False))


def test_diagnostics_over_training(study):
    df = explore.diagnostics_over_training(study["runs"]["moe"])
    assert df.attrs["steps"] == STEPS and df.attrs["selected_step"] is None
    assert len(df) == 3 * 2 and sorted(set(df["layer"])) == [0, 1]
    assert set(df["kind"]) == {"moe"}
    for col in ("val_loss", "train_loss", "busiest", "entropy", "top1", "margin", "logz"):
        assert df[col].notna().all(), col
    assert all(abs(sum(s) - 1) < 1e-6 for s in df["shares"])
    assert df["val_loss"].iloc[-1] < df["val_loss"].iloc[0]
    # the step selector: the last eval at or before the step
    assert set(explore.diagnostics_over_training(study["runs"]["moe"], step=9)["step"]) == {8}
    assert explore.diagnostics_over_training(study["runs"]["moe"], step=9).attrs["selected_step"] == 8
    assert set(explore.diagnostics_over_training(study["runs"]["moe"], step=1)["step"]) == {4}
    assert set(explore.diagnostics_over_training(study["runs"]["moe"], step=12)["step"]) == {12}
    soft = explore.diagnostics_over_training(study["runs"]["soft"])
    assert soft["usage_entropy"].notna().all() and soft["max_gt_0.9"].notna().all()
    dense = explore.diagnostics_over_training(study["runs"]["dense"])
    assert set(dense["kind"]) == {"dense"} and dense["entropy"].isna().all() and dense["val_loss"].notna().all()
    fig = explore.diagnostics_figure(df, step=8)
    titles = [a.get_title() for a in fig.axes if a.get_title()]
    assert "validation loss" in titles and "router entropy" in titles
    assert any(line.get_xdata()[0] == 8 for a in fig.axes for line in a.get_lines() if line.get_linestyle() == "--")
    fig_d = explore.diagnostics_figure(dense)
    assert [a.get_title() for a in fig_d.axes if a.get_title()] == ["validation loss"]
    assert explore.diagnostics_over_training(study["root"] / "nope").empty


def test_generate_and_route(loaded):
    model, tok, cfg = loaded["moe"].model, loaded["moe"].tokenizer, loaded["moe"].config
    prompt = "Once upon a time"
    v = explore.generate_and_route(model, tok, prompt, 10)
    n_prompt = 1 + len(tok.encode(prompt))
    assert v.n_prompt == n_prompt and len(v.ids) == n_prompt + 10
    g = v.generation
    assert v.ids[n_prompt:] == g.tokens and v.continuation == tok.decode(g.tokens)
    assert v.text == prompt and v.tokens[-1] == tok.id_to_piece(g.tokens[-1])
    # the full forward routes each producing position as the decoder did (KV cache)
    for i, rec in enumerate(g.routing):
        pos = n_prompt - 1 + i
        for layer in range(cfg.n_layers):
            assert sorted(rec[layer]["experts"]) == sorted(v.experts[layer][pos])
            np.testing.assert_allclose(sorted(rec[layer]["weights"]), sorted(v.weights[layer][pos][v.experts[layer][pos]]),
                                       atol=1e-4)
    # greedy is deterministic; sampling with a seed too
    assert explore.generate_and_route(model, tok, prompt, 10).ids == v.ids
    s1 = explore.generate_and_route(model, tok, prompt, 10, temperature=1.0, seed=3)
    assert explore.generate_and_route(model, tok, prompt, 10, temperature=1.0, seed=3).ids == s1.ids
    # generated tokens are marked in the grid (red labels) and the token HTML
    fig = explore.routing_grid_figure(v)
    labels = fig.axes[0].get_yticklabels()
    assert labels[-1].get_color() != labels[1].get_color()
    assert "studylib-continuation" in explore.tokens_html(v)
    # dense: text, and nothing to route
    d = explore.generate_and_route(loaded["dense"].model, loaded["dense"].tokenizer, prompt, 5)
    assert len(d.ids) == n_prompt + 5 and not d.routed
    # n_new beyond the context is capped, the prompt cut from the left
    far = explore.generate_and_route(model, tok, prompt, 100)
    assert len(far.ids) == cfg.context and far.n_prompt == 1 and far.truncated == n_prompt - 1


# --------------------------------------------------------------------------------------------
# the widgets, driven from Python
# --------------------------------------------------------------------------------------------
def test_explorer_widgets(study):
    runs_ = study["runs"]
    ex = explore.build_explorer(study["root"] / "outputs", run=runs_["moe"])
    assert ex.error is None, ex.error
    assert [v for _, v in ex.run.options] == [str(runs_[m]) for m in ("dense", "moe", "soft")]
    assert ex.run.value == str(runs_["moe"])
    # the checkpoint slider covers exactly the saved steps; the latest is selected
    assert list(ex.step.options) == RunDir(runs_["moe"]).checkpoint_steps() == STEPS
    assert ex.step.value == 12 and ex.view.step == 12
    assert list(ex.diag_step.options) == STEPS and ex.diag_step.value == 12
    assert ex.grid.value[:4] == b"\x89PNG" and ex.diag_plot.value[:4] == b"\x89PNG"
    assert ex.view.text == explore.PRESET_PROMPTS[0]
    assert "e0" in ex.shares.value and "At eval step 12" in ex.diag_table.value

    # typing a prompt re-routes: the grid's token labels follow it
    png = ex.grid.value
    before = [t.get_text() for t in ex.grid_figure.axes[0].get_yticklabels()]
    ex.prompt.value = "The dog ran to the park"
    labels = [t.get_text() for t in ex.grid_figure.axes[0].get_yticklabels()]
    tok = RunDir(runs_["moe"]).load_model().tokenizer
    want = [tok.id_to_piece(i) for i in [tok.eos_id()] + tok.encode("The dog ran to the park")]
    assert labels == ex.view.tokens == want and labels != before and ex.grid.value != png
    assert "▁The" in ex.tokens.value and ex.view.text == "The dog ran to the park"

    # the checkpoint slider loads that step; the diagnostics step follows it
    ex.step.value = 4
    assert ex.view.step == 4 and ex.diag_step.value == 4 and ex.diag_df.attrs["selected_step"] == 4
    assert "At eval step 4" in ex.diag_table.value
    ex.diag_step.value = 8  # its own selector
    assert ex.diag_df.attrs["selected_step"] == 8 and ex.view.step == 4

    # compare with another checkpoint of the same run, then with the soft run
    ex.compare_run.value = "__same_run__"
    assert list(ex.compare_step.options) == STEPS and ex.compare.step != ex.view.step
    assert ex.comparison_df is not None and list(ex.comparison_df.index) == [0, 1]
    assert "top1_agree" in ex.comparison.value and len(ex.grid_figure.axes) == 2
    ex.compare_step.value = 12
    assert ex.compare.step == 12
    ex.compare_run.value = str(runs_["soft"])
    assert ex.compare.kind == "soft" and ex.compare.ids == ex.view.ids
    ex.compare_run.value = ""
    assert ex.compare is None and ex.comparison.value == "" and len(ex.grid_figure.axes) == 1

    # generate: continuation routed, generated tokens marked
    ex.n_new.value = 6
    ex.generate.click()
    assert ex.mode == "generate" and ex.view.n_prompt is not None
    assert len(ex.view.ids) == ex.view.n_prompt + 6
    assert "studylib-continuation" in ex.tokens.value
    ex.step.value = 12  # regenerates with that checkpoint
    assert ex.view.step == 12 and ex.view.n_prompt is not None
    ex.route_button.click()
    assert ex.mode == "text" and ex.view.n_prompt is None

    # a dense run: nothing to route, said in the status; its steps fill the slider
    ex.run.value = str(runs_["dense"])
    assert list(ex.step.options) == STEPS and ex.view.kind == "dense"
    assert "nothing to route" in ex.status.value and ex.error is None
    assert "nothing to route" in ex.shares.value
    ex.generate.click()
    assert ex.view.continuation and ex.error is None
    # the soft run
    ex.run.value = str(runs_["soft"])
    assert ex.view.kind == "soft" and "mean gate weight" in ex.shares.value
    # the text repr (what papermill shows) is a short summary
    assert "Routing explorer" in ex._repr_mimebundle_()[0]["text/plain"]


def test_explorer_handles_errors_and_empty_root(study, tmp_path):
    ex = explore.build_explorer(tmp_path)
    assert ex.run.options == () and "no runs" in ex.status.value
    ex = explore.build_explorer(study["outputs"])
    ex.prompt.value = ""  # an empty prompt still routes the end-of-story token
    assert ex.error is None and len(ex.view.ids) == 1
    ex.load = lambda *a: (_ for _ in ()).throw(RuntimeError("boom"))
    ex.prompt.value = "x"
    assert ex.error == "RuntimeError: boom" and "boom" in ex.status.value


# --------------------------------------------------------------------------------------------
# the notebook
# --------------------------------------------------------------------------------------------
NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "08_routing_explorer.py"


def test_notebook_shape():
    import ast

    import jupytext

    nb = jupytext.read(NOTEBOOK)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1
    assert {"params", "run", "prompt"} <= {t.id for n in ast.walk(ast.parse(params[0].source))
                                            for t in getattr(n, "targets", []) if isinstance(t, ast.Name)}
    assert any(c.cell_type == "markdown" for c in nb.cells)
    for c in nb.cells:
        if c.cell_type == "code":
            src = "\n".join(ln for ln in c.source.splitlines() if not ln.lstrip().startswith(("%", "!")))
            defs = [n for n in ast.walk(ast.parse(src)) if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.Lambda))]
            assert not defs, f"the notebook defines functions/classes: {c.source[:80]}"


@pytest.mark.slow
def test_notebook_executes_headless(study, tmp_path):
    """papermill runs it end to end on the tiny run (widgets render as text there)."""
    papermill = pytest.importorskip("papermill")
    out = tmp_path / "explorer.ipynb"
    papermill.execute_notebook(_to_ipynb(tmp_path), str(out),
                               parameters={"params": str(study["params"]), "run": str(study["runs"]["moe"]),
                                           "prompt": "The dog ran to the park"},
                               kernel_name="python3", progress_bar=False, cwd=str(tmp_path))
    import nbformat

    nb = nbformat.read(out, as_version=4)
    text = "\n".join(str(o) for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "Routing explorer" in text and "image/png" in text and "error" not in [o.get("output_type") for c in nb.cells
                                                                                  for o in c.get("outputs", [])]


def _to_ipynb(tmp_path) -> str:
    import jupytext

    path = tmp_path / "08_routing_explorer.ipynb"
    jupytext.write(jupytext.read(NOTEBOOK), path)
    return str(path)
