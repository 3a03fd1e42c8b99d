"""The routing explorer in a real browser: JupyterLab + headless Chromium (Playwright).

Starts JupyterLab on loopback with a token over a temporary folder holding the explorer notebook
(notebooks/08_routing_explorer.py converted by jupytext, parameters pointing at a tiny finished
run), opens it in /usr/bin/chromium, runs all cells, types a prompt into the explorer's text box
and checks that the grid image re-rendered with the new tokens. Screenshots go to the test's tmp
folder and are copied to outputs/browser-test/ for humans.

The tiny run comes from the ``explore_study`` fixture (conftest.py). Needs /usr/bin/chromium and
the playwright package (``.ci/browser-deps`` installs both; playwright never downloads a browser
here). Slow (~1 min): marked ``slow``.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from urllib.parse import urlparse
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "notebooks" / "08_routing_explorer.py"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]
NEW_PROMPT = "The cat sat on the mat"
SHOTS = REPO / "outputs" / "browser-test"


def _need_browser():
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"{CHROMIUM} is missing (run .ci/browser-deps: apt-get install chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("the playwright package is missing (run .ci/browser-deps: pip install playwright)")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:  # loopback only
        return r.status, r.read()


def _write_notebook(dest: Path, parameters: dict) -> Path:
    import jupytext
    import nbformat
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    nb = jupytext.read(str(NOTEBOOK))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata.pop("jupytext", None)  # a standalone .ipynb, not paired (jupytext's Lab extension would refuse it)
    path = dest / "routing_explorer.ipynb"
    nbformat.write(nb, str(path))
    nb = parameterize_notebook(load_notebook_node(str(path)), parameters)  # as papermill would
    nbformat.write(nb, str(path))
    return path


@pytest.fixture(scope="module")
def tiny(request):
    """The explorer tests' tiny study (conftest.py), built only when a browser is there."""
    _need_browser()
    return request.getfixturevalue("explore_study")


@pytest.fixture
def lab(tiny, tmp_path):
    """A JupyterLab server (subprocess) on 127.0.0.1 serving a folder with the explorer notebook."""
    root = tmp_path / "lab"
    root.mkdir()
    nb = _write_notebook(root, {"params": str(tiny["params"]), "run": str(tiny["runs"]["moe"]),
                                "prompt": "Once upon a time"})
    settings = tmp_path / "lab-settings"
    note = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    note.parent.mkdir(parents=True)
    note.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
               JUPYTER_RUNTIME_DIR=str(tmp_path / "jp-runtime"), JUPYTER_CONFIG_DIR=str(tmp_path / "jp-config"),
               JUPYTERLAB_SETTINGS_DIR=str(settings), JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "jp-ws"),
               IPYTHONDIR=str(tmp_path / "ipython"), PYTHONUNBUFFERED="1")
    port, token = _free_port(), secrets.token_hex(16)
    log_path = tmp_path / "jupyterlab.log"
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip", "127.0.0.1", "--port", str(port),
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "--LabApp.extension_manager=readonly"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # CI containers run as root
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(root),
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                if _get(f"{base}/api/status?token={token}")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not answer within 120 s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield {"base": base, "token": token, "notebook": nb, "tiny": tiny, "log": log_path}
    finally:
        try:  # shut the kernels down through the API, then the server
            _, body = _get(f"{base}/api/kernels?token={token}")
            for k in json.loads(body):
                req = urllib.request.Request(f"{base}/api/kernels/{k['id']}?token={token}", method="DELETE")
                urllib.request.urlopen(req, timeout=10).close()
        except Exception:
            pass
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the server's own process group (start_new_session)
            proc.wait(timeout=10)
        log.close()


