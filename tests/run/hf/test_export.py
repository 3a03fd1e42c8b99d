"""The transformers export: from_pretrained logits == studylib's (fp32, 1e-5) for a dense, a MoE
and two sigmoid-router MoEs (Glm4Moe: with the selection bias, a shared expert and a route scale,
and without) on every dispatch path, the same greedy tokens, the same tokenizer ids as
SentencePiece, and two softmax MoEs Mixtral cannot hold (Qwen2Moe: a shared expert, and the router probability as the
weight), the refusals (soft MoE, mixed layers, softmax variants no class holds) raised before
anything is written."""
from __future__ import annotations

import argparse
import dataclasses
import json
import random

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import numpy as np  # noqa: E402
from _tiny import CONTEXT, SyntheticData, synthetic_data, tiny_preset  # noqa: E402

from studylib.config import ConfigError  # noqa: E402
from studylib.nn.model import Decoder  # noqa: E402
from studylib.run.hf import export as ex  # noqa: E402
from studylib.run.hf import format as hf_format  # noqa: E402
from studylib.run.decode import generate  # noqa: E402
from studylib.run.rundir import RunDir  # noqa: E402
from studylib.run.trainer import train_run  # noqa: E402

VOCAB = 400
WORDS = ("once upon a time there was little girl named Lily she liked to play with her red ball in the "
         "park one day Tom said let's go and they ran fast happy sad big dog cat tree sun 1 2 3 10 42 "
         "café naïve über").split()


def _corpus(n=1500, seed=0):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        s = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12)))
        out.append(s.capitalize() + rng.choice([".", "!", "?", ",\n\"Yes!\""]))
    return out


def _cycle_data(n_windows=400, vocab=VOCAB, seed=0):
    """Tokens that mostly follow one long permutation cycle: a trained model's greedy output
    walks the cycle (many different tokens) instead of repeating one."""
    rng = np.random.default_rng(seed)
    nxt = rng.permutation(vocab)
    n = n_windows * CONTEXT
    toks = np.empty(n, dtype=np.uint16)
    toks[0] = 0
    noise, rand = rng.random(n) < 0.05, rng.integers(0, vocab, size=n)
    for i in range(1, n):
        toks[i] = rand[i] if noise[i] else nxt[toks[i - 1]]
    perm = rng.permutation(n_windows)
    return SyntheticData(tokens=toks, context=CONTEXT, train_idx=np.sort(perm[24:]).astype(np.int64),
                         val_idx=np.sort(perm[:24]).astype(np.int64), vocab_size=vocab)


