"""Benchmarks: the interleaved harness, frame values recomputed from the recorded per-round timings,
FLOPs against a counted forward pass, the optimizer, smoke runs on tiny models (no timing
assertions)."""
import json
import math

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from studylib.config import ConfigError, FFNConfig, ModelConfig, TrainConfig, count_params
from studylib.tools import bench
from studylib.tools.bench import decode as bench_decode_module
from studylib.tools.bench.step import build_variant
from studylib.tools.bench.timing import interleaved_rounds
from studylib.tools.bench.variant import Variant, built_params

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


def _label(row) -> str:
    """A train row's key in ``df.attrs["times"]``, built from the row's own columns."""
    return row.model + (f"[{row.dispatch}]" if row.dispatch else "") + ("" if row.impl == "studylib"
                                                                        else f" ({row.impl})")


def _paired(ref_times, times) -> float:
    """median over rounds of t_ref / t (numpy, independently of the bench's statistics)."""
    return float(np.median(np.asarray(ref_times) / np.asarray(times)))


def test_interleaved_rounds_rotates_and_skips_warmup():
    log = []
    vs = [Variant(n, "studylib", None, TINY["dense"]) for n in "abc"]
    for v in vs:
        v.call = lambda n=v.model: log.append(n) or n
    phases = list(interleaved_rounds(vs, warmup=1, rounds=2, device=torch.device("cpu")))
    assert phases == [(1, False), (1, True), (2, True)]
    assert "".join(log) == "abc" + "bca" + "cab"  # round r starts at variant r
    assert all(len(v.times) == len(v.cpu) == len(v.faults) == 2 for v in vs)
    assert all(t > 0 for v in vs for t in v.times) and [v.output for v in vs] == ["a", "b", "c"]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_bench_train_frame(dtype):
    df = bench.bench_train(TINY, ["dense", "moe", "soft"], dtype=dtype, batch=2, context=16, rounds=3,
                           warmup=1, memory="none", progress=False, peak_size=256)
    assert TRAIN_COLS <= set(df.columns)
    assert list(df["model"]) == ["dense", "moe", "moe", "moe", "soft"]
    assert list(df["dispatch"]) == ["", "naive", "grouped", "stacked", ""]
    times = df.attrs["times"]
    assert sorted(times) == sorted(_label(r) for r in df.itertuples())
    assert all(len(t) == 3 for t in times.values())
    for r in df.itertuples():  # every speed and ratio column from the recorded per-round timings
        t = np.asarray(times[_label(r)])
        assert r.step_s == pytest.approx(np.median(t))
        assert (r.tok_s, r.tok_s_min, r.tok_s_max) == pytest.approx((np.median(32 / t), 32 / t.max(),
                                                                     32 / t.min()))
        assert r.ratio_ref == pytest.approx(_paired(times["dense"], t))
        if r.model == "moe":
            assert r.ratio_naive == pytest.approx(_paired(times["moe[naive]"], t))
        else:
            assert math.isnan(r.ratio_naive)
    assert df["ratio_hf"].isna().all()
    assert list(df["params"]) == [count_params(TINY[r.model]).total for r in df.itertuples()]
    assert len(df.attrs["peak_gflops_all"]) == 4 and df.attrs["peak_gflops"] > 0


@pytest.mark.parametrize("name", ["dense", "moe"])
def test_flops_match_a_counted_forward(name):
    """3 x (the matmul FLOPs torch counts in one forward + causal attention's QK^T and AV)."""
    cfg, (B, S) = TINY[name], (2, 16)
    m = bench.build_ours(cfg, "naive").eval()  # naive: each token through exactly its top-k experts
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        m(torch.randint(0, cfg.vocab_size, (B, S)))
    matmul = counter.get_total_flops()  # CPU SDPA is not counted: only the linear layers
    attn = cfg.n_layers * B * 2 * (2 * S * S / 2 * cfg.n_heads * cfg.head_dim)  # QK^T, AV; causal half
    assert bench.train_flops_per_token(cfg, S) * B * S == 3 * (matmul + attn)


def test_flops_by_hand():
    cfg = TINY["dense"]
    n_mm = (cfg.vocab_size * 32 + 2 * (32 * 64 + 32 * 32) + 2 * 3 * 32 * 64)  # head + attn + ffn
    assert bench.train_flops_per_token(cfg, 16) == 6 * n_mm + 6 * 2 * 16 * 32
    moe = TINY["moe"]  # two of four experts plus the router count as active
    assert bench.train_flops_per_token(moe, 16) - bench.train_flops_per_token(
        TINY["dense"], 16) == 6 * 2 * (2 * 3 * 32 * 32 + 32 * 4 - 3 * 32 * 64)


def test_train_variant_optimizer_is_the_trainers_default():
    v = Variant("moe", "studylib", "grouped", TINY["moe"])
    build_variant(v, torch.device("cpu"), seed=0)
    defaults = TrainConfig()
    assert isinstance(v.opt, torch.optim.AdamW)
    decay, no_decay = v.opt.param_groups
    assert (decay["lr"], decay["betas"], decay["weight_decay"]) == (3e-4, (0.9, 0.95), 0.1)
    assert (defaults.lr, tuple(defaults.betas), defaults.weight_decay) == (3e-4, (0.9, 0.95), 0.1)
    assert no_decay["weight_decay"] == 0.0
    assert {id(p) for p in decay["params"]} == {id(p) for p in v.net.parameters() if p.ndim >= 2}
    assert {id(p) for p in no_decay["params"]} == {id(p) for p in v.net.parameters() if p.ndim < 2}


