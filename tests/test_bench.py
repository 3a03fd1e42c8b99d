"""Benchmarks: smoke runs on tiny models (no timing assertions), frame columns, ratio consistency."""
import json
import math

import pytest
import torch

from studylib.tools import bench
from studylib.config import FFNConfig, ModelConfig

TINY = {
    "dense": ModelConfig(name="dense", vocab_size=128, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1,
                         context=64, ffn=FFNConfig(kind="dense", hidden=64)),
    "moe": ModelConfig(name="moe", vocab_size=128, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1,
                       context=64, ffn=FFNConfig(kind="moe", hidden=32, num_experts=4, top_k=2,
                                                 balance_coef=0.01, z_coef=0.001)),
    "soft": ModelConfig(name="soft", vocab_size=128, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1,
                        context=64, ffn=FFNConfig(kind="soft", hidden=32, num_experts=2)),
}

TRAIN_COLS = {"model", "impl", "dispatch", "dtype", "batch", "context", "params", "flops_per_token", "step_s",
              "tok_s", "tok_s_min", "tok_s_max", "tok_s_q1", "tok_s_q3", "gflops", "mfu", "cpu_s", "sys_frac",
              "minflt", "peak_mem_mb",
              "mem_delta_mb", "ratio_ref", "ratio_naive", "ratio_hf", "allocator"}


pytestmark = pytest.mark.usefixtures("one_thread")


def _has_transformers():
    try:
        import transformers  # noqa: F401
        return True
    except ImportError:
        return False


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_bench_train_frame(dtype):
    df = bench.bench_train(TINY, ["dense", "moe", "soft"], dtype=dtype, batch=2, context=16, rounds=2,
                           warmup=1, memory="none", progress=False, peak_size=256)
    assert TRAIN_COLS <= set(df.columns)
    assert list(df["model"]) == ["dense", "moe", "moe", "moe", "soft"]
    assert list(df["dispatch"]) == ["", "naive", "grouped", "stacked", ""]
    assert df.loc[0, "ratio_ref"] == 1.0
    moe = df[df.model == "moe"].set_index("dispatch")
    assert moe.loc["naive", "ratio_naive"] == 1.0
    assert moe["ratio_naive"].notna().all() and df[df.model != "moe"]["ratio_naive"].isna().all()
    assert (df["tok_s"] > 0).all() and (df["tok_s_min"] <= df["tok_s"]).all()
    assert (df["tok_s"] <= df["tok_s_max"]).all()
    assert df["ratio_hf"].isna().all()
    assert df.loc[0, "params"] == sum(p.numel() for p in bench.build_ours(TINY["dense"]).parameters())
    assert len(df.attrs["peak_gflops_all"]) == 3 and df.attrs["peak_gflops"] > 0
    assert all(len(t) == 2 for t in df.attrs["times"].values())
    assert math.isclose(df.loc[0, "mfu"], df.loc[0, "gflops"] / df.attrs["peak_gflops"])


def test_bench_train_dropout_override():
    df = bench.bench_train(TINY, ["dense"], dtype="fp32", batch=2, context=16, rounds=1, warmup=0,
                           memory="none", progress=False, peak_size=64, dropout=0.25)
    assert list(df["dropout"]) == [0.25]
    with pytest.raises(bench.ConfigError, match="--dropout"):
        bench.bench_train(TINY, ["dense"], dropout=1.5, memory="none", progress=False)


def test_bench_train_compile_both_pairs_each_variant():
    df = bench.bench_train(TINY, ["dense"], dtype="fp32", batch=2, context=16, rounds=1, warmup=0,
                           memory="none", progress=False, peak_size=64, compile="both")
    assert list(df["compiled"]) == [False, True]
    assert math.isnan(df.loc[0, "ratio_compile"]) and df.loc[1, "ratio_compile"] > 0
    assert df.attrs["warmup"] == 2  # compiling is never timed
    with pytest.raises(bench.ConfigError, match="--compile"):
        bench.bench_train(TINY, ["dense"], compile="yes", memory="none", progress=False)


def test_flops_formula():
    cfg = TINY["dense"]
    n_mm = (cfg.vocab_size * 32 + 2 * (32 * 64 + 32 * 32) + 2 * 3 * 32 * 64)  # head + attn + ffn
    assert bench.train_flops_per_token(cfg, 16) == 6 * n_mm + 6 * 2 * 16 * 32
    moe = TINY["moe"]  # two of four experts plus the router count as active
    assert bench.train_flops_per_token(moe, 16) - bench.train_flops_per_token(
        TINY["dense"], 16) == 6 * 2 * (2 * 3 * 32 * 32 + 32 * 4 - 3 * 32 * 64)


