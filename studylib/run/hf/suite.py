"""``python -m studylib evaluate``: lm-evaluation-harness on ONE run, through its transformers
export (lm_eval.simple_evaluate, model type ``hf``), results written as JSON next to the run.

The local TinyStories suite needs no network; it is built from the run's own validation data:
a *validation story* is a story of the validation side of the run's split (the data is split by
story, so no part of one was trained on).

- ``tinystories_lastword``: LAMBADA-style; the context is the story up to its final word, the
  target is `` word`` (accuracy: greedy decoding gives the whole word; perplexity of the word).
- ``tinystories_ppl``: word / byte perplexity and bits per byte of the validation stories
  (``loglikelihood_rolling``).

Standard lm-eval tasks run when the Hub is reachable; offline they fail at once, saying so.
"""
from __future__ import annotations

import json
import os
import re
import socket
import sys
from pathlib import Path
from typing import Optional, Sequence

from studylib.config import ConfigError, DataConfig, dataclass_from_dict
from studylib.storage.files import write_atomic, write_json_atomic
from studylib.run.rundir import RunDir

LOCAL_TASKS = ("tinystories_lastword", "tinystories_ppl")
EVAL_DIR = "lm_eval"  # under the run directory: export, task files, results
_LAST_WORD = re.compile(r"^(.*\S)\s+(\w[\w'-]*)(\W*)$", re.S)

_YAML = {
    "tinystories_lastword": """task: tinystories_lastword
dataset_path: json
dataset_kwargs:
  data_files: {{test: "{data}"}}
test_split: test
output_type: loglikelihood
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{target}}}}"
metric_list:
  - metric: perplexity
    aggregation: perplexity
    higher_is_better: false
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
""",
    "tinystories_ppl": """task: tinystories_ppl
dataset_path: json
dataset_kwargs:
  data_files: {{test: "{data}"}}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
metadata:
  version: 1.0
""",
}


def split_last_word(story: str) -> Optional[tuple[str, str]]:
    """(context, " word") of a story ending in a word (trailing punctuation dropped), else None."""
    m = _LAST_WORD.match(story.strip())
    return (m.group(1), " " + m.group(2)) if m else None


def validation_stories(run: os.PathLike, max_docs: Optional[int] = None) -> list[str]:
    """The run's validation stories (see the module doc), in corpus order, decoded to text."""
    import numpy as np

    from studylib.data.pipeline import shared_data

    doc = RunDir(run).read_config() or {}
    raw = (doc.get("preset") or {}).get("data")
    if raw is None:
        raise ConfigError(f"{run}: config.yaml has no preset.data section (not a studylib run?)")
    data = shared_data(dataclass_from_dict(DataConfig, raw, "preset.data"))
    sp = data.tokenizer()
    toks = np.asarray(data.side_tokens("val"))
    ends = np.flatnonzero(toks == sp.eos_id())
    starts = np.concatenate([[0], ends[:-1] + 1])
    out = []
    for s, e in zip(starts, ends):
        text = sp.decode(toks[s:e].astype(np.int64).tolist()).strip()
        if text:
            out.append(text)
        if max_docs is not None and len(out) >= max_docs:
            break
    return out


def write_suite(run: os.PathLike, folder: os.PathLike, max_docs: Optional[int] = 500) -> Path:
    """The local task files (YAML + JSONL) under ``folder``; returns the folder to include."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stories = validation_stories(run, max_docs)
    if not stories:
        raise ConfigError(f"{run}: the run has no validation stories; raise data.val_fraction")
    lastword = [{"context": c, "target": t} for c, t in filter(None, map(split_last_word, stories))]
    rows = {"tinystories_lastword": lastword, "tinystories_ppl": [{"text": s} for s in stories]}
    for name, docs in rows.items():
        data = folder / f"{name}.jsonl"
        write_atomic(data, "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs))
        write_atomic(folder / f"{name}.yaml", _YAML[name].format(data=data.resolve()))
    return folder


def _hub_reachable(timeout: float = 3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0") or \
            os.environ.get("HF_DATASETS_OFFLINE", "0") not in ("", "0"):
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def task_manager(suite: os.PathLike, standard: bool):
    """lm-eval's task index over the local ``suite``, plus lm-eval's built-in tasks only when
    ``standard`` tasks are asked for: indexing the ~14,000 built-in task YAMLs took 13.6 s of a
    22 s local-suite evaluation on the 2-core CPU, the local suite alone 0.07 s."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(suite), include_defaults=standard)


def evaluate(run: os.PathLike, tasks: Sequence[str] = LOCAL_TASKS, step: Optional[int] = None,
             limit: Optional[int] = None, max_docs: Optional[int] = 500, batch_size: int = 16,
             tokenizer: Optional[os.PathLike] = None, out: Optional[os.PathLike] = None) -> dict:
    """Export ``run`` (at ``step``), run lm-eval ``tasks`` on it, write ``results[-stepN].json`` (with
    the export and the task files) into ``out`` (default: the run's ``lm_eval`` folder; another
    folder for a run on a read-only filesystem)."""
    import lm_eval

    from studylib.run.hf import export, format as hf_format

    rd = RunDir(run)
    hf_format.check(rd.model_config())
    standard = [t for t in tasks if t not in LOCAL_TASKS]
    if standard and not _hub_reachable():
        raise ConfigError(f"tasks {standard} need the Hugging Face Hub, which is unreachable (offline); "
                          f"the local tasks need no network: {list(LOCAL_TASKS)}")
    base = Path(out) if out is not None else rd.path / EVAL_DIR
    tag = "" if step is None else f"-step{step}"
    model_dir = export.export(rd.path, base / f"hf{tag}", step, tokenizer)
    suite = write_suite(rd.path, base / "tasks", max_docs)
    res = lm_eval.simple_evaluate(
        model="hf", model_args=f"pretrained={model_dir},dtype=float32,add_bos_token=False",
        tasks=list(tasks), task_manager=task_manager(suite, bool(standard)), batch_size=batch_size,
        device="cpu", limit=limit, log_samples=False)
    out = {"run": str(rd.path), "step": json.loads((model_dir / "studylib_export.json").read_text())["step"],
           "tasks": list(tasks), "results": res["results"], "n_samples": res.get("n-samples"),
           "versions": res.get("versions")}
    write_json_atomic(base / f"results{tag}.json", out, indent=2, default=str)
    return out


def add_cli(parser) -> None:
    parser.add_argument("--run", required=True, help="run directory")
    parser.add_argument("--tasks", nargs="+", default=list(LOCAL_TASKS),
                        help=f"lm-eval task names (local, no network: {' '.join(LOCAL_TASKS)})")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    parser.add_argument("--limit", type=int, default=None, help="documents per task (default: all)")
    parser.add_argument("--max-docs", type=int, default=500, help="validation stories in the local suite")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--tokenizer", default=None, help="SentencePiece model (default: the run's)")
    parser.add_argument("--out", default=None,
                        help=f"folder for the export, the task files and the results (default: <run>/{EVAL_DIR})")


def run_cli(args) -> int:
    try:
        out = evaluate(args.run, args.tasks, args.step, args.limit, args.max_docs, args.batch_size,
                       args.tokenizer, args.out)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out["results"], indent=2, default=str))
    return 0
