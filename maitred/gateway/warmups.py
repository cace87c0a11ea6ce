"""Sending warmups: a program's prompt prefilled on its worker before it asks (``LiveDriver`` part).

Which warmups to send is the core's decision (``RuntimeCore``); this part keeps the prompts they
replay (each program's last prompt, a handoff's ``expected_prompt``) and sends them to the
workers, off the request path, each a task a real request of its program overtakes.
"""

import asyncio
import logging
from collections.abc import Callable, Mapping

from maitred.gateway.backend import WorkerBackend
from maitred.gateway.metrics import Metrics
from maitred.gateway.prompt_keep import Prompt, PromptKeep, prompt_bytes
from maitred.gateway.sglang.client import WorkerError
from maitred.gateway.usage import PromptSize
from maitred.runtime.core import RuntimeCore
from maitred.runtime.decisions import Warmup
from maitred.runtime.state import RuntimeState

log = logging.getLogger("maitred.service")


class WarmupSender:
    """The prompts kept for warmups and the warmups in flight (a mixin of ``LiveDriver``)."""

    backends: Mapping[str, WorkerBackend]
    metrics: Metrics
    state: RuntimeState
    core: RuntimeCore
    warm_prompts: PromptKeep
    _handoff_prompts: dict[str, str]
    _warming: dict[str, asyncio.Task[None]]
    kick: Callable[[], None]
    priority_for: Callable[[str, str], int | None]

    def remember_prompt(self, program_id: str, prompt: Prompt, size: PromptSize | None = None) -> None:
        """The last prompt of a program: what a warmup replays (chat messages are rendered by the
        worker's own chat template, ``/v1/tokenize``, when the warmup is sent). Kept only when a
        warmup can use it (warmups on, and a policy that proposes them), and within
        ``LiveConfig.prompts``: a program whose prompt is too large, or was evicted to make room,
        gets no warmup (the core is told, so its warmups take no slot)."""
        if not self.core.warms:
            return
        for dropped in self.warm_prompts.put(program_id, prompt, prompt_bytes(prompt, size)):
            self.core.prompt_dropped(dropped)
        if program_id in self.warm_prompts:
            self.core.prompt_seen(program_id)

    def forget_prompt(self, program_id: str) -> None:
        """The request whose prompt was kept was refused (by the worker, or the client left):
        its prompt is not one the worker holds, so no warmup replays it."""
        if self.warm_prompts.pop(program_id):
            self.core.prompt_dropped(program_id)

    def _start_warmup(self, warmup: Warmup) -> None:
        """A handoff's consumer is warmed with the prompt the handoff said it will send
        (``expected_prompt``, LOCAL's API); other warmups replay the program's last prompt.
        The policy admits only warmups whose prompt is held here (``Prompts.sendable``)."""
        prompt: Prompt | None = (
            self._handoff_prompts.get(warmup.program_id) if warmup.kind == "handoff" else self.warm_prompts.get(warmup.program_id)
        )
        if prompt is None or warmup.worker not in self.backends:
            self.metrics.warmups.labels("skipped").inc()
            return
        self.core.warming(warmup.program_id, True)
        self._warming[warmup.program_id] = asyncio.create_task(self._warm(warmup, prompt))

    async def _warm(self, warmup: Warmup, prompt: Prompt) -> None:
        worker = self.state.workers[warmup.worker]
        backend = self.backends[warmup.worker]
        worker.warmups_in_flight += 1
        outcome = "failed"
        try:
            if isinstance(prompt, tuple):  # chat: rendered by the worker's own template
                messages, tools = prompt
                prompt = await backend.tokenize(messages, tools=tools)
            await backend.warmup(prompt, priority=self.priority_for(warmup.program_id, warmup.worker))
            outcome = "done"
            if warmup.kind == "handoff":
                self._handoff_prompts.pop(warmup.program_id, None)
                self.core.handoff_warmed(warmup.program_id)
            elif warmup.kind == "load_back" and self.state.programs.get(warmup.program_id) is not None:
                self.kick()
        except asyncio.CancelledError:
            outcome = "overtaken"
            raise
        except WorkerError as exc:
            log.info("maitred: warmup of %s on %s failed: %s", warmup.program_id, warmup.worker, exc)
        finally:
            worker.warmups_in_flight -= 1
            self.core.warming(warmup.program_id, False)
            self.metrics.warmups.labels(outcome).inc()
            if self._warming.get(warmup.program_id) is asyncio.current_task():
                del self._warming[warmup.program_id]
