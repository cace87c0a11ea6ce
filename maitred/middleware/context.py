"""Which program and agent the current code runs for.

A ``ContextVar`` so that the value follows asyncio tasks and threads started from a copied
context (``asyncio.to_thread``, ``contextvars.copy_context().run``) without any explicit passing.
"""

import os
import socket
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Scope:
    program_id: str
    agent: str | None = None


#: Tool calls made outside any ``maitred.program`` are still recorded, under one program per process.
_process_scope = Scope(program_id=f"process:{socket.gethostname()}:{os.getpid()}")
current_scope: ContextVar[Scope | None] = ContextVar("maitred_scope", default=None)


def scope() -> Scope:
    """The scope in effect, falling back to this process's implicit program."""
    return current_scope.get() or _process_scope


def _reset_process_scope_after_fork() -> None:
    global _process_scope
    _process_scope = Scope(program_id=f"process:{socket.gethostname()}:{os.getpid()}")


os.register_at_fork(after_in_child=_reset_process_scope_after_fork)
