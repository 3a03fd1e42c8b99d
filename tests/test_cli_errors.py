"""Every known error of the command line is ONE line ``error: ...`` naming the field or file,
exit code 2, no traceback, and nothing created on disk (issue #14). Most cases call
:func:`studylib.cli.main` in-process (fast); a few run ``python -m studylib`` for real."""
from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from _tiny import tiny_tokenizer

from studylib.cli import main

ROOT = Path(__file__).resolve().parents[1]
CI = str(ROOT / "params" / "ci.yaml")


def _files(*dirs) -> set:
    return {p for d in dirs for p in Path(d).rglob("*")}


def _call(argv, capsys, *watched) -> str:
    """Run ``main(argv)``; assert exit 2, one stderr line ``error: ...``, no new files; return it."""
    before = _files(*watched)
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse
        rc = e.code
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2, err
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert _files(*watched) == before, "an error path created files"
    return err[0]


@pytest.fixture
def box(scratch, monkeypatch):
    """:func:`scratch` without $STUDYLIB_DATA_DIR (it would win over --set data.data_dir)."""
    monkeypatch.delenv("STUDYLIB_DATA_DIR", raising=False)
    return scratch


# ---- presets and --set --------------------------------------------------------------------
@pytest.mark.parametrize("content, expect", [
    (b"name: x\n# caf\xe9\n", "not a text (UTF-8) YAML file"),
    (bytes(range(256)) * 4, "not a text (UTF-8) YAML file"),
])
def test_unreadable_preset(box, capsys, content, expect):
    (box / "p.yaml").write_bytes(content)
    line = _call(["train", "--params", str(box / "p.yaml"), "--model", "m"], capsys, box)
    assert "p.yaml" in line and expect in line


def test_bad_set_value_and_derive_cycle(box, capsys):
    line = _call(["train", "--params", CI, "--model", "dense_active", "--set", "train.lr=["], capsys, box)
    assert "train.lr" in line and "not valid YAML" in line
    text = Path(CI).read_text().replace("from: moe_top2_z}", "from: dense_total}", 1)
    text = text.replace("dense_total: {derive: matched_total, from: moe_top2_z}",
                        "dense_total: {derive: matched_total, from: dense_active}")
    (box / "cycle.yaml").write_text(text)
    line = _call(["train", "--params", str(box / "cycle.yaml"), "--model", "dense_active"], capsys, box)
    assert "cycle" in line and "dense_active -> dense_total -> dense_active" in line


@pytest.mark.parametrize("argv", [
    ["train", "--params", CI, "--model", "dense_active"],
    ["budget", CI],
    ["prepare-data", "--params", CI],
])
def test_a_key_set_twice_is_refused_naming_both_values(box, capsys, argv):
    """It trained with the last value (exit 0); the same key twice in a preset file is refused too."""
    line = _call(argv + ["--set", "train.lr=0.002", "--set", "train.max_steps=3", "--set", " train.lr=0.004"],
                 capsys, box)
    assert line == ("error: --set ' train.lr=0.004' sets train.lr, which --set 'train.lr=0.002' sets too; "
                    "give each key once"), line


@pytest.mark.parametrize("first, second", [
    ("train={lr: 0.004}", "train.lr=0.002"),
    ("train.lr=0.002", "train={lr: 0.004, max_steps: 3}"),
    ("model={ffn: {z_coef: 0.1}}", "model.ffn={z_coef: 0.2}"),
])
def test_a_key_set_twice_by_either_spelling_is_refused(box, capsys, first, second):
    line = _call(["budget", CI, "--set", first, "--set", second], capsys, box)
    assert line.startswith(f"error: --set {second!r} sets ") and f"which --set {first!r} sets too" in line, line


def test_set_of_a_section_merges_into_it():
    """``train={lr: 0.004}`` replaced the whole section: batch 16, eval every 250, min_lr 3e-5
    (the schema's defaults) came with it without a word; it changes the learning rate only."""
    from studylib.config import load_preset, to_dict

    base, merged = load_preset(CI), load_preset(CI, ["train={lr: 0.004}"])
    assert to_dict(merged.train) == {**to_dict(base.train), "lr": 0.004}
    assert merged == load_preset(CI, ["train.lr=0.004"])
    deep = load_preset(CI, ["models.moe_top2_z={ffn: {z_coef: 0.01}}"]).model_config("moe_top2_z")
    assert deep.ffn.z_coef == 0.01 and deep.ffn.num_experts == base.model_config("moe_top2_z").ffn.num_experts
    from studylib.config.presets import variant_tag

    assert variant_tag(["train={lr: 0.004}"]) == variant_tag(["train.lr=0.004"]) == "train.lr=0.004"


