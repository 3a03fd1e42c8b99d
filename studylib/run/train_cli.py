"""The ``train`` command: ``python -m studylib train --params params/X.yaml --model NAME [--seed N]
[--set k=v ...] [--run-dir DIR]`` -> :func:`studylib.run.trainer.train_run`. Known errors (config, data, checkpoint, run dir) reach
:mod:`studylib.cli`, which prints them as one line with exit code 2; a non-finite loss exits 1."""
from __future__ import annotations

import os
import sys

from studylib.config import args as argtypes
from studylib.config import load_preset
from studylib.run.layout import run_dir_for
from studylib.run.tensorboard import after_runs
from studylib.run.trainer import NonFiniteLossError, train_run


def add_cli(parser) -> None:
    parser.add_argument("--params", required=True, help="preset YAML, e.g. params/ci.yaml")
    parser.add_argument("--model", required=True, help="model name from the preset's models")
    parser.add_argument("--seed", type=argtypes.seed, default=None, help="seed (default: the preset's first)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a preset value, e.g. --set train.max_steps=100 (repeatable)")
    parser.add_argument("--run-dir", default=None, help="run directory (default: outputs/<preset>/runs/"
                                                        "<model>/seed<seed>/)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run_cli(args) -> int:
    preset = load_preset(args.params, args.set)
    seed = args.seed if args.seed is not None else preset.seeds[0]
    try:
        s = train_run(preset, args.model, seed, run_dir=args.run_dir, progress=not args.no_progress)
    except NonFiniteLossError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"{args.model} seed {seed}: best val loss {s['best_val_loss']:.4f} "
              f"(ppl {s['best_val_ppl']:.2f}) at step {s['best_step']}; final {s['final_val_loss']:.4f}; "
              f"{s['steps']} steps, {s['train_tok_per_s']:,.0f} tok/s")
        after_runs(args.run_dir or run_dir_for(preset, args.model, seed))
    return 0
