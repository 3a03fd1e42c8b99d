"""``python -m studylib <command>``: one sub-command per job, each with ``--help``.

Each command lives in the module that does the work, which exposes ``add_cli(parser)`` and
``run_cli(args) -> int``; modules are imported only when their command runs.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from studylib.config import ConfigError

COMMANDS = {
    # name: (module, one-line help)
    "budget": ("studylib.config.report", "parameter accounting table and budget-matched dense widths"),
    "prepare-data": ("studylib.run.data", "train the SentencePiece tokenizer and build the token cache"),
    "train": ("studylib.run.trainer", "train one model of a preset with one seed"),
    "study": ("studylib.study.notebooks", "execute the study notebooks with papermill (and an HTML report)"),
    "bench": ("studylib.tools.bench", "training / decoding throughput benchmarks"),
    "generate": ("studylib.run.decode", "sample text from a trained run"),
}


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studylib",
                                     description="Dense vs MoE pretraining at tiny scale: one command per job.")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    cmds = _available()
    for name, (mod, help_) in cmds.items():
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(_module=mod, _parser=p)
        importlib.import_module(mod).add_cli(p)
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        return int(importlib.import_module(args._module).run_cli(args) or 0)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
