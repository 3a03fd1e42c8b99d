"""``bench train --profile``: a step's CPU time by kind of work (studylib.tools.bench.opgroups).

Oracles: the groups partition the profiler's self times exactly (nothing counted twice or
lost); every event of a known kind lands in its group, backward ops included (SDPA's backward
is attention, RMSNorm's is norms, the fused loss's work is the LM head, AdamW is the optimizer);
a dense model has no MoE time and an MoE model has some; the scopes are gone afterwards.
"""
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from studylib.config import FFNConfig, ModelConfig
from studylib.tools.bench.opgroups import GROUPS, DataProbe, classify, group_events, scoped_model
from studylib.tools.bench.step import build_variant, train_step
from studylib.tools.bench.train import profile_groups
from studylib.tools.bench.variant import Variant

pytestmark = pytest.mark.usefixtures("one_thread")

CFG = {
    "dense": ModelConfig(name="dense", vocab_size=128, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1,
                         context=32, dropout=0.0, ffn=FFNConfig(kind="dense", hidden=64)),
    "moe": ModelConfig(name="moe", vocab_size=128, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1,
                       context=32, dropout=0.0, ffn=FFNConfig(kind="moe", hidden=32, num_experts=4, top_k=2,
                                                              balance_coef=0.01, z_coef=0.001)),
}


def _profiled_step(name: str):
    cfg = CFG[name]
    v = Variant(name, "studylib", "grouped" if cfg.ffn.kind == "moe" else None, cfg)
    build_variant(v, torch.device("cpu"), 0)
    probe = DataProbe(cfg.vocab_size, 4, cfg.context, tokens=20_000)
    train_step(v, *probe(), torch.device("cpu"), None, 1.0)  # the optimizer's state exists
    with scoped_model(v.net), profile(activities=[ProfilerActivity.CPU]) as prof:
        train_step(v, *probe(), torch.device("cpu"), None, 1.0)
    return v, prof.events()


@pytest.mark.parametrize("name", ["dense", "moe"])
def test_groups_partition_the_self_times(name):
    _, events = _profiled_step(name)
    groups = group_events(events)
    assert set(groups) == set(GROUPS)
    assert sum(groups.values()) == pytest.approx(sum(e.self_cpu_time_total for e in events), rel=1e-9)
    for g in ("matmul", "attention", "rotary", "norms", "LM head + loss", "optimizer", "data"):
        assert groups[g] > 0, g
    assert (groups["MoE router + dispatch"] > 0) == (name == "moe")
    assert (groups["FFN activation"] > 0) == (name == "dense")


def test_known_ops_land_in_their_group():
    _, events = _profiled_step("dense")
    seen = set()
    for e, g in classify(events):
        n = e.name
        if "scaled_dot_product" in n or "ScaledDotProduct" in n:
            assert g == "attention", n
            seen.add("attention" + (" backward" if "ackward" in n else ""))
        elif n in ("aten::rms_norm", "aten::_fused_rms_norm") or "RmsNorm" in n or "RsqrtBackward" in n:
            assert g == "norms", n
            seen.add("norms" + (" backward" if "ackward" in n else ""))
        elif n == "_LinearCrossEntropy" or "LinearCrossEntropyBackward" in n:
            assert g == "LM head + loss", n
            seen.add("lm head")
        elif n.startswith("Optimizer.step"):
            assert g == "optimizer", n
            seen.add("optimizer")
        elif n in ("aten::silu", "aten::silu_backward"):
            assert g == "FFN activation", n
            seen.add(n)
    assert {"attention", "attention backward", "norms", "norms backward", "lm head", "optimizer",
            "aten::silu", "aten::silu_backward"} <= seen


def test_scopes_are_removed_and_the_model_is_unchanged():
    from studylib.nn import model as model_mod

    rope, loss = model_mod.apply_rope, model_mod.linear_cross_entropy
    v, _ = _profiled_step("dense")
    assert model_mod.apply_rope is rope and model_mod.linear_cross_entropy is loss
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in v.net.modules())


def test_profile_groups_rows():
    out = profile_groups(CFG, ["dense", "moe"], ("grouped",), batch=4, context=32, warmup=1, steps=2, timed=2,
                         peak_size=256)
    assert set(out) == {"dense", "moe[grouped]"}
    for r in out.values():
        assert sum(r["groups"].values()) == pytest.approx(r["step_ms"])
        assert r["tok_s"] == pytest.approx(4 * 32 / (r["step_ms"] / 1e3))
        assert r["frac_peak"] == pytest.approx(r["gflops"] / r["peak_gflops"])


def test_bench_paths_pairs_plain_against_the_preset():
    import dataclasses

    from studylib.tools.bench.paths import bench_paths, plain

    fast = dataclasses.replace(CFG["moe"], lm_head_chunk=48)
    assert plain(fast) == CFG["moe"]  # the plain path is the schema default
    df = bench_paths({"moe": fast, "dense": CFG["dense"]}, ["moe", "dense"], batch=4, context=32, rounds=2,
                     warmup=1, progress=False)
    assert list(df.model) == ["moe", "dense"]
    assert list(df.differs) == ["lm_head_chunk 2048 -> 48", "nothing"]
    assert (df.tok_s_plain > 0).all() and (df.tok_s_preset > 0).all() and (df.ratio > 0).all()


def test_bench_fold_times_each_model_at_k_times_the_batch_against_once():
    from studylib.tools.bench.paths import bench_fold

    df = bench_fold(CFG, [3, 2, 3], ["dense", "moe"], batch=2, context=16, rounds=2, warmup=1, progress=False)
    assert list(zip(df.model, df.fold)) == [("dense", 1), ("dense", 2), ("dense", 3), ("moe", 1), ("moe", 2),
                                            ("moe", 3)]
    assert (df[df.fold == 1].gain == 1.0).all()  # 1x against itself, round by round
    assert (df.tok_s > 0).all() and (df.gain > 0).all()
