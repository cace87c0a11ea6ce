"""``maitred.llm_call``: a model call (one step) for code that talks to a model directly.

Framework integrations emit these themselves; this is for hand-written agent loops, so their
steps (and token counts) reach the store and the replay trace like any other.
"""

import logging
import time
from typing import Any

from maitred.events import LLMEnd, LLMStart
from maitred.middleware.config import emit, new_id
from maitred.middleware.context import scope

log = logging.getLogger("maitred")


class llm_call:
    """``with maitred.llm_call(model="m", prompt_tokens=n) as step: ...; step.finish(...)``."""

    def __init__(self, *, model: str | None = None, prompt_tokens: int | None = None, request_id: str | None = None) -> None:
        self.model = model
        self.request_id = request_id or new_id()
        self.prompt_tokens = prompt_tokens or 0
        self.completion_tokens = 0
        self.cached_tokens: int | None = None
        self.worker: str | None = None
        self.ttft_s: float | None = None
        self._scope = scope()

    def finish(
        self,
        *,
        prompt_tokens: int | None = None,
        completion_tokens: int = 0,
        cached_tokens: int | None = None,
        worker: str | None = None,
        ttft_s: float | None = None,
    ) -> None:
        """Record the usage the model reported; sent when the block exits."""
        if prompt_tokens is not None:
            self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.cached_tokens, self.worker, self.ttft_s = cached_tokens, worker, ttft_s

    def __enter__(self) -> "llm_call":
        try:
            self._scope = scope()
            emit(
                LLMStart(
                    ts=time.time(),
                    program_id=self._scope.program_id,
                    agent=self._scope.agent,
                    request_id=self.request_id,
                    model=self.model,
                    prompt_tokens=self.prompt_tokens or None,
                )
            )
        except Exception:
            log.debug("maitred: llm.start not recorded", exc_info=True)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        try:
            emit(
                LLMEnd(
                    ts=time.time(),
                    program_id=self._scope.program_id,
                    agent=self._scope.agent,
                    request_id=self.request_id,
                    prompt_tokens=self.prompt_tokens,
                    completion_tokens=self.completion_tokens,
                    cached_tokens=self.cached_tokens,
                    worker=self.worker,
                    ttft_s=self.ttft_s,
                    status="ok" if exc is None else "error",
                )
            )
        except Exception:
            log.debug("maitred: llm.end not recorded", exc_info=True)

    async def __aenter__(self) -> "llm_call":
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        self.__exit__(exc_type, exc, tb)