def test_bench_train_memory_probe():
    df = bench.bench_train(TINY, ["dense"], dtype="fp32", batch=2, context=16, rounds=1, warmup=0,
                           memory="subprocess", progress=False, peak_size=256)
    assert df.loc[0, "peak_mem_mb"] > 0 and df.loc[0, "mem_delta_mb"] >= 0


def test_bench_decode_frame():
    df = bench.bench_decode(TINY, ["dense", "moe"], prompt_len=8, new_tokens=6, trials=2, warmup=1,
                            no_cache_too=True, progress=False)
    assert {"model", "impl", "cache", "tok_s", "tok_s_min", "tok_s_max", "ms_per_token", "ratio_ref",
            "ratio_hf", "ratio_cache", "same_tokens_as_ours"} <= set(df.columns)
    assert len(df) == 4
    ref = df[(df.model == "dense") & df.cache].iloc[0]
    assert ref["ratio_ref"] == 1.0
    assert (df[~df.cache]["ratio_cache"].isna()).all() and df[df.cache]["ratio_cache"].notna().all()
    assert df[(df.model == "dense") & ~df.cache].iloc[0]["ratio_ref"] == 1.0


def test_bench_decode_bf16_weights():
    df = bench.bench_decode(TINY, ["dense", "moe"], dtype="bf16-weights", prompt_len=8, new_tokens=6,
                            trials=1, warmup=0, no_cache_too=True, progress=False)
    assert set(df["dtype"]) == {"bf16-weights"} and (df["tok_s"] > 0).all()


def test_generate_with_bf16_weights_follows_fp32_logits():
    from studylib.run.decode import generate

    m = bench.build_ours(bench.resolve_models(TINY, ["moe"])[0][1]).eval()
    prompt = list(range(1, 9))
    with torch.inference_mode():
        ids = torch.tensor([prompt])
        ref = m(ids).logits[0, -1]
        got = m.to(torch.bfloat16)(ids, last_only=True).logits[0, -1].float()
    torch.testing.assert_close(got, ref, rtol=0.05, atol=0.05)
    # bf16 weights: the one-token cached path (studylib.nn.gemv, the MoE decode path) and the
    # full recompute pick the same greedy tokens
    cached = generate(m, prompt, 10, temperature=0, use_cache=True)
    assert len(cached) == 10 and cached == generate(m, prompt, 10, temperature=0, use_cache=False)


@pytest.mark.skipif(not _has_transformers(), reason="transformers not installed")
def test_hf_peer_matches_ours():
    for name in ("dense", "moe"):
        cfg = TINY[name]
        ours = bench.build_ours(cfg).eval()
        hf = bench.build_hf(cfg, ours).eval()
        assert bench._n_params(hf) == sum(p.numel() for p in ours.parameters())
        x = torch.randint(0, cfg.vocab_size, (2, 12))
        with torch.no_grad():
            assert torch.allclose(ours(x).logits, hf(input_ids=x).logits, atol=1e-5)
    with pytest.raises(Exception, match="soft"):
        bench.build_hf(TINY["soft"])


@pytest.mark.skipif(not _has_transformers(), reason="transformers not installed")
def test_peer_rows():
    df = bench.bench_train(TINY, ["dense", "moe"], dispatches=["grouped"], batch=2, context=16, rounds=1,
                           warmup=0, peer="hf", memory="none", progress=False, peak_size=256)
    assert list(zip(df.model, df.impl)) == [("dense", "studylib"), ("dense", "hf"), ("moe", "studylib"),
                                            ("moe", "hf")]
    assert df[df.impl == "studylib"]["ratio_hf"].notna().all()
    assert df[df.impl == "hf"].iloc[0]["ratio_ref"] == 1.0
    d = bench.bench_decode(TINY, ["dense", "moe"], prompt_len=4, new_tokens=5, trials=1, warmup=0,
                           peer="hf", progress=False)
    assert d["same_tokens_as_ours"].all()  # identical weights -> identical greedy tokens


def test_cli_json(capsys):
    from studylib.cli import main

    rc = main(["bench", "train", "--params", "params/paper.yaml", "--models", "dense_active", "--batch", "1",
               "--context", "8", "--rounds", "1", "--warmup", "0", "--memory", "none", "--dtype", "fp32",
               "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["rows"][0]["model"] == "dense_active" and doc["rows"][0]["ratio_ref"] == 1.0
    assert doc["rows"][0]["params"] == 14_889_280  # SPEC Table 5: 14.89M


def test_allocator_info():
    assert bench.allocator_info().split()[0] in ("glibc", "tcmalloc", "jemalloc", "mimalloc", "unknown")
