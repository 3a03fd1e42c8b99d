"""Whether a Dask scheduler answers at an address (:func:`probe_scheduler`), asked before a
:class:`studylib.study.orchestration.cluster.Cluster` connects to it: distributed's own connect
waits forever on a server that accepts the connection and never speaks Dask's protocol, so an
address where no scheduler answers within :data:`SCHEDULER_TIMEOUT_S` is one
:class:`~studylib.study.orchestration.common.ClusterError` line, not a wait."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from studylib.study.orchestration.common import ClusterError

#: How long a ``--scheduler`` address has to answer as a Dask scheduler (distributed's own connect
#: waits forever on a server that accepts the connection and never speaks Dask's protocol).
SCHEDULER_TIMEOUT_S = 20.0


def probe_scheduler(address: str, timeout: float = SCHEDULER_TIMEOUT_S) -> None:
    """A ClusterError unless a Dask scheduler answers at ``address`` (its ``identity``) within
    ``timeout`` seconds. On its own event loop in a helper thread (a notebook's kernel runs one in
    this thread)."""
    from distributed.comm import connect

    async def identity():
        comm = await connect(address, timeout=timeout)
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()

    async def bounded():
        return await asyncio.wait_for(identity(), timeout + 2)

    start = (f"start one with `dask scheduler` and workers with `dask worker {address} --nthreads 1`, or "
             f"point --scheduler / $STUDYLIB_SCHEDULER / study.scheduler at it")
    with ThreadPoolExecutor(1, thread_name_prefix="studylib-probe") as pool:
        try:
            reply = pool.submit(asyncio.run, bounded()).result()
        except (TimeoutError, asyncio.TimeoutError):
            raise ClusterError(f"scheduler {address}: no Dask scheduler answered within {timeout:.0f} s (something "
                               f"else listens there?); {start}") from None
        except (OSError, ValueError, TypeError) as e:  # refused, unreachable, a malformed address or reply
            raise ClusterError(f"scheduler {address}: cannot connect ({one_line(e)}); {start}") from None
    if not isinstance(reply, dict) or reply.get("type") != "Scheduler":
        raise ClusterError(f"scheduler {address}: what answers there is not a Dask scheduler; {start}")


def one_line(e: BaseException, n: int = 200) -> str:
    """``Type: message`` of ``e`` on one line, at most ``n`` characters of the message."""
    return f"{type(e).__name__}: {' '.join(str(e).split())[:n]}"


__all__ = ["SCHEDULER_TIMEOUT_S", "probe_scheduler", "one_line"]
