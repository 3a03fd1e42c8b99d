"""Stories: the corpus as an iterator of cleaned story texts, from local files
(``data.data_dir``: ``.txt``/``.txt.gz`` with ``<|endoftext|>`` separator lines, ``.jsonl`` with a
``text`` field, ``.parquet`` with a ``text`` column) or the Hugging Face hub (``datasets``), with a
clear message when neither is available; and the corpus fingerprint that keys the caches."""
from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import os
import re
import socket
import threading
import zlib
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional
from urllib.parse import urlparse

from studylib.config import ConfigError, DataConfig

EOT = "<|endoftext|>"
DATA_EXTENSIONS = (".txt", ".txt.gz", ".jsonl", ".parquet")
# A longer "story" is a file read wrongly (no separators): encoding one 50 MB story took 3.2 GB
MAX_STORY_CHARS = 1_000_000


class DataError(ConfigError):
    """The data cannot be found, fetched or tokenised; the message says what to do."""



def data_files(data_dir: str | os.PathLike) -> list[Path]:
    """The data files of ``data_dir``, sorted by name: ONE corpus file, or the shards of one
    export (``train-00000-of-00004.parquet`` ... ``train-00003-of-00004.parquet``, every one of
    them: a name, then ``-NNNNN-of-MMMMM`` and the extension).

    Files whose name contains ``valid`` (``valid.txt.gz``, ``validation-*.parquet``) are
    skipped: the held-out set is a split of our own stories, not the corpus' validation split.
    Anything else is a :class:`DataError` naming the files: files of two formats (``train.jsonl``
    beside ``train.txt.gz``, most likely one corpus twice), two files of one format that are not
    one export's shards (``train.txt.gz`` beside ``train-v2.txt.gz``: two corpora, or one twice,
    would be read as one), or an export with shards missing.
    """
    d = Path(data_dir)
    files = sorted(p for p in d.iterdir() if p.is_file() and not p.name.startswith(".")
                   and p.name.endswith(DATA_EXTENSIONS) and "valid" not in p.name.lower())
    formats = {_format(p) for p in files}
    if len(formats) > 1:
        raise DataError(f"data.data_dir={str(d)!r} holds training stories in {len(formats)} formats "
                        f"({', '.join(p.name for p in files)}): one corpus is read from files of one format "
                        f"(likely the same stories twice); move the other files out of the folder")
    if len(files) > 1:
        _check_shards(d, files)
    return files


_SHARD = re.compile(r"^(?P<name>.+)-(?P<i>\d{5})-of-(?P<n>\d{5})$")


def _check_shards(d: Path, files: list[Path]) -> None:
    """Several files of one format must be every shard of one export, else a :class:`DataError`."""
    shards = [_SHARD.match(p.name[: -len(_format(p))]) for p in files]
    series = {(m["name"], m["n"]) for m in shards if m}
    names = ", ".join(p.name for p in files)
    if None in shards or len(series) != 1:
        raise DataError(f"data.data_dir={str(d)!r} holds {len(files)} corpus files ({names}): a data folder holds "
                        f"one corpus, in one file or the shards of one export (NAME-00000-of-00002{_format(files[0])}, "
                        f"...); move the other files out of the folder (or rename a held-out file to *valid*)")
    total = int(next(iter(series))[1])
    missing = sorted(set(range(total)) - {int(m["i"]) for m in shards})
    if missing or len(files) != total:
        raise DataError(f"data.data_dir={str(d)!r} holds {len(files)} of the {total} shards of one export ({names}); "
                        f"missing: {', '.join(f'{i:05d}' for i in missing) or 'none, but shards beyond the count'}")


def _format(path: Path) -> str:
    """The data format of a file: the longest of :data:`DATA_EXTENSIONS` its name ends with."""
    return max((ext for ext in DATA_EXTENSIONS if path.name.endswith(ext)), key=len)


def _read_text(path: Path, where: list) -> Iterator[str]:
    """Stories of a .txt / .txt.gz file: separated by lines that are exactly ``<|endoftext|>``."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines: list[str] = []
        for where[0], line in enumerate(f, 1):
            if line.strip() == EOT:
                yield "".join(lines)
                lines = []
            else:
                lines.append(line)
        yield "".join(lines)  # text after the last separator (usually empty)


def _read_jsonl(path: Path, where: list) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        for where[0], line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{where[0]}: not a JSON object ({e.msg}); expected one "
                                "{\"text\": \"...\"} per line") from None
            if not isinstance(row, dict) or not isinstance(row.get("text", 0), (str, type(None))):
                raise DataError(f"{path}:{where[0]}: a .jsonl row needs a 'text' field holding a string")
            yield row["text"]


def _read_file(path: Path) -> Iterator[str]:
    """The texts of one data file; a file that cannot be read, or a text longer than
    :data:`MAX_STORY_CHARS`, is a :class:`DataError` naming it (and the line, for text files)."""
    where = [0]  # the last line read (1-based), for the error message
    for n, text in enumerate(_read_texts(path, where), 1):
        if text and len(text) > MAX_STORY_CHARS:
            at = f"{path}:{where[0]}" if where[0] else f"{path} (row {n})"
            raise DataError(f"{at}: a story of {len(text):,} characters, more than {MAX_STORY_CHARS:,} "
                            f"(TinyStories' are under 10,000): are the stories separated by lines "
                            f"'{EOT}' (.txt) or one per row (.jsonl, .parquet)?")
        yield text


def _read_texts(path: Path, where: list) -> Iterator[str]:
    try:
        if path.name.endswith(".jsonl"):
            yield from _read_jsonl(path, where)
        elif path.name.endswith(".parquet"):
            import pyarrow.parquet as pq  # a dependency of `datasets`

            table = pq.read_table(path, columns=["text"])
            for batch in table.to_batches():
                yield from batch.column(0).to_pylist()
        else:
            yield from _read_text(path, where)
    except UnicodeDecodeError as e:
        line, byte = _first_bad_line(path, e)
        raise DataError(f"{path}:{line}: not UTF-8 text (byte {byte!r}); expected UTF-8 "
                        "stories separated by '<|endoftext|>' lines") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise DataError(f"{path}: not a complete gzip file ({_one_line(e)}); expected gzip-compressed "
                        "UTF-8 text") from None
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({_one_line(e)})") from None
    except DataError:
        raise
    except Exception as e:  # pyarrow's errors (a damaged .parquet) are not one family
        if path.name.endswith(".parquet") and type(e).__module__.startswith("pyarrow"):
            raise DataError(f"{path}: not a readable parquet file with a 'text' column "
                            f"({_one_line(e)})") from None
        raise


def _first_bad_line(path: Path, e: UnicodeDecodeError) -> tuple[int, bytes]:
    """(1-based line number, offending byte) of the first line of ``path`` that is not UTF-8
    (text mode decodes in blocks, so the error itself does not know the line)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            for n, raw in enumerate(f, 1):
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError as bad:
                    return n, raw[bad.start:bad.start + 1]
    except (OSError, EOFError, zlib.error):
        pass
    return 1, e.object[e.start:e.start + 1]


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())[:200] or type(e).__name__


