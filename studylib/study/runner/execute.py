"""Executing notebooks: Jupytext -> papermill, each in its own kernel over private IPC sockets,
several at a time (:func:`execute_all`). :mod:`studylib.study.runner.notebooks` runs the study with it.

A notebook that times something (its Jupytext header holds ``studylib: {run_alone: true}``, e.g.
05_throughput's benchmarks) runs alone: it starts once the running notebooks have finished, and
nothing starts beside it. One that reads another's tables (``studylib: {after: ["09"]}``, e.g.
13_controls) starts once that notebook has finished when the same study runs it. A failing notebook stops the phase: nothing new starts, the running
notebooks finish, and the first failure in file order is raised as a :class:`StudyError` naming
the notebook, the failing cell and the error. Ctrl+C ends the running kernels.
"""
from __future__ import annotations

import os
import re
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Optional, Sequence

from studylib.config import ConfigError
from studylib.storage.files import write_atomic
from studylib.study.runner.injected import assigned_names
from studylib.study.runner.report import KERNEL


#: the parameters every study notebook declares (none of them changes an executed notebook's name)
COMMON_PARAMETERS = ("params", "jobs", "seeds", "overrides")


class StudyError(RuntimeError):
    """A notebook of the study failed; the message names the notebook and the failing cell."""


def to_ipynb(py_path: os.PathLike):
    """The Jupytext ``py:percent`` file as an nbformat notebook (kernel python3)."""
    import jupytext

    nb = jupytext.read(str(py_path))
    # the executed copy is a plain notebook: without this, JupyterLab's jupytext extension looks
    # for the paired .py next to it and refuses to open it
    nb.metadata.pop("jupytext", None)
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Python 3", "language": "python"}
    return nb


def notebook_parameters(py_path: os.PathLike) -> list[str]:
    """The names the cell tagged ``parameters`` of a Jupytext notebook assigns, in order."""
    import jupytext

    nb = jupytext.read(str(py_path))
    for cell in nb.cells:
        if cell.cell_type == "code" and "parameters" in cell.metadata.get("tags", []):
            return assigned_names(cell.source)
    return []


def _failure_message(name: str, err, out_path: Optional[Path]) -> str:
    src = (getattr(err, "source", "") or "").strip().splitlines()
    head = "\n".join("    " + ln for ln in src[:6]) + ("\n    ..." if len(src) > 6 else "")
    return (f"notebook {name} failed in cell {err.cell_index} (execution count {err.exec_count}): "
            f"{err.ename}: {err.evalue}\n  cell source:\n{head}\n"
            + _partly_executed(out_path, " (with the traceback)"))


def ipc_kernel_manager():
    """A jupyter kernel manager that talks to its kernel over local IPC sockets, not TCP on
    localhost: nothing listens on the network, and the kernel does not warn "Kernel is running
    over TCP without encryption" on every notebook. The sockets live in a private temporary
    folder, not in the working directory: two studies run side by side must not pick the same
    ``kernel-ipc-N`` names (their kernels then reject each other's messages: "Invalid Signature").
    (jupyter_client is imported here, lazily.)"""
    import tempfile

    from jupyter_client.manager import AsyncKernelManager
    from traitlets import CaselessStrEnum, default

    class IPCKernelManager(AsyncKernelManager):
        transport = CaselessStrEnum(["tcp", "ipc"], default_value="ipc", config=True)

        @default("ip")
        def _private_ipc_path(self):
            return os.path.join(tempfile.mkdtemp(prefix="studylib-kernel-"), "kernel-ipc")

        async def cleanup_resources(self, restart: bool = False) -> None:
            await super().cleanup_resources(restart=restart)
            if not restart:  # the sockets are gone: the private folder goes too
                try:
                    os.rmdir(os.path.dirname(self.ip))
                except OSError:
                    pass

        async def _async_interrupt_kernel(self) -> None:
            # jupyter_client sends SIGINT before every shutdown request; our notebooks have finished
            # by then, and ipykernel logged "[IPKernelApp] ERROR | KeyboardInterrupt caught in
            # kernel" whenever the signal landed while it handled a message (in `make study`'s
            # output). A timed-out cell is interrupted through interrupt_kernel, as before.
            if not self.shutting_down:
                await super()._async_interrupt_kernel()

    return IPCKernelManager


