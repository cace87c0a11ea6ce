"""Starting the processes the benchmarks measure maitred against: child processes that stop
with the ``ExitStack`` they were started in, sglang-router awaited until it lists every worker
healthy, ThunderAgent from a checkout, and the CPU time a process and its children have used
(from ``/proc``, so no extra package is needed).
"""

import os
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

from maitred.harness.background import free_port, wait_http

#: The header sglang-router's ``manual`` policy routes by (its ``x-smg-routing-key``).
ROUTING_KEY_HEADER = "x-smg-routing-key"


def spawn(stack: ExitStack, argv: list[str], cwd: str | None = None) -> subprocess.Popen[bytes]:
    """``argv`` as a child process, terminated (killed after 10 s) when ``stack`` closes."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd)

    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    stack.callback(stop)
    return proc


def router_installed() -> bool:
    """Whether sglang-router can be started; says on stderr once why not."""
    try:
        import sglang_router  # noqa: F401
    except ImportError:
        print("sglang-router is not installed (pip install sglang-router); its columns are left out", file=sys.stderr)
        return False
    return True


def start_router(
    stack: ExitStack, workers: list[str], policy: str = "cache_aware", extra: tuple[str, ...] = ()
) -> tuple[str, subprocess.Popen[bytes]]:
    """sglang-router with ``policy`` in front of ``workers``; returns once its ``GET /workers``
    shows them all healthy (it registers workers in the background)."""
    port = free_port()
    argv = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--policy", policy, "--log-level", "error", *extra, "--worker-urls", *workers]
    proc = spawn(stack, argv)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"sglang-router exited with status {proc.returncode}")
        try:
            listed = httpx.get(url + "/workers", timeout=1).json()
            entries = listed.get("workers", listed) if isinstance(listed, dict) else listed
            healthy = [w for w in entries if isinstance(w, dict) and w.get("is_healthy", w.get("healthy", False))]
            if len(healthy) >= len(workers):
                return url, proc
        except (httpx.HTTPError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"sglang-router did not report all {len(workers)} workers healthy within 60 s")
        time.sleep(0.2)


def start_thunderagent(stack: ExitStack, checkout: Path, python: str, workers: list[str]) -> tuple[str, subprocess.Popen[bytes]]:
    """ThunderAgent (its ``tr`` scheduler, SGLang backends, metrics polled as its README runs
    it) from the checkout ``checkout``, run by ``python`` (an interpreter with its dependencies:
    fastapi, httpx, uvicorn)."""
    if not (checkout / "ThunderAgent" / "__main__.py").is_file():
        raise SystemExit(
            f"--thunderagent {checkout}: no ThunderAgent/__main__.py there (a checkout of ThunderAgent-org/ThunderAgent)"
        )
    port = free_port()
    argv = [python, "-m", "ThunderAgent", "--host", "127.0.0.1", "--port", str(port), "--backend-type", "sglang"]
    argv += ["--backends", ",".join(workers), "--metrics", "--log-level", "warning"]
    proc = spawn(stack, argv, cwd=str(checkout))
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", timeout_s=60, process=proc)
    return url, proc


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
            tree.setdefault(ppid, []).append(int(entry))
    return tree


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds used so far by process ``pid`` and its live descendants."""
    tree, total, todo = _children(), 0.0, [pid]
    tick = os.sysconf("SC_CLK_TCK")
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        except (OSError, IndexError, ValueError):
            continue
        todo.extend(tree.get(p, []))
    return total
