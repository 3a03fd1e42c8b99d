import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def subset_dir() -> Path:
    """The shared TinyStories subset: ``$STUDYLIB_DATA_DIR``, else ``../shared/data/tinystories``
    beside the repository (where CI and the developers' machines have it)."""
    return Path(os.environ.get("STUDYLIB_DATA_DIR") or ROOT.parent / "shared" / "data" / "tinystories")


def require_subset() -> Path:
    """The subset's folder; a test that needs it skips on a machine without it, but FAILS under CI
    (``CI`` set), where a missing subset is a broken set-up, not a reason to test less."""
    d = subset_dir()
    if not (d / "train.txt.gz").exists():
        msg = f"the TinyStories subset is missing ({d}/train.txt.gz; set STUDYLIB_DATA_DIR)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return d


@pytest.fixture
def subset() -> Path:
    return require_subset()


@pytest.fixture
def one_thread():
    """Tiny shapes: one thread avoids OpenMP barrier stalls when the shared machine is busy."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def scratch(tmp_path, monkeypatch) -> Path:
    """A scratch folder as the working directory, with the outputs and caches inside it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    monkeypatch.setenv("STUDYLIB_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


@pytest.fixture(autouse=True)
def fresh_data_memo():
    """Each test starts with nothing loaded in this process (studylib.data.pipeline.shared_data):
    a test that fakes load_data, or whose cache folder is gone, must not hand its data to the next."""
    from studylib.data import pipeline

    pipeline._LOADED.clear()
    yield
    pipeline._LOADED.clear()