def test_explorer_in_jupyterlab(lab, tmp_path):
    from playwright.sync_api import sync_playwright

    from studylib.run.rundir import RunDir

    tok = RunDir(lab["tiny"]["runs"]["moe"]).load_model().tokenizer
    want = [tok.id_to_piece(i) for i in [tok.eos_id()] + tok.encode(NEW_PROMPT)]
    shot_dir = tmp_path / "screenshots"
    shot_dir.mkdir()
    console: list[str] = []
    url = f"{lab['base']}/lab/tree/{lab['notebook'].name}?token={lab['token']}&reset"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True, timeout=60_000)
        page = browser.new_page(viewport={"width": 1600, "height": 2400})
        page.set_default_timeout(60_000)
        page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
        page.route("**/*", lambda route: route.continue_() if urlparse(route.request.url).hostname == "127.0.0.1"
                   else route.abort())  # loopback only
        try:
            page.goto(url, wait_until="domcontentloaded", timeout=90_000)
            page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell", timeout=120_000)
            page.wait_for_selector('.jp-Notebook-ExecutionIndicator[data-status="idle"]', timeout=120_000)
            page.wait_for_timeout(2000)  # the toolbar turns idle a moment before the session takes requests
            # Run > Run All Cells; again if the cells did not all get queued (kernel not ready yet)
            explorer = page.locator(".studylib-explorer").first
            for attempt in range(4):
                page.locator(".lm-MenuBar-item", has_text="Run").first.click()
                item = page.locator(".lm-Menu-content .lm-Menu-item",
                                    has=page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")))
                item.first.click()
                deadline, stalled, prompts = time.monotonic() + 120, 0, []
                while time.monotonic() < deadline and not explorer.count() and stalled < 6:
                    page.wait_for_timeout(1000)
                    prompts = page.locator(".jp-CodeCell .jp-InputPrompt").all_inner_texts()
                    idle = page.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]').count() > 0
                    # stalled: the kernel idles, nothing is queued, and some code cell never ran
                    waiting = idle and not any("*" in p for p in prompts) and any(not p.strip() for p in prompts)
                    stalled = stalled + 1 if waiting else 0
                if explorer.count():
                    break
                print(f"Run All Cells attempt {attempt + 1} did not reach the explorer; prompts: {prompts}")
                page.keyboard.press("Escape")
            explorer.wait_for(state="attached", timeout=60_000)
            explorer.scroll_into_view_if_needed()
            grid = explorer.locator("img.studylib-grid, .studylib-grid img").first
            grid.wait_for(state="visible", timeout=120_000)
            page.wait_for_function("e => e.naturalWidth > 100", arg=grid.element_handle(), timeout=60_000)
            tokens = explorer.locator(".studylib-tokens").first
            tokens.wait_for(state="visible")
            assert "Once" in tokens.inner_text().replace("▁", "") or "O" in tokens.inner_text()
            src_before = grid.get_attribute("src")
            page.screenshot(path=str(shot_dir / "explorer_initial.png"))

            # type a prompt into the explorer's text box and press Enter
            box = explorer.locator(".studylib-prompt input").first
            box.click()
            box.fill(NEW_PROMPT)
            box.press("Enter")
            deadline = time.monotonic() + 60
            while True:
                text = tokens.inner_text()
                if f"{len(want)} tokens:" in text and all(p in text for p in want):
                    break
                if time.monotonic() > deadline:
                    pytest.fail(f"the explorer did not show the new prompt's tokens {want}; it shows {text!r}")
                time.sleep(0.3)
            page.wait_for_function("([e, old]) => e.src !== old && e.naturalWidth > 100",
                                   arg=[grid.element_handle(), src_before], timeout=30_000)
            status = explorer.locator(".studylib-status").first.inner_text()
            assert "error" not in status.lower(), status
            explorer.scroll_into_view_if_needed()
            page.wait_for_timeout(500)
            page.screenshot(path=str(shot_dir / "explorer.png"))
            explorer.screenshot(path=str(shot_dir / "explorer_widget.png"))
            # every cell ran without an error output
            assert page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr'] "
                                ":text('Traceback')").count() == 0
            assert page.locator(".jp-RenderedText[data-mime-type='application/vnd.jupyter.error']").count() == 0
        except Exception:
            page.screenshot(path=str(shot_dir / "failure.png"))
            print("browser console:\n" + "\n".join(console[-40:]))
            print("jupyterlab log:\n" + lab["log"].read_text()[-3000:])
            raise
        finally:
            browser.close()
            SHOTS.mkdir(parents=True, exist_ok=True)
            for p in shot_dir.glob("*.png"):
                shutil.copy(p, SHOTS / p.name)
    assert (shot_dir / "explorer.png").stat().st_size > 10_000