def execute_notebook(py_path: os.PathLike, out_path: os.PathLike, parameters: dict, cwd: os.PathLike,
                     timeout: Optional[float] = None, progress: bool = True, kernel_manager_class=None) -> float:
    """Convert and execute one notebook; returns seconds. Raises :class:`StudyError` on failure.

    The kernel starts in ``cwd``; the process's own working directory is left alone (papermill's
    ``cwd`` would change it for the whole process, which notebooks executing in other threads
    share). ``kernel_manager_class``: default :func:`ipc_kernel_manager`. Safe to call from
    several threads at once: each thread runs its kernel in its own event loop.

    Papermill saves the notebook after every cell into a private scratch folder; ``out_path``
    gets it whole once it has finished or failed (:func:`_publish`), so a kill or a full disk
    leaves the previous ``out_path``, never a truncated one."""
    import nbformat
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    py_path, out_path = Path(py_path), Path(out_path).resolve()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    nb = to_ipynb(py_path)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="studylib-nb-") as tmp:
        src = Path(tmp) / (py_path.stem + ".ipynb")
        scratch = Path(tmp) / out_path.name  # papermill saves here after every cell; published whole below
        nbformat.write(nb, str(src))
        try:
            # resources.metadata.path: nbclient starts the kernel there
            pm.execute_notebook(str(src), str(scratch), parameters=parameters, kernel_name=KERNEL,
                                resources={"metadata": {"path": str(Path(cwd).resolve())}},
                                progress_bar=progress, execution_timeout=timeout, log_output=False,
                                kernel_manager_class=kernel_manager_class or ipc_kernel_manager())
        except PapermillExecutionError as e:
            where = out_path if _publish(scratch, out_path) else None
            raise StudyError(_failure_message(py_path.name, e, where)) from None
        except Exception as e:  # kernel died, timeout, bad notebook ...
            where = out_path if _publish(scratch, out_path) else None
            raise StudyError(f"notebook {py_path.name} failed: {type(e).__name__}: {e}\n"
                             + _partly_executed(where)) from None
        _publish(scratch, out_path)
    return time.perf_counter() - t0


def _publish(scratch: Path, out_path: Path) -> bool:
    """Write the executed notebook papermill saved at ``scratch`` to ``out_path`` whole
    (:func:`studylib.storage.files.write_atomic`: a kill or a full disk leaves the previous
    ``out_path``; a full disk is one :class:`~studylib.storage.files.DiskFullError` naming it).
    False when papermill saved no readable notebook (``out_path`` is left as it was)."""
    import nbformat

    try:
        nb = nbformat.read(str(scratch), as_version=4)
    except (OSError, ValueError):  # none saved, or torn (its own disk filled): nothing to publish
        return False
    if "papermill" in nb.metadata:
        nb.metadata.papermill["output_path"] = str(out_path)
    write_atomic(out_path, nbformat.writes(nb))
    return True


def _partly_executed(where: Optional[Path], what: str = "") -> str:
    return (f"  the partly executed notebook{what} is {where}" if where is not None
            else "  (papermill saved no executed notebook)")


class Header(NamedTuple):
    """A notebook's ``studylib`` header metadata: ``run_alone`` (a notebook that times things, which
    a second kernel on the same cores would slow down) and ``after`` (the numbers of notebooks whose
    tables it reads: when the same study runs them, it starts once they have finished)."""
    run_alone: bool = False
    after: tuple = ()


def notebook_header(py_path: os.PathLike) -> Header:
    """:class:`Header` from the notebook's Jupytext header (``studylib: {run_alone: true, after:
    ["09"]}``); anything else under ``studylib`` is a :class:`ConfigError` naming the file."""
    import jupytext

    meta = jupytext.read(str(py_path)).metadata.get("studylib", {})
    after = meta.get("after", []) if isinstance(meta, dict) else None
    if not isinstance(meta, dict) or set(meta) - set(Header._fields) \
            or not isinstance(meta.get("run_alone", False), bool) \
            or not isinstance(after, list) or not all(isinstance(a, str) and a.isdigit() for a in after):
        raise ConfigError(f"{py_path}: header metadata studylib: expected {{run_alone: true|false, after: "
                          f"[notebook numbers like \"09\"]}}, got {meta!r}")
    return Header(meta.get("run_alone", False), tuple(after))


