"""``maitred.program`` and ``maitred.agent``: scopes that say which program (and role) runs."""

import asyncio
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import Token
from typing import Any, Literal

from maitred.events import ProgramEnd, ProgramStart
from maitred.middleware.config import emit
from maitred.middleware.context import Scope, current_scope, scope


class program:
    """Marks a program (one agent session): ``program.start`` on entry, ``program.end`` on exit.

    Usable with ``with`` and ``async with``. A program opened inside another records the outer one
    as its parent (a subagent). The exit status is ``error`` when an exception leaves the block
    and ``cancelled`` for cancellation; the exception itself passes through untouched.
    """

    def __init__(
        self,
        program_id: str | None = None,
        *,
        agent: str | None = None,
        framework: str | None = None,
        parent_program_id: str | None = None,
        attrs: dict[str, Any] | None = None,
    ) -> None:
        self.program_id = program_id or uuid.uuid4().hex
        self.agent = agent
        self.framework = framework
        self.parent_program_id = parent_program_id
        self.attrs = attrs
        self._token: Token[Scope | None] | None = None

    def __enter__(self) -> "program":
        outer = current_scope.get()
        parent = self.parent_program_id
        if parent is None and outer is not None and outer.program_id != self.program_id:
            parent = outer.program_id
        emit(
            ProgramStart(
                ts=time.time(),
                program_id=self.program_id,
                agent=self.agent,
                parent_program_id=parent,
                framework=self.framework,
                attrs=self.attrs,
            )
        )
        self._token = current_scope.set(Scope(self.program_id, self.agent))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if self._token is not None:
            current_scope.reset(self._token)
        status: Literal["ok", "error", "cancelled"] = "ok"
        if exc_type is not None:
            status = "cancelled" if issubclass(exc_type, (asyncio.CancelledError, KeyboardInterrupt)) else "error"
        emit(ProgramEnd(ts=time.time(), program_id=self.program_id, agent=self.agent, status=status))

    async def __aenter__(self) -> "program":
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        self.__exit__(exc_type, exc, tb)


@contextmanager
def agent(name: str) -> Iterator[None]:
    """Attribute what runs inside to agent ``name`` of the current program (e.g. after a handoff)."""
    token = current_scope.set(Scope(scope().program_id, name))
    try:
        yield
    finally:
        current_scope.reset(token)
