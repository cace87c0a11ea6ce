"""Co-located SGLang: one server per GPU as child processes of ``maitred serve``.

Each server is started with the flags maitred relies on (checked against SGLang's
``python/sglang/srt/server_args.py``):

- ``--enable-metrics``: ``/metrics``, where ``sglang:hicache_host_total_tokens`` gives the host
  KV capacity;
- ``--enable-cache-report``: ``usage.prompt_tokens_details.cached_tokens`` in OpenAI answers,
  the cache feedback the runtime's residency estimate runs on;
- ``--enable-hierarchical-cache --hicache-ratio R``: the host tier (HiCache) that demoted
  programs' KV lives in (SGLang refuses a host pool not larger than the GPU's, so R > 1);
- ``--hicache-write-policy``, as ``maitred.runtime.hicache`` picks it for R: ``write_back``
  below 2, ``write_through`` from 2 on. Write-back copies a block to host memory when it leaves
  the GPU (``mem_cache/hiradix_cache.py``: ``HiRadixCache.evict`` writes back the nodes without
  a host copy), so the host pool holds what the GPU does not and the two tiers keep 1 + R GPUs
  of KV; SGLang's default, write-through, copies every block as it is cached, so the host
  mirrors the GPU and the two keep max(1, R). Write-back's cost: an eviction waits for its
  GPU→host copy (``writing_check(write_back=True)`` blocks the scheduler until it is done),
  which the room it adds pays for only while the host pool is small. maitred sizes its GPU tier
  by what the two keep (``tiering.working_set_capacity``), reading the policy from
  ``/server_info``;
- ``--radix-eviction-policy priority``: eviction follows each request's ``priority`` (without
  ``--enable-priority-scheduling``, which would also reorder and preempt requests).

Each child gets its own session (process group), so stopping it stops the scheduler and
detokenizer processes SGLang forks; on Linux each also gets a parent-death signal, so a
``maitred serve`` killed outright does not leave GPU servers behind.
"""

import ctypes
import logging
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from maitred.bind import wait_http
from maitred.runtime.hicache import write_back_for

log = logging.getLogger("maitred.service")

REQUIRED_FLAGS = (
    "--enable-metrics",
    "--enable-cache-report",
    "--enable-hierarchical-cache",
    "--radix-eviction-policy",
    "priority",
)


def write_policy_for(hicache_ratio: float) -> str:
    """``--hicache-write-policy`` for a host pool of ``hicache_ratio`` GPUs (see the module docstring)."""
    return "write_back" if write_back_for(hicache_ratio) else "write_through"


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    gpu: str
    port: int
    argv: tuple[str, ...]

    @property
    def env(self) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": self.gpu}

    def shell_line(self) -> str:
        return f"CUDA_VISIBLE_DEVICES={shlex.quote(self.gpu)} " + shlex.join(self.argv)


@dataclass(frozen=True)
class SGLangLaunch:
    model_path: str
    gpus: Sequence[str]
    host: str = "127.0.0.1"
    base_port: int = 30000
    hicache_ratio: float = 2.0
    extra_args: Sequence[str] = ()
    python: str = sys.executable

    def __post_init__(self) -> None:
        if not self.gpus:
            raise ValueError("--gpus: give at least one GPU index, e.g. --gpus 0,1")
        if len(set(self.gpus)) != len(self.gpus):
            raise ValueError(f"--gpus: each GPU once, got {','.join(self.gpus)}")
        if not 1 <= self.base_port <= 65535 - len(self.gpus):
            raise ValueError(f"--sglang-base-port: {self.base_port} leaves no room for {len(self.gpus)} ports")
        if not self.hicache_ratio > 1:
            raise ValueError(
                f"--hicache-ratio: SGLang needs a host pool larger than the GPU pool (> 1), got {self.hicache_ratio}"
            )

    @property
    def write_policy(self) -> str:
        return write_policy_for(self.hicache_ratio)

    def specs(self) -> list[LaunchSpec]:
        out = []
        for i, gpu in enumerate(self.gpus):
            port = self.base_port + i
            argv = (
                self.python,
                "-m",
                "sglang.launch_server",
                "--model-path",
                self.model_path,
                "--host",
                self.host,
                "--port",
                str(port),
                *REQUIRED_FLAGS[:3],
                "--hicache-ratio",
                f"{self.hicache_ratio:g}",
                "--hicache-write-policy",
                self.write_policy,
                *REQUIRED_FLAGS[3:],
                *self.extra_args,
            )
            out.append(LaunchSpec(gpu, port, argv))
        return out

    def urls(self) -> list[str]:
        return [f"http://{self.host}:{s.port}" for s in self.specs()]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    os.setsid()
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class ChildServers:
    """The launched servers: started together, healthy together, stopped together."""

    launch: SGLangLaunch
    startup_timeout_s: float = 900.0  # loading weights and capturing CUDA graphs takes minutes
    stop_timeout_s: float = 30.0
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self) -> list[str]:
        try:
            for spec in self.launch.specs():
                log.info("maitred: starting %s", spec.shell_line())
                self.processes.append(subprocess.Popen(spec.argv, env={**os.environ, **spec.env}, preexec_fn=_die_with_parent))
            for proc, url in zip(self.processes, self.launch.urls()):
                wait_http(url + "/health", timeout_s=self.startup_timeout_s, process=proc)
        except BaseException:
            self.stop()
            raise
        return self.launch.urls()

    def stop(self) -> None:
        """SIGTERM to each server's process group, SIGKILL to what is left after the timeout."""
        for proc in self.processes:
            if proc.poll() is None:
                _signal_group(proc, signal.SIGTERM)
        for proc in self.processes:
            try:
                proc.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
            _signal_group(proc, signal.SIGKILL)  # whatever the server forked and left behind
        self.processes.clear()

    def __enter__(self) -> list[str]:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