class _Kernels:
    """The kernels of the notebooks executing now, by process group, so that Ctrl+C can end them:
    a worker thread waits on its kernel inside its own event loop, and only the kernel's end ends
    that wait early. ``manager_class`` is :func:`ipc_kernel_manager`'s class, recording its kernel
    from start to clean-up."""

    def __init__(self):
        self._lock = threading.Lock()
        self._groups: set = set()
        kernels, base = self, ipc_kernel_manager()

        class TrackedKernelManager(base):
            async def start_kernel(self, **kw):
                await super().start_kernel(**kw)
                self._studylib_pgid = getattr(self.provisioner, "pgid", None)
                kernels._update(add=self._studylib_pgid)

            async def cleanup_resources(self, restart: bool = False) -> None:
                if not restart:
                    kernels._update(discard=getattr(self, "_studylib_pgid", None))
                await super().cleanup_resources(restart=restart)

        self.manager_class = TrackedKernelManager

    def _update(self, add=None, discard=None) -> None:
        with self._lock:
            if add:
                self._groups.add(add)
            self._groups.discard(discard)

    def stop(self) -> None:
        """SIGTERM to each running kernel's process group (the kernel and what it started)."""
        with self._lock:
            groups = sorted(self._groups)
        for pgid in groups:
            try:
                os.killpg(pgid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass


def _may_start(alone: bool, running_alone: Sequence[bool], notebook_jobs: int) -> bool:
    """Whether the next notebook (``alone``: it runs alone) may start beside the running ones."""
    if not running_alone:
        return True
    return len(running_alone) < notebook_jobs and not alone and not any(running_alone)


def executed_stem(py: Path, parameters: Mapping[str, Any]) -> str:
    """The name (no suffix) of notebook ``py`` executed with ``parameters``: its own stem, plus
    ``-NAME=VALUE`` for each parameter other than those every notebook has (params, jobs, and
    seeds and overrides, which name the output folder instead), so that ``-p model X`` writes beside
    the default run, not over it."""
    extra = [(k, v) for k, v in parameters.items() if k not in COMMON_PARAMETERS and v is not None]
    tail = "".join(f"-{k}={re.sub(r'[^A-Za-z0-9_.+-]+', '_', str(v))}" for k, v in extra)
    return py.stem + tail


def execute_all(nbs: Sequence[Path], nb_out: Path, parameters: dict, root: Path, timeout, progress,
                 echo, t_start: float, notebook_jobs: int = 1, headers: Optional[Mapping[Path, Header]] = None) -> dict:
    """Execute ``nbs`` into ``nb_out`` (``parameters``: ``{notebook: its parameters}``; the file
    names: :func:`executed_stem`), at most
    ``notebook_jobs`` at a time, each from a worker thread, started in file order; a notebook whose
    header (``headers[notebook]``, default :func:`notebook_header`) says ``run_alone`` waits for the
    running ones to finish and runs with nothing beside it, one that names notebooks ``after``
    starts once those of ``nbs`` have finished. After a failure nothing new starts; once the running ones have
    finished, the first failure in file order is raised. ``{executed stem: seconds}`` in file order."""
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    from studylib.study.orchestration.watch import RunWatcher

    headers = dict(headers) if headers is not None else {py: notebook_header(py) for py in nbs}
    alone = {py: headers[py].run_alone for py in nbs}
    needs = {py: {q for q in nbs if q.name.split("_")[0] in headers[py].after} for py in nbs}
    finished: set = set()
    stems = {py: executed_stem(py, parameters[py]) for py in nbs}
    bar = progress and notebook_jobs == 1  # interleaved progress bars are unreadable
    n, todo = len(nbs), list(enumerate(nbs, 1))
    times: dict = {}
    failed: dict = {}  # file position -> StudyError
    running: dict = {}  # future -> (file position, notebook)
    kernels = _Kernels()
    pool = ThreadPoolExecutor(max_workers=notebook_jobs, thread_name_prefix="studylib-notebook")
    try:
        with RunWatcher(nb_out.parent / "runs", echo, tty=progress and sys.stderr.isatty()):  # runs, step, ETA
            while running or (todo and not failed):
                while todo and not failed and needs[todo[0][1]] <= finished and _may_start(
                        alone[todo[0][1]], [alone[py] for _, py in running.values()], notebook_jobs):
                    i, py = todo.pop(0)
                    echo(f"[{i}/{n}] {py.name} ..." + (" (alone)" if alone[py] and notebook_jobs > 1 else ""))
                    fut = pool.submit(execute_notebook, py, nb_out / (stems[py] + ".ipynb"), parameters[py], root,
                                      timeout, bar, kernels.manager_class)
                    running[fut] = (i, py)
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in sorted(done, key=lambda f: running[f][0]):
                    i, py = running.pop(fut)
                    try:
                        times[stems[py]] = fut.result()
                        finished.add(py)
                    except Exception as e:  # a StudyError (execute_notebook wraps what fails in papermill)
                        failed[i] = e
                        echo(f"[{i}/{n}] {py.name} failed" + (f"; waiting for {len(running)} running notebook(s) to "
                                                              "finish" if running else ""))
                        continue
                    echo(f"[{i}/{n}] {py.name} done in {times[stems[py]]:.1f} s "
                         f"(total {time.perf_counter() - t_start:.1f} s)")
    except BaseException:  # Ctrl+C (or a bug here): end the kernels, so that their threads end too
        kernels.stop()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    if failed:
        raise failed[min(failed)]
    return {stems[py]: times[stems[py]] for py in nbs}


def environment(name: str, value: Optional[str]):
    """Context manager: ``$name`` set to ``value`` for the block (unchanged when ``value`` is None)."""
    import contextlib

    @contextlib.contextmanager
    def scoped():
        old = os.environ.get(name)
        os.environ[name] = value
        try:
            yield
        finally:
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old

    return scoped() if value is not None else contextlib.nullcontext()