@pytest.mark.parametrize("argv, key", [
    (["train", "--params", CI, "--model", "dense_active", "--set", "train=null"], "train"),
    (["budget", CI, "--set", "data=~"], "data"),
    (["prepare-data", "--params", CI, "--set", "models={moe_hash: null}"], "models.moe_hash"),
    (["budget", CI, "--set", "model=null"], "model"),
])
def test_a_section_set_to_null_is_refused(box, capsys, argv, key):
    """``--set train=null`` trained with the schema's defaults (lr 3e-4, batch 16, no step limit), rc 0."""
    line = _call(argv, capsys, box)
    assert line.startswith(f"error: {argv[-2]} {argv[-1]!r}: {key} is a section and cannot be set to null"), line
    assert f"set its fields instead, e.g. {key}.<field>=value" in line, line


def test_a_section_set_to_null_is_refused_in_every_spelling(tmp_path):
    """The overrides mapping of a notebook and an ``extends`` child's empty section say so too;
    a null on a field (``study.margin``: its default) or a study knob (``study.noise_split``: off,
    as scripts/gpu_check.sh sets it) is still allowed."""
    from studylib.config import ConfigError, load_preset, override

    base = load_preset(CI)
    with pytest.raises(ConfigError, match=r"^override 'train': train is a section and cannot be set to null"):
        override(base, {"train": None})
    assert override(base, {"study.margin": None}).study.margin == base.study.power_target
    assert override(base, {"study.noise_split": None}).study.comparisons["noise_split"] is None
    (tmp_path / "child.yaml").write_text(f"extends: {CI}\ntrain:\n")
    with pytest.raises(ConfigError, match=r"child\.yaml: train is a section and cannot be set to null"):
        load_preset(tmp_path / "child.yaml")


@pytest.mark.parametrize("value", ["0", "48", "32"])
def test_set_on_a_shared_model_field_no_model_uses_is_refused(box, capsys, value):
    """Every ci model sets its own d_model or derives it: model.d_model changed nothing, not even
    the run identity, and 0 was never checked (issue #24)."""
    line = _call(["train", "--params", CI, "--model", "dense_active", "--set", f"model.d_model={value}"], capsys, box)
    assert f"model.d_model={value}" in line and "changes no model" in line and "models.moe_top2_z.d_model" in line


def test_set_on_a_shared_model_field_that_applies_changes_the_models():
    from studylib.config import load_preset

    assert load_preset(CI, ["model.dropout=0.25"]).model_config("dense_active").dropout == 0.25
    assert load_preset(CI, ["model.dropout=0.0"]).model_config("moe_top2_z").dropout == 0.0  # its value already


@pytest.mark.parametrize("seeds", [[-5], [2**40]])
def test_preset_seeds_are_validated(box, capsys, seeds):
    text, n = re.subn(r"(?m)^seeds: .*$", f"seeds: {seeds}", Path(CI).read_text())
    assert n == 1
    (box / "p.yaml").write_text(text)
    assert "seeds[0]" in _call(["train", "--params", str(box / "p.yaml"), "--model", "dense_active"],
                               capsys, box)