GLM = {  # sigmoid-scored routers: exported as Glm4MoeForCausalLM
    "glm": {"ffn": {"kind": "moe", "hidden": 32, "num_experts": 4, "top_k": 2, "score": "sigmoid",
                    "bias_balance": True, "bias_rate": 0.01, "n_shared": 1, "route_scale": 1.5}},
    "glm_plain": {"ffn": {"kind": "moe", "hidden": 32, "num_experts": 4, "top_k": 2, "score": "sigmoid",
                          "renormalize": False}},
}
QWEN = {  # softmax routers Mixtral cannot hold: exported as Qwen2MoeForCausalLM
    "qwen_shared": {"ffn": {"kind": "moe", "hidden": 32, "num_experts": 4, "top_k": 1, "n_shared": 1,
                            "renormalize": False, "balance_coef": 0.01}},
    "qwen_switch": {"ffn": {"kind": "moe", "hidden": 32, "num_experts": 4, "top_k": 1, "renormalize": False}},
}
ARCH = {"dense": "LlamaForCausalLM", "moe": "MixtralForCausalLM", "glm": "Glm4MoeForCausalLM",
        "glm_plain": "Glm4MoeForCausalLM", "qwen_shared": "Qwen2MoeForCausalLM", "qwen_switch": "Qwen2MoeForCausalLM"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A SentencePiece model and a trained dense and MoE run (synthetic Markov tokens)."""
    from studylib.data.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("export")
    sp = root / "tok.model"
    train_tokenizer(_corpus(), VOCAB, sp, threads=1)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    preset = tiny_preset(data={"vocab_size": VOCAB}, train={"max_steps": 150, "eval_every": 50,
                                                            "lr": 1e-2, "min_lr": 1e-3})
    preset = tiny_preset(data={"vocab_size": VOCAB}, train={"max_steps": 150, "eval_every": 50,
                                                            "lr": 1e-2, "min_lr": 1e-3}, models={**GLM, **QWEN})
    data = _cycle_data()
    out = {"sp": sp}
    for name in ("dense", "moe", *GLM, *QWEN):
        train_run(preset, name, 1, run_dir=root / name, progress=False, data=data)
        out[name] = ex.export(root / name, root / f"{name}-hf", tokenizer=sp)
    torch.set_num_threads(n)
    out["root"] = root
    return out


def _ours(run, dispatch=None):
    loaded = RunDir(run).load_model(tokenizer=run.parent / "tok.model")
    if dispatch is None:
        return loaded.model
    cfg = loaded.config
    cfg = dataclasses.replace(cfg, ffn=dataclasses.replace(cfg.ffn, dispatch=dispatch))
    m = Decoder(cfg)
    m.load_state_dict(loaded.model.state_dict())
    return m.eval()


def _hf(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.mark.parametrize("name,dispatch", [("dense", None)] + [(m, d) for m in ("moe", "glm", "glm_plain", *QWEN)
                                                               for d in ("naive", "grouped", "stacked")])
def test_logits_match(runs, one_thread, name, dispatch):
    hf = _hf(runs[f"{name}"])
    assert type(hf).__name__ == ARCH[name]
    ours = _ours(runs["root"] / name, dispatch)
    x = torch.randint(0, VOCAB, (3, 33), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = ours(x).logits, hf(input_ids=x).logits
    assert a.shape == b.shape
    assert (a - b).abs().max().item() < 1e-5


def test_the_trained_bias_is_exported(runs):
    hf, ours = _hf(runs["glm"]), _ours(runs["root"] / "glm")
    b_hf = hf.model.layers[0].mlp.gate.e_score_correction_bias
    b = ours.blocks[0].ffn.router.bias_E
    assert b.abs().sum() > 0 and torch.equal(b_hf, b)


@pytest.mark.parametrize("name", ["dense", "moe", "glm", "qwen_shared"])
def test_greedy_tokens_match(runs, one_thread, name):
    hf, ours = _hf(runs[name]), _ours(runs["root"] / name)
    prompt = [2, 17, 40, 5]
    mine = generate(ours, prompt, 24, temperature=0, use_cache=True)
    ids = torch.tensor([prompt])
    out = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                      eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    assert len(out) >= 20 and len(set(out)) > 3  # a model that does not just repeat one token
    assert out == mine[:len(out)]


def test_tokenizer_ids_match_sentencepiece(runs):
    import sentencepiece as spm
    from transformers import AutoTokenizer

    sp = spm.SentencePieceProcessor(model_file=str(runs["sp"]))
    tok = AutoTokenizer.from_pretrained(runs["dense"])
    for s in ["Hello, world! It's 10:42.", "Tom said:\n\"Let's go,\" and ran.\n\nThe end.", "  two  spaces  ",
              "123 4.5 -7 1,000", "café naïve über Ünïcödé 日本語 — €", "a\tb\r\nc", "", "ﬁ ① Ⅷ ½"]:
        assert tok(s, add_special_tokens=False)["input_ids"] == sp.encode(s), s
    assert tok.eos_token_id == sp.eos_id() and tok.bos_token_id == sp.bos_id()


def test_export_files_and_card(runs):
    out = runs["moe"]
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "README.md", "tokenizer.json",
            "tokenizer.model"} <= names
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["MixtralForCausalLM"] and cfg["rope_theta"] == 10000.0
    mcfg = RunDir(runs["root"] / "moe").model_config()
    assert cfg["router_aux_loss_coef"] == pytest.approx(mcfg.ffn.balance_coef / mcfg.ffn.top_k)
    card = (out / "README.md").read_text()
    for needle in ("MixtralForCausalLM", "validation loss", "router_aux_loss_coef", "Caveats", "active"):
        assert needle in card
    # every exported file readable as the others are (safetensors wrote model.safetensors 0600; #24)
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir() if p.is_file()}
    assert modes["model.safetensors"] == modes["config.json"] == modes["README.md"], modes


def test_cli(runs, tmp_path):
    p = argparse.ArgumentParser()
    ex.add_cli(p)
    args = p.parse_args(["--run", str(runs["root"] / "dense"), "--out", str(tmp_path / "o"),
                         "--tokenizer", str(runs["sp"])])
    assert ex.run_cli(args) == 0 and (tmp_path / "o" / "model.safetensors").is_file()


def test_export_never_overwrites_a_users_folder_and_swaps_in_whole(runs, tmp_path):
    """issue #24: `export` into a non-empty folder overwrote the user's README.md and config.json;
    `--out` naming a file was a traceback. Now: a new or empty folder, a previous export of the same
    run, or --force; the export is written beside the target and swapped in whole."""
    run = runs["root"] / "dense"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "README.md").write_text("my notes")
    with pytest.raises(ConfigError, match=r"--out .*mine: holds files that are not an export of this run; .*--force"):
        ex.export(run, mine, tokenizer=runs["sp"])
    assert [p.name for p in mine.iterdir()] == ["README.md"] and (mine / "README.md").read_text() == "my notes"
    again = ex.export(run, tmp_path / "hf", tokenizer=runs["sp"])
    first = (again / "model.safetensors").stat().st_ino
    assert ex.export(run, again, tokenizer=runs["sp"]) == again  # a previous export of this run: replaced
    assert (again / "model.safetensors").stat().st_ino != first
    with pytest.raises(ConfigError, match=r"holds an export of another run"):
        ex.export(runs["root"] / "moe", again, tokenizer=runs["sp"])
    ex.export(run, mine, tokenizer=runs["sp"], force=True)
    assert (mine / "config.json").is_file() and "my notes" not in (mine / "README.md").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "mine"]  # no temporary folder left
    (tmp_path / "afile").write_text("x")
    p = argparse.ArgumentParser()
    ex.add_cli(p)
    args = p.parse_args(["--run", str(run), "--out", str(tmp_path / "afile"), "--tokenizer", str(runs["sp"])])
    assert ex.run_cli(args) == 2 and (tmp_path / "afile").read_text() == "x"


@pytest.mark.parametrize("ffn,reason", [
    ({"kind": "soft", "hidden": 32, "num_experts": 4}, "soft"),
    ({"kind": "moe", "hidden": 32, "num_experts": 4, "top_k": 2, "layers": [1]}, "mixed FFN kinds"),
    ({"kind": "moe", "hidden": 32, "num_experts": 4, "top_k": 2, "bias_balance": True}, "bias_balance with softmax"),
    ({"kind": "moe", "hidden": 32, "num_experts": 4, "top_k": 2, "route_scale": 2.0}, "route_scale with softmax"),
    ({"kind": "moe", "hidden": 32, "num_experts": 4, "top_k": 2, "router": "hash"}, "routes by token id"),
])
def test_refusals_name_the_reason_and_write_nothing(runs, tmp_path, ffn, reason):
    preset = tiny_preset(data={"vocab_size": VOCAB}, train={"max_steps": 1, "eval_every": 1},
                         models={"x": {"ffn": ffn}})
    train_run(preset, "x", 1, run_dir=tmp_path / "run", progress=False, data=synthetic_data(vocab=VOCAB))
    with pytest.raises(ConfigError, match=reason):
        ex.export(tmp_path / "run", tmp_path / "out", tokenizer=runs["sp"])
    assert not (tmp_path / "out").exists()
    assert hf_format.refusal(RunDir(tmp_path / "run").model_config()) is not None


def test_rope_theta_reaches_hf():
    """A non-default rope_theta is carried (the old peer silently dropped it on transformers 4.x)."""
    cfg = tiny_preset(data={"vocab_size": VOCAB}, models={"r": {"rope_theta": 500.0}}).model_config("r")
    torch.manual_seed(0)
    ours = Decoder(cfg).eval()
    hf = hf_format.build_hf(cfg, ours).eval()
    x = torch.randint(0, VOCAB, (1, 20))
    with torch.no_grad():
        assert (ours(x).logits - hf(input_ids=x).logits).abs().max() < 1e-5