def _clean(texts: Iterable[Optional[str]]) -> Iterator[str]:
    for t in texts:
        t = (t or "").strip()
        if t:
            yield t


def _local_stories(data_dir: str) -> Callable[[], Iterator[str]]:
    d = Path(data_dir)
    files = data_files(d) if d.is_dir() else []
    if not files:
        what = "does not exist" if not d.exists() else "holds no data files"
        raise DataError(f"data.data_dir={str(d)!r} {what}; expected files ending in "
                        f"{', '.join(DATA_EXTENSIONS)} (files named *valid* are ignored)")
    return lambda: _clean(itertools.chain.from_iterable(_read_file(p) for p in files))


def _hub_host() -> tuple[str, int]:
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    url = urlparse(proxy or os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    return url.hostname or "huggingface.co", url.port or (443 if url.scheme != "http" else 80)


def _reachable(host: str, port: int, timeout: float = 3.0) -> Optional[str]:
    """None if a TCP connection opens within ``timeout`` s (DNS included), else the reason."""
    result: list = ["timed out after %.0f s" % timeout]

    def probe():
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result[0] = None
        except OSError as e:
            result[0] = str(e) or type(e).__name__

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout)
    return result[0]


def _hub_stories(cfg: DataConfig) -> Callable[[], Iterator[str]]:
    env = [k for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
           if os.environ.get(k, "").strip().lower() in ("1", "true", "yes", "on")]
    host, port = _hub_host()
    why = f"{' and '.join(env)} is set" if env else _reachable(host, port)
    if why:
        local = f" (data.data_dir={cfg.data_dir!r} holds no data files)" if cfg.data_dir else ""
        raise DataError(
            f"the Hugging Face hub ({host}:{port}) is unreachable for dataset "
            f"{cfg.hub_dataset!r}: {why}{local}. Work offline with local files instead: put "
            f"train.txt.gz (stories separated by lines '{EOT}'), or .txt / .jsonl (field 'text') "
            f"/ .parquet (column 'text') files in a directory and point data.data_dir (or the "
            f"environment variable STUDYLIB_DATA_DIR) at it.")
    import datasets

    split = cfg.hub_split + (f"[:{cfg.max_stories}]" if cfg.max_stories else "")
    try:
        ds = datasets.load_dataset(cfg.hub_dataset, split=split)
    except Exception as e:  # network, auth, missing dataset/split: one clear message
        raise DataError(f"could not load {cfg.hub_dataset!r} split {split!r} from the hub: {e}") from e
    col = "text" if "text" in ds.column_names else "story" if "story" in ds.column_names else None
    if col is None:
        raise DataError(f"{cfg.hub_dataset!r} has no 'text' column; columns: {ds.column_names}")
    return lambda: _clean(t for b in ds.select_columns([col]).iter(batch_size=1000) for t in b[col])


def resolved_source(cfg: DataConfig) -> str:
    """``data.source`` with ``auto`` resolved: ``local`` when ``data.data_dir`` holds data files,
    else ``hub``."""
    if cfg.source != "auto":
        return cfg.source
    d = Path(cfg.data_dir) if cfg.data_dir else None
    return "local" if d is not None and d.is_dir() and data_files(d) else "hub"


def story_source(cfg: DataConfig) -> Callable[[], Iterator[str]]:
    """A function returning a fresh iterator over the (cleaned, first ``max_stories``) stories."""
    source = resolved_source(cfg)
    if source == "local":
        if not cfg.data_dir:
            raise DataError("data.data_dir: source 'local' needs a directory (or env STUDYLIB_DATA_DIR)")
        stories = _local_stories(cfg.data_dir)
    elif source == "hub":
        stories = _hub_stories(cfg)
    else:
        raise DataError(f"data.source: must be one of ['auto', 'local', 'hub'], got {cfg.source!r}")
    return lambda: itertools.islice(stories(), cfg.max_stories)


def fingerprint(stories: Iterable[str]) -> tuple[str, int]:
    """(sha256 over the story texts, number of stories)."""
    h, n = hashlib.sha256(), 0
    for s in stories:
        b = s.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
        n += 1
    return h.hexdigest(), n
