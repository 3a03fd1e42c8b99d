"""``python -m studylib <command>``: one sub-command per job, each with ``--help``.

Each command lives in the module that does the work, which exposes ``add_cli(parser)`` and
``run_cli(args) -> int``; modules are imported only when their command runs.

Errors: a known error (bad arguments, config, data, checkpoint, run directory) prints ONE line
``error: ...`` naming the field or file and exits with 2, before anything is created on disk
(arguments shared by commands, ``--seed`` and ``--run-dir``, are checked here before the command
runs), and so do the sweep's: a failed run (:class:`studylib.study.orchestration.common.SweepError`)
and a Dask cluster that cannot train it (a scheduler that does not answer or went away, a refused
worker: ``ClusterError``, a ConfigError). Any other exception keeps its traceback.
"""
from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys

from studylib.config import ConfigError
from studylib.config.args import seed_error

COMMANDS = {
    # name: (module, one-line help)
    "budget": ("studylib.config.report", "parameter accounting table and budget-matched dense widths"),
    "prepare-data": ("studylib.data.pipeline", "train the SentencePiece tokenizer and build the token cache"),
    "train": ("studylib.run.train_cli", "train one model of a preset with one seed"),
    "study": ("studylib.study.runner.notebooks", "execute the study notebooks with papermill (and an HTML report)"),
    "bench": ("studylib.tools.bench", "training / decoding throughput benchmarks"),
    "generate": ("studylib.run.decode", "sample text from a trained run"),
    "export": ("studylib.run.hf.export", "write a run as a Hugging Face model folder (Llama / Mixtral / Qwen2Moe / Glm4Moe)"),
    "tensorboard": ("studylib.run.tensorboard", "write TensorBoard event files from the runs' metrics.jsonl"),
    "evaluate": ("studylib.run.hf.suite", "lm-evaluation-harness on a run (local TinyStories suite offline)"),
}

# Known errors besides ConfigError (and its DataError / RunDirConflict / ...): (module, class).
# Looked up in sys.modules only, so this module never imports torch for them.
KNOWN_ERRORS = (("studylib.run.checkpoint", "CheckpointError"),
                ("studylib.study.orchestration.common", "SweepError"))


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``error: <command>: argument --x: expected ...`` (exit 2)."""

    def error(self, message):  # noqa: D401 - argparse API
        prog = self.prog.replace("python -m studylib", "").strip()
        print(f"error: {prog + ': ' if prog else ''}{message} (see --help)", file=sys.stderr)
        sys.exit(2)


def _available() -> dict:
    out = {}
    for name, (mod, help_) in COMMANDS.items():
        try:
            spec = importlib.util.find_spec(mod)
        except ModuleNotFoundError:
            spec = None
        if spec is not None:
            out[name] = (mod, help_)
    return out


def check_common(args) -> None:
    """Arguments several commands share, checked before any command creates anything."""
    seed = getattr(args, "seed", None)
    if seed is not None and seed_error(seed, "argument --seed"):
        raise ConfigError(seed_error(seed, "argument --seed"))
    run_dir = getattr(args, "run_dir", None)
    if run_dir is not None and os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise ConfigError(f"argument --run-dir: {run_dir} exists and is not a directory; "
                          "expected a run directory (or a path that does not exist yet)")


# Where a file cannot be written (a read-only filesystem or folder, a full disk): the file and the
# reason are the whole story, a traceback adds nothing.
UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT)


def known_error(e: BaseException) -> bool:
    if isinstance(e, ConfigError):
        return True
    if isinstance(e, OSError) and e.errno in UNWRITABLE:
        return True
    for mod, name in KNOWN_ERRORS:
        cls = getattr(sys.modules.get(mod), name, None)
        if cls is not None and isinstance(e, cls):
            return True
    return False


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m studylib",
                    description="Dense vs MoE pretraining at tiny scale: one command per job.")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    cmds = _available()
    argv = sys.argv[1:] if argv is None else list(argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (mod, help_) in cmds.items():
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(_module=mod, _parser=p)
        if name == chosen:  # only the chosen command's module is imported (a `train` child must
            importlib.import_module(mod).add_cli(p)  # not pay for pandas, scipy, the bench, ...)
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        check_common(args)
        return int(importlib.import_module(args._module).run_cli(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if not known_error(e):
            raise
        print("error: " + " ".join(_message(e).split()), file=sys.stderr)
        return 2


def _message(e: BaseException) -> str:
    if isinstance(e, OSError) and e.errno in UNWRITABLE and type(e).__str__ is OSError.__str__:
        where = e.filename if e.filename is not None else "a file"
        return f"{where}: {e.strerror}; cannot write there (a read-only filesystem or folder, or a full disk)"
    return str(e)