def test_bench_train_dropout_override():
    df = bench.bench_train(TINY, ["dense"], dtype="fp32", batch=2, context=16, rounds=1, warmup=0,
                           memory="none", progress=False, peak_size=64, dropout=0.25)
    assert list(df["dropout"]) == [0.25]
    with pytest.raises(ConfigError, match="--dropout"):
        bench.bench_train(TINY, ["dense"], dropout=1.5, memory="none", progress=False)


def test_bench_train_compile_both_pairs_each_variant():
    df = bench.bench_train(TINY, ["dense"], dtype="fp32", batch=2, context=16, rounds=1, warmup=0,
                           memory="none", progress=False, peak_size=64, compile="both")
    assert list(df["compiled"]) == [False, True]
    assert math.isnan(df.loc[0, "ratio_compile"]) and df.loc[1, "ratio_compile"] > 0
    assert df.attrs["warmup"] == 2  # compiling is never timed
    with pytest.raises(ConfigError, match="--compile"):
        bench.bench_train(TINY, ["dense"], compile="yes", memory="none", progress=False)


def test_bench_train_memory_probe():
    df = bench.bench_train(TINY, ["dense"], dtype="fp32", batch=2, context=16, rounds=1, warmup=0,
                           memory="subprocess", progress=False, peak_size=256)
    assert df.loc[0, "peak_mem_mb"] > 0 and df.loc[0, "mem_delta_mb"] >= 0


def _capture_decode_variants(monkeypatch) -> list:
    """Patch bench_decode's harness to keep the variants it times (with their per-trial times)."""
    seen = []

    def spy(variants, *a, **k):
        seen.extend(variants)
        return interleaved_rounds(variants, *a, **k)

    monkeypatch.setattr(bench_decode_module, "interleaved_rounds", spy)
    return seen


def test_bench_decode_frame(monkeypatch):
    variants = _capture_decode_variants(monkeypatch)
    df = bench.bench_decode(TINY, ["dense", "moe"], prompt_len=8, new_tokens=6, trials=3, warmup=1,
                            no_cache_too=True, progress=False)
    assert {"model", "impl", "cache", "tok_s", "tok_s_min", "tok_s_max", "ms_per_token", "ratio_ref",
            "ratio_hf", "ratio_cache", "same_tokens_as_ours"} <= set(df.columns)
    assert len(df) == 4 == len(variants)
    times = {(v.model, v.cache): v.times for v in variants}
    assert all(len(t) == 3 for t in times.values())
    for r in df.itertuples():
        t = times[(r.model, r.cache)]
        assert r.ms_per_token == pytest.approx(1e3 * np.median(t) / 6)
        assert r.ratio_ref == pytest.approx(_paired(times[("dense", r.cache)], t))
        if r.cache:
            assert r.ratio_cache == pytest.approx(_paired(times[(r.model, False)], t))
        else:
            assert math.isnan(r.ratio_cache)


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
        assert built_params(hf) == count_params(cfg).total
        x = torch.randint(0, cfg.vocab_size, (2, 12))
        with torch.no_grad():
            assert torch.allclose(ours(x).logits, hf(input_ids=x).logits, atol=1e-5)
    with pytest.raises(Exception, match="soft"):
        bench.build_hf(TINY["soft"])


@pytest.mark.skipif(not _has_transformers(), reason="transformers not installed")
def test_peer_rows():
    df = bench.bench_train(TINY, ["dense", "moe"], dispatches=["grouped"], batch=2, context=16, rounds=3,
                           warmup=0, peer="hf", memory="none", progress=False, peak_size=256)
    assert list(zip(df.model, df.impl)) == [("dense", "studylib"), ("dense", "hf"), ("moe", "studylib"),
                                            ("moe", "hf")]
    times = df.attrs["times"]
    for r in df.itertuples():
        t = times[_label(r)]
        ref = times["dense" if r.impl == "studylib" else "dense (hf)"]  # the first model of each impl
        assert r.ratio_ref == pytest.approx(_paired(ref, t))
        if r.impl == "studylib":
            assert r.ratio_hf == pytest.approx(_paired(times[f"{r.model} (hf)"], t))
        else:
            assert math.isnan(r.ratio_hf)
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
    (row,) = doc["rows"]
    (t,) = doc["times"]["dense_active"]
    assert row["model"] == "dense_active" and row["tok_s"] == pytest.approx(8 / t)
    assert row["params"] == 14_889_280  # SPEC Table 5: 14.89M


def test_allocator_info():
    assert bench.allocator_info().split()[0] in ("glibc", "tcmalloc", "jemalloc", "mimalloc", "unknown")


def test_peak_size_halves_while_one_product_is_over_budget():
    from studylib.tools.bench.flops import peak_size

    assert peak_size(None, n=256, budget_s=60.0) == 256  # fast enough: unchanged
    assert peak_size(None, n=512, budget_s=0.0, smallest=128) == 128  # always over: down to the floor
