"""``python -m studylib export``: one run -> a folder that transformers loads with no project code
(``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained``): config.json, model.safetensors,
the tokenizer (tokenizer.json built from the run's SentencePiece model, same ids; tokenizer.model
kept), generation_config.json and a model card (README.md). The weight and config mapping is
:mod:`studylib.run.hf.format`; configs transformers cannot represent are refused before anything
is written.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import sys
import warnings
from pathlib import Path
from typing import Optional

from studylib.config import ConfigError, count_params
from studylib.run.hf import format as hf_format
from studylib.run.rundir import RunDir
from studylib.storage.files import atomic_folder, write_atomic, write_json_atomic

# strings whose ids the export checks against SentencePiece before writing the tokenizer
PROBES = ("Once upon a time, Lily said: \"Let's go!\"\nThey ran.", "  two  spaces ", "123 + 4.5 = 127.5",
          "café naïve 日本 — ü ß €", "a\n\nb\tc", "ﬁ ① Ⅷ", "")


def build_tokenizer(sp_model: os.PathLike):
    """A ``PreTrainedTokenizerFast`` whose ids equal SentencePiece's (normalizer spec honoured;
    needs protobuf and transformers >= 5, which converts the SentencePiece model exactly)."""
    import importlib

    import sentencepiece as spm
    from transformers import PreTrainedTokenizerFast

    conv = importlib.import_module("transformers.convert_slow_tokenizer")  # the module, not the function

    if not hasattr(conv.SpmConverter, "build_tokenizer_from_spm_proto"):
        raise ConfigError("export: the exact SentencePiece -> tokenizers conversion needs transformers>=5 "
                          "(pip install 'studylib[hf]')")
    proto = conv.import_protobuf().ModelProto()
    proto.ParseFromString(Path(sp_model).read_bytes())
    vocab = {p.piece: i for i, p in enumerate(proto.pieces)}
    backend = conv.SpmConverter.build_tokenizer_from_spm_proto(proto, vocab, legacy=True)
    sp = spm.SentencePieceProcessor(model_file=str(sp_model))
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token=sp.id_to_piece(sp.unk_id()),
                                  bos_token=sp.id_to_piece(sp.bos_id()), eos_token=sp.id_to_piece(sp.eos_id()),
                                  model_max_length=10**9, clean_up_tokenization_spaces=False)
    for s in PROBES:
        got, want = tok(s, add_special_tokens=False)["input_ids"], sp.encode(s)
        if got != want:
            raise ConfigError(f"{sp_model}: the converted tokenizer encodes {s!r} as {got[:8]}..., "
                              f"SentencePiece as {want[:8]}...")
    return tok


def _safetensors(model, path: Path) -> None:
    """The weights as ``model.safetensors``, written atomically like every other file
    (:func:`studylib.storage.files.write_atomic`: fsync, rename, the umask's permissions)."""
    from safetensors.torch import save

    sd = {k: v.detach().float().contiguous().clone() for k, v in hf_format.state_dict(model).items()}
    write_atomic(path, save(sd, metadata={"format": "pt"}))


def _fmt(x, nd=4) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def model_card(rd: RunDir, cfg, step: Optional[int], eos_id: int) -> str:
    """README.md of an export: what the model is, how it was trained, its numbers and caveats."""
    doc, s = rd.read_config() or {}, rd.summary() or {}
    pc = count_params(cfg)
    preset = (doc.get("preset") or {})
    data, train = preset.get("data") or {}, preset.get("train") or {}
    arch = hf_format.architecture(cfg)
    f = cfg.ffn
    if hf_format.family(cfg) in ("glm4_moe", "qwen2_moe"):
        router = (f"{f.score} scores" + (", renormalised" if f.renormalize else ", weighted by the router score")
                  + (", a selection bias (e_score_correction_bias)" if f.bias_balance else "")
                  + (f", {f.n_shared} shared expert(s)" if f.n_shared else "")
                  + (f", routed scaling {f.route_scale:g}" if f.route_scale != 1.0 else ""))
    else:
        router = "Mixtral's renormalised gate"
    moe = (f"a top-{f.top_k}-of-{f.num_experts} mixture of experts in every layer ({router}), expert hidden "
           f"size {f.hidden}" if f.kind == "moe" else f"a dense SwiGLU FFN of hidden size {f.hidden}")
    lines = [
        f"# {cfg.name} (seed {s.get('seed', doc.get('seed', '?'))}): a tiny TinyStories model",
        "", f"A {pc.total:,}-parameter ({pc.active:,} active per token) LLaMA-style decoder trained from "
        f"scratch on TinyStories by the studylib dense-vs-MoE study, exported as transformers' `{arch}`.",
        f"{cfg.n_layers} layers, width {cfg.d_model}, {cfg.n_heads} query / {cfg.n_kv_heads} key-value heads "
        f"(head dim {cfg.head_dim}), rotate-half RoPE (theta {cfg.rope_theta:g}), RMSNorm, tied embeddings, "
        f"context {cfg.context} tokens, vocabulary {cfg.vocab_size} (SentencePiece BPE), {moe}.",
        "", "## Numbers", "",
        f"- preset `{s.get('preset', preset.get('name', '?'))}`, model `{cfg.name}`, exported step {step}",
        f"- parameters: total {pc.total:,}, active {pc.active:,}, embedding {pc.embedding:,}, "
        f"FFN total {pc.ffn_total:,}, router {pc.router:,}",
        f"- validation loss (nats/token): best {_fmt(s.get('best_val_loss'))} at step {s.get('best_step')}, "
        f"final {_fmt(s.get('final_val_loss'))}",
        f"- data: TinyStories ({data.get('source', '?')}, {data.get('max_stories') or 'all'} stories), "
        f"windows of {data.get('context', cfg.context)} tokens, validation split {data.get('val_fraction')} "
        f"of the windows (split seed {data.get('split_seed')})",
        f"- training: AdamW lr {train.get('lr')} -> {train.get('min_lr')} (warmup + cosine), batch "
        f"{train.get('batch_size')} x accumulation {train.get('grad_accum')}, {s.get('steps', train.get('max_steps'))} "
        f"steps, {s.get('tokens', '?')} tokens, dropout {cfg.dropout}, amp {s.get('amp', '?')}",
    ]
    if hf_format.family(cfg) == "glm4_moe":
        lines.append(f"- router training: balance {f.balance_coef}, z-loss {f.z_coef}, sequence-wise balance "
                     f"{f.seq_balance_coef}" + (f", the selection bias moved by {f.bias_rate:g} x sign per step "
                     "(auxiliary-loss-free; transformers does not update it)" if f.bias_balance else "")
                     + ". Glm4Moe's config carries none of these: continued training in transformers would "
                     "need its own balancing.")
    elif f.kind == "moe":
        lines.append(f"- router losses: balance {f.balance_coef} (Switch form, averaged over layers), z-loss "
                     f"{f.z_coef}. `router_aux_loss_coef` = {hf_format.hf_aux_coef(cfg):g} = balance_coef / top_k "
                     f"because HF's per-layer balance loss is top_k times ours, so continued training in "
                     f"transformers starts from the same balance objective (HF pools the layers instead of "
                     f"averaging them, and has no router z-loss).")
    lines += [
        "", "## Use", "",
        "```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "tok = AutoTokenizer.from_pretrained(PATH); model = AutoModelForCausalLM.from_pretrained(PATH)\n"
        f"ids = [{eos_id}] + tok(\"Once upon a time\", add_special_tokens=False)[\"input_ids\"]\n```",
        "", f"Training windows were `story </s> story </s> ...`: start a story after `</s>` (id {eos_id}). "
        "The tokenizer's ids equal the SentencePiece model's (tokenizer.model is included).",
        "", "## Caveats", "",
        "- A tiny research model: it writes short, simple children's stories and nothing else; expect "
        "repetition and incoherence. Not for any real use; no safety tuning.",
        f"- Context is {cfg.context} tokens; positions beyond it were never trained.",
        "- Training used dropout on the attention output and FFN path; HF's architecture has neither "
        "(attention_dropout is 0 here). Inference is identical (logits match studylib within 1e-5 in fp32).",
        "- Numbers are from one seed of a small study; compare models over seeds.",
    ]
    return "\n".join(lines) + "\n"


MARKER = "studylib_export.json"


def _check_target(out: Path, rd: RunDir, force: bool) -> None:
    """``out`` may be new, empty, a previous export of this same run, or anything with ``force``;
    otherwise one ConfigError naming it (an export never overwrites a user's files silently)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a folder; give a folder to write the export into")
    if force or not out.is_dir() or not any(out.iterdir()):
        return
    try:
        previous = json.loads((out / MARKER).read_text()).get("run")
    except (OSError, ValueError, AttributeError):
        previous = None
    if previous != str(rd.path):
        what = f"an export of another run ({previous})" if previous else "files that are not an export of this run"
        raise ConfigError(f"--out {out}: holds {what}; give an empty or new folder, or --force to replace it")


def export(run: os.PathLike, out: os.PathLike, step: Optional[int] = None,
           tokenizer: Optional[os.PathLike] = None, force: bool = False) -> Path:
    """Write the transformers folder of ``run`` (its checkpoint at ``step``; None: the latest) to
    ``out``: a new or empty folder, a previous export of this run, or anything with ``force``
    (:func:`_check_target`). Everything is written into a temporary folder beside ``out`` that then
    replaces it, so a kill or a full disk leaves the old export or the new one, never a mix."""
    rd, out = RunDir(run), Path(out)
    _check_target(out, rd, force)
    cfg = rd.model_config()
    hf_format.check(cfg)  # before anything is loaded or written
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*could not find the run's tokenizer")  # the error below says it
        loaded = rd.load_model(step=step, tokenizer=tokenizer)  # weights and tokenizer verified as the run's
    sp_path = loaded.tokenizer_path
    if sp_path is None:
        raise ConfigError(f"{rd.path}: the run's SentencePiece tokenizer was not found; pass --tokenizer PATH")
    tok = build_tokenizer(sp_path)
    ids = dict(bos_id=tok.bos_token_id, eos_id=tok.eos_token_id, pad_id=tok.eos_token_id)
    with atomic_folder(out) as tmp:  # whole or not at all; a previous export there is replaced
        _write(tmp, rd, cfg, loaded, tok, sp_path, ids)
    return out


def _write(out: Path, rd: RunDir, cfg, loaded, tok, sp_path: Path, ids: dict) -> None:
    _safetensors(loaded.model, out / "model.safetensors")
    write_json_atomic(out / "config.json", hf_format.config_dict(cfg, **ids), indent=2)
    write_json_atomic(out / "generation_config.json",
                      {"bos_token_id": ids["bos_id"], "eos_token_id": ids["eos_id"],
                       "pad_token_id": ids["pad_id"], "max_length": cfg.context}, indent=2)
    tok.save_pretrained(str(out))
    shutil.copyfile(sp_path, out / "tokenizer.model")
    write_atomic(out / "README.md", model_card(rd, cfg, loaded.step, ids["eos_id"]))
    write_json_atomic(out / MARKER, {"run": str(rd.path), "step": loaded.step,
                                     "checkpoint": str(loaded.checkpoint)}, indent=2)


def add_cli(parser) -> None:
    parser.add_argument("--run", required=True, help="run directory (config.yaml, checkpoints/)")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    parser.add_argument("--out", required=True, help="folder to write (AutoModelForCausalLM.from_pretrained)")
    parser.add_argument("--tokenizer", default=None, help="SentencePiece model (default: the run's)")
    parser.add_argument("--force", action="store_true",
                        help="replace --out even when it holds other files (default: only a new or empty "
                             "folder, or a previous export of this run)")


def run_cli(args) -> int:
    try:
        out = export(args.run, args.out, args.step, args.tokenizer, force=args.force)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"out": str(out)}))
    return 0
