"""``@maitred.tool`` and ``maitred.tool_call``: tool start/end events around the user's code.

The wrapper must be invisible: same return value, same exception object (re-raised with a bare
``raise`` so the tool's own frames stay in the traceback), same name, docstring and signature
(``functools.wraps``), and the same kind of callable (an ``async def`` stays a coroutine
function, a generator stays a generator) so frameworks that introspect it — LangChain's ``@tool``
schema inference above all — see the original. Everything the wrapper itself does is guarded:
a telemetry failure is logged at debug level and never reaches the tool's caller.
"""

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, overload

from maitred.events import ToolEnd, ToolProgress, ToolStart
from maitred.middleware.config import emit, new_id
from maitred.middleware.context import scope

log = logging.getLogger("maitred")
F = TypeVar("F", bound=Callable[..., Any])
_UNITS = {"s": 1.0, "ms": 1e-3}
Status = Literal["ok", "error", "timeout", "interrupted"]


def _status_of(exc: BaseException) -> Status:
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt, GeneratorExit)):
        return "interrupted"
    return "error"


@dataclass(frozen=True, slots=True)
class _Spec:
    """What the decorator knows before any call; ``deadline_pos`` is where to find the deadline
    among positional arguments (precomputed so a call does not pay for ``Signature.bind``)."""

    name: str
    timeout: float | None
    signature: str | None
    background: bool
    deadline_arg: str | None
    deadline_pos: int | None
    deadline_default: Any
    deadline_scale: float

    def deadline(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> float | None:
        if self.deadline_arg is None:
            return self.timeout
        if self.deadline_arg in kwargs:
            value = kwargs[self.deadline_arg]
        elif self.deadline_pos is not None and self.deadline_pos < len(args):
            value = args[self.deadline_pos]
        else:
            value = self.deadline_default
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return value * self.deadline_scale
        return self.timeout


class ToolCall:
    """One open tool call. ``progress`` reports how far along it is, or when it expects to end."""

    __slots__ = ("call_id", "tool", "program_id", "agent", "started")

    def __init__(self, tool: str, *, deadline_s: float | None, signature: str | None, background: bool) -> None:
        current = scope()
        self.call_id = new_id()
        self.tool = tool
        self.program_id = current.program_id
        self.agent = current.agent
        self.started = time.time()
        emit(
            ToolStart(
                ts=self.started,
                program_id=self.program_id,
                agent=self.agent,
                call_id=self.call_id,
                tool=tool,
                signature=signature,
                deadline_s=deadline_s,
                background=background,
            )
        )

    def progress(self, fraction: float | None = None, eta_s: float | None = None) -> None:
        try:
            emit(
                ToolProgress(
                    ts=time.time(),
                    program_id=self.program_id,
                    agent=self.agent,
                    call_id=self.call_id,
                    fraction=fraction,
                    eta_s=eta_s,
                )
            )
        except Exception:
            log.debug("maitred: progress not recorded", exc_info=True)

    def end(self, status: Status = "ok") -> None:
        now = time.time()
        emit(
            ToolEnd(
                ts=now,
                program_id=self.program_id,
                agent=self.agent,
                call_id=self.call_id,
                status=status,
                duration_s=now - self.started,
            )
        )


def _open(spec: _Spec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ToolCall | None:
    try:
        return ToolCall(spec.name, deadline_s=spec.deadline(args, kwargs), signature=spec.signature, background=spec.background)
    except Exception:
        log.debug("maitred: tool.start not recorded", exc_info=True)
        return None


def _close(call: ToolCall | None, status: Status) -> None:
    if call is None:
        return
    try:
        call.end(status)
    except Exception:
        log.debug("maitred: tool.end not recorded", exc_info=True)


def _wrap(fn: Callable[..., Any], spec: _Spec) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        async def agen_wrapper(*args: Any, **kwargs: Any) -> Any:
            call = _open(spec, args, kwargs)
            status: Status = "ok"
            inner = fn(*args, **kwargs)
            try:
                item = await inner.__anext__()
                while True:
                    try:
                        sent = yield item
                    except GeneratorExit:
                        status = "interrupted"
                        raise
                    except BaseException as exc:
                        item = await inner.athrow(exc)
                    else:
                        item = await inner.asend(sent)
            except StopAsyncIteration:
                pass
            except BaseException as exc:
                if status == "ok":
                    status = _status_of(exc)
                raise
            finally:
                if status != "ok":
                    await inner.aclose()
                _close(call, status)

        return agen_wrapper

    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def gen_wrapper(*args: Any, **kwargs: Any) -> Any:
            call = _open(spec, args, kwargs)
            try:
                result = yield from fn(*args, **kwargs)
            except BaseException as exc:
                _close(call, _status_of(exc))
                raise
            _close(call, "ok")
            return result

        return gen_wrapper

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            call = _open(spec, args, kwargs)
            try:
                result = await fn(*args, **kwargs)
            except BaseException as exc:
                _close(call, _status_of(exc))
                raise
            _close(call, "ok")
            return result

        return async_wrapper

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        call = _open(spec, args, kwargs)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            _close(call, _status_of(exc))
            raise
        _close(call, "ok")
        return result

    return wrapper


def _spec(
    fn: Callable[..., Any],
    name: str | None,
    timeout: float | None,
    signature: str | None,
    background: bool,
    deadline_arg: str | None,
    deadline_unit: str,
) -> _Spec:
    if deadline_unit not in _UNITS:
        raise ValueError(f"deadline_unit must be one of {sorted(_UNITS)}, got {deadline_unit!r}")
    if timeout is not None and timeout <= 0:
        raise ValueError(f"timeout must be positive seconds, got {timeout!r}")
    position, default = None, None
    if deadline_arg is not None:
        params = inspect.signature(fn).parameters
        if deadline_arg not in params:
            raise ValueError(f"deadline_arg {deadline_arg!r} is not a parameter of {fn.__qualname__}")
        param = params[deadline_arg]
        if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            position = list(params).index(deadline_arg)
        default = None if param.default is param.empty else param.default
    return _Spec(
        name=name or fn.__name__,
        timeout=timeout,
        signature=signature,
        background=background,
        deadline_arg=deadline_arg,
        deadline_pos=position,
        deadline_default=default,
        deadline_scale=_UNITS[deadline_unit],
    )


@overload
def tool(fn: F, /) -> F: ...
@overload
def tool(
    *,
    name: str | None = None,
    timeout: float | None = None,
    signature: str | None = None,
    background: bool = False,
    deadline_arg: str | None = None,
    deadline_unit: str = "s",
) -> Callable[[F], F]: ...
def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    timeout: float | None = None,
    signature: str | None = None,
    background: bool = False,
    deadline_arg: str | None = None,
    deadline_unit: str = "s",
) -> Any:
    """Record each call of a tool function as ``tool.start`` / ``tool.end``.

    ``timeout`` is the declared deadline in seconds. For tools whose deadline is an argument of
    each call (Claude Code's ``bash(command, timeout=120000)``), ``deadline_arg="timeout",
    deadline_unit="ms"`` reads it from the call, falling back to ``timeout``.
    """

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        return _wrap(f, _spec(f, name, timeout, signature, background, deadline_arg, deadline_unit))

    return decorate(fn) if fn is not None else decorate


class tool_call:
    """The decorator's twin for a block of code: ``with maitred.tool_call("bash", timeout=30) as c``.

    Works with ``with`` and ``async with``; ``c.progress(fraction=..., eta_s=...)`` reports progress.
    """

    def __init__(
        self, name: str, *, timeout: float | None = None, signature: str | None = None, background: bool = False
    ) -> None:
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be positive seconds, got {timeout!r}")
        self.name, self.timeout, self.signature, self.background = name, timeout, signature, background
        self.call: ToolCall | None = None

    def __enter__(self) -> "tool_call":
        try:
            self.call = ToolCall(self.name, deadline_s=self.timeout, signature=self.signature, background=self.background)
        except Exception:
            log.debug("maitred: tool.start not recorded", exc_info=True)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        _close(self.call, "ok" if exc is None else _status_of(exc))

    async def __aenter__(self) -> "tool_call":
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        self.__exit__(exc_type, exc, tb)

    @property
    def call_id(self) -> str | None:
        return self.call.call_id if self.call else None

    def progress(self, fraction: float | None = None, eta_s: float | None = None) -> None:
        if self.call is not None:
            self.call.progress(fraction=fraction, eta_s=eta_s)