# ---- data files ---------------------------------------------------------------------------
def _gz_truncated() -> bytes:
    g = gzip.compress(("Once upon a time.\n<|endoftext|>\n" * 2000).encode())
    return g[: len(g) // 2]


@pytest.mark.parametrize("name, content, expect", [
    ("train.txt", os.urandom(4000) + b"\xff", "train.txt:1: not UTF-8 text"),
    ("train.txt", "Once upon a time.\n<|endoftext|>\nCafé au lait.\n".encode("latin-1"), "train.txt:3: not UTF-8"),
    ("train.txt.gz", b"\x00\x01" + os.urandom(2000), "train.txt.gz: not a complete gzip file"),
    ("train.txt.gz", _gz_truncated(), "train.txt.gz: not a complete gzip file"),
    ("train.jsonl", b'{"text": "a"}\nnot json\n', "train.jsonl:2: not a JSON object"),
    ("train.jsonl", b'{"text": "a"}\n{"story": "b"}\n', "train.jsonl:2: a .jsonl row needs a 'text' field"),
    ("train.jsonl", b'[1, 2]\n', "train.jsonl:1: a .jsonl row needs a 'text' field"),
    ("train.txt", b"A story.\n<|endoftext|>\n" + b"x" * 1_000_001 + b"\n", "train.txt:3: a story of 1,000,002 characters"),
])
def test_bad_data_file_names_the_file_and_line(box, capsys, name, content, expect):
    d = box / "data"
    d.mkdir()
    (d / name).write_bytes(content)
    line = _call(["prepare-data", "--params", CI, "--set", "data.source=local", "--set", f"data.data_dir={d}",
                  "--set", "data.max_stories=null"], capsys, d, box / "out")
    assert str(d / name) in line and expect in line


# ---- train arguments ----------------------------------------------------------------------
@pytest.mark.parametrize("argv, expect", [
    (["--seed", "-5"], "argument --seed"),
    (["--seed", "99999999999999999999"], "argument --seed"),
    (["--seed", "x"], "argument --seed"),
])
def test_train_bad_seed_leaves_no_run_dir(box, capsys, argv, expect):
    line = _call(["train", "--params", CI, "--model", "dense_active", *argv], capsys, box)
    assert expect in line
    assert not (box / "out").exists()


def test_train_run_dir_is_a_file(box, capsys):
    (box / "afile").write_text("x")
    line = _call(["train", "--params", CI, "--model", "dense_active", "--run-dir", str(box / "afile")], capsys, box)
    assert "--run-dir" in line and "not a directory" in line


# ---- generate -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A run directory built by hand (no training): a context of 16 tokens, and its tokenizer."""
    import torch

    from studylib.config import FFNConfig, ModelConfig, to_dict
    from studylib.nn.model import Decoder
    from studylib.run import checkpoint as C
    from studylib.run.rundir import RunDir

    base = tmp_path_factory.mktemp("tiny_run")
    cache = base / "cache"
    _, n = tiny_tokenizer(cache)
    torch.manual_seed(0)
    m = Decoder(ModelConfig(name="t", vocab_size=n, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                            context=16, dropout=0.0, ffn=FFNConfig(kind="dense", hidden=64)))
    rd = RunDir(base / "run")
    rd.write_config({"run": {"preset": "x", "model": "t", "seed": 1, "config_hash": "x"},
                     "model": to_dict(m.cfg), "preset": {"data": {"cache_dir": str(cache), "vocab_size": n}}})
    C.save(rd.checkpoints / C.LATEST, {"kind": "full", "step": 3, "config_hash": "x", "model": m.state_dict()})
    return rd.path


@pytest.mark.parametrize("argv, expect", [
    (["--max-new-tokens", "-5"], "argument --max-new-tokens: expected a positive integer"),
    (["--temperature", "-1"], "argument --temperature: expected a finite number >= 0"),
    (["--temperature", "nan"], "argument --temperature"),
    (["--temperature", "inf"], "argument --temperature"),
    (["--top-k", "0"], "argument --top-k: expected a positive integer"),
    (["--top-p", "0"], "argument --top-p: expected a probability in (0, 1]"),
    (["--top-p", "1.5"], "argument --top-p"),
    (["--samples", "0"], "argument --samples"),
    (["--seed", "-1"], "argument --seed"),
    (["--checkpoint", "/missing.pt"], "/missing.pt"),
    (["--tokenizer", "/missing.model"], "/missing.model"),
    (["--tokenizer", __file__], "not a SentencePiece .model file"),
    (["--checkpoint", __file__], "not a readable studylib checkpoint"),
])
def test_generate_bad_arguments(tiny_run, box, capsys, monkeypatch, argv, expect):
    monkeypatch.delenv("STUDYLIB_CACHE_DIR")
    assert expect in _call(["generate", "--run", str(tiny_run), *argv], capsys, box, tiny_run)


def test_generate_prompt_that_is_not_utf8(tiny_run, box, capsys, monkeypatch):
    """Bytes that are not UTF-8 reach Python as lone surrogates (a pybind cast error before)."""
    monkeypatch.delenv("STUDYLIB_CACHE_DIR")
    line = _call(["generate", "--run", str(tiny_run), "--prompt", "caf\udce9"], capsys, box, tiny_run)
    assert "--prompt: not valid UTF-8 text (byte 0xe9 at character 3)" in line


def test_generate_on_weights_that_do_not_fit_the_config(tiny_run, box, capsys, monkeypatch):
    """config.yaml edited to another shape: one line naming the checkpoint and the mismatch."""
    import shutil

    import yaml

    monkeypatch.delenv("STUDYLIB_CACHE_DIR")
    run = box / "run"
    shutil.copytree(tiny_run, run)
    doc = yaml.safe_load((run / "config.yaml").read_text())
    doc["model"]["ffn"]["hidden"] = 96
    (run / "config.yaml").write_text(yaml.safe_dump(doc))
    line = _call(["generate", "--run", str(run)], capsys, box)
    assert "latest.pt: its weights do not fit the model in" in line and "size mismatch" in line


def test_generate_missing_run_and_tokenizer(tiny_run, box, capsys, monkeypatch):
    assert str(box / "nope") in _call(["generate", "--run", str(box / "nope")], capsys, box)
    monkeypatch.setenv("STUDYLIB_CACHE_DIR", str(box / "elsewhere"))  # the run's tokenizer is not there
    line = _call(["generate", "--run", str(tiny_run)], capsys, box, tiny_run)
    assert "no tokenizer" in line and "--tokenizer" in line


def test_generate_defaults_fit_the_context(tiny_run, box, capsys, monkeypatch, one_thread):
    """A context of 16 tokens: the default 64 new tokens, and a long prompt, are capped / truncated."""
    from studylib.run.decode import new_token_budget

    monkeypatch.delenv("STUDYLIB_CACHE_DIR")  # the run's own cache_dir holds its tokenizer
    assert main(["generate", "--run", str(tiny_run), "--seed", "1"]) == 0
    assert main(["generate", "--run", str(tiny_run), "--prompt", "Once upon a time " * 20, "--no-stop",
                 "--max-new-tokens", "40", "--temperature", "0"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "capped to" in err and "keeping the last" in err
    assert new_token_budget(None, 3, 16) == 13 and new_token_budget(5, 3, 16) == 5
    assert new_token_budget(None, 40, 16) == 4 and new_token_budget(100, 1, 2048) == 100


# ---- the real command line ----------------------------------------------------------------
def _cli(args, cwd, env_extra=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT), **(env_extra or {}))
    env.pop("STUDYLIB_DATA_DIR", None)
    return subprocess.run([sys.executable, "-m", "studylib", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_subprocess_errors_are_one_line_without_traceback(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.txt").write_bytes("Café\n".encode("latin-1"))
    env = {"STUDYLIB_OUTPUTS": str(tmp_path / "out"), "STUDYLIB_CACHE_DIR": str(tmp_path / "cache")}
    cases = [["train", "--params", CI, "--model", "dense_active", "--seed", "-5"],
             ["prepare-data", "--params", CI, "--set", "data.source=local",
              "--set", f"data.data_dir={tmp_path / 'data'}"]]
    for args in cases:
        before = _files(tmp_path)
        r = _cli(args, tmp_path, env)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), r.stderr
        assert "Traceback" not in r.stderr and _files(tmp_path) == before


def test_unexpected_errors_keep_their_traceback(monkeypatch, capsys):
    import studylib.config.report as report

    def boom(args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(report, "run_cli", boom)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["budget", CI])


def test_a_command_imports_only_its_own_module():
    """`train` children start once per run of a sweep: building the parser must not import the
    other commands' modules (pandas, scipy, the bench: seconds per run)."""
    code = ("import sys\nfrom studylib.cli import main\n"
            "try:\n    main(['train', '--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('pandas', 'scipy', 'studylib.study.orchestration.train', 'studylib.tools.bench')"
            " if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]", out


# ---- help texts ---------------------------------------------------------------------------------------
def _help_texts(parser, name="python -m studylib") -> dict:
    """{command path: its --help text} of ``parser`` and every sub-command below it."""
    import argparse

    out = {name: parser.format_help()}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, p in action.choices.items():
                out.update(_help_texts(p, f"{name} {sub}"))
    return out


def test_every_preset_file_the_help_texts_cite_exists():
    """`train --help` cited params/tiny.yaml, which does not exist (issue #41)."""
    import argparse
    import importlib

    from studylib.cli import COMMANDS, Parser

    texts = {}
    for name, (mod, _) in COMMANDS.items():
        p = Parser(prog=f"python -m studylib {name}", formatter_class=argparse.HelpFormatter)
        importlib.import_module(mod).add_cli(p)
        texts.update(_help_texts(p, f"python -m studylib {name}"))
    cited = {(cmd, m) for cmd, text in texts.items()
             for m in re.findall(r"params/[\w.-]+\.ya?ml", " ".join(text.split()))}
    assert ("python -m studylib train", "params/ci.yaml") in cited, sorted(cited)
    assert len(texts) > len(COMMANDS)  # bench's sub-commands too
    missing = sorted((cmd, m) for cmd, m in cited if not (ROOT / m).is_file())
    assert not missing, missing
