"""LangGraph / LangChain 1.x: tool calls, model calls and handoffs as maitred events (SPEC 8).

Two adapters, for the two ways graphs are built:

- ``MaitredMiddleware``: pass it to ``create_agent(..., middleware=[MaitredMiddleware()])``.
  ``wrap_tool_call`` records each tool call under the model's own ``tool_call_id`` and turns a
  tool result ``Command(graph=Command.PARENT, goto=...)`` (langgraph-swarm's handoff tools, and
  any hand-written one) into ``handoff`` events carrying the shared ``update["messages"]``, one
  per ``Send`` for parallel handoffs. ``wrap_model_call`` records the step and attaches the
  program id to the model request (``extra_body.program_id`` and an ``X-Program-Id`` header), so
  a model served through ``maitred serve`` is scheduled as that program.
- ``MaitredCallbackHandler``: pass it in ``config["callbacks"]`` for graphs not built with
  ``create_agent`` and for langgraph-supervisor, whose agents (``create_react_agent``) take no
  middleware. Its handoffs reach callbacks only as the handoff tool's ``Command``, and the
  hand-back to the supervisor has no tool call at all, so it also watches which agent runs
  (``graph_agent``): a change of agent that no handoff announced is recorded as one.

Use one or the other on a graph, not both: each records the same tool calls.

The program is ``config["metadata"]["program_id"]``, else the ``thread_id``, else the one given
to the adapter, else the enclosing ``maitred.program``; the agent is the ``lc_agent_name``
LangGraph puts in the config metadata (``create_agent(name=...)``), else the top-level node of
a multi-agent graph the run is in. Telemetry never reaches the
agent: every recording step is guarded, and the tool's result or exception passes through as is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal
from uuid import UUID

from langchain.agents.middleware import AgentMiddleware, ModelRequest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage, convert_to_openai_messages
from langchain_core.outputs import LLMResult
from langchain_core.runnables.config import var_child_runnable_config
from langgraph.errors import GraphBubbleUp
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command, Send

from maitred.events import Handoff, LLMEnd, LLMStart, ProgramEnd, ProgramStart, ToolEnd, ToolStart
from maitred.identity import PROGRAM_HEADER
from maitred.middleware.config import emit, new_id
from maitred.middleware.context import scope
from maitred.middleware.handoff import context_hash

__all__ = [
    "FRAMEWORK",
    "PROGRAM_HEADER",
    "MaitredCallbackHandler",
    "MaitredMiddleware",
    "graph_agent",
    "handoff_targets",
    "program_and_agent",
    "shared_messages",
]

log = logging.getLogger("maitred")


_NOTHING: Mapping[str, Any] = {}


# -- where a call belongs ---------------------------------------------------------------------


def program_and_agent(
    config: Mapping[str, Any] | None, program_id: str | None = None, agent: str | None = None
) -> tuple[str, str | None]:
    """(program id, agent) of a run from its ``RunnableConfig`` (metadata, then configurable).
    The enclosing ``maitred.program`` is looked up only when the config and the fallbacks leave
    a gap: this runs on every tool and model call."""
    metadata: Mapping[str, Any] = (config.get("metadata") or _NOTHING) if config else _NOTHING
    found = metadata.get("program_id")
    if not found:
        configurable: Mapping[str, Any] = (config.get("configurable") or _NOTHING) if config else _NOTHING
        found = configurable.get("thread_id") or metadata.get("thread_id") or program_id
    name = graph_agent(metadata) or agent
    if found and name:
        return str(found), name
    current = scope()
    return str(found or current.program_id), name or current.agent


def graph_agent(metadata: Mapping[str, Any]) -> str | None:
    """The agent a run belongs to: ``lc_agent_name`` (``create_agent(name=...)``), else, for a
    run inside a subgraph, the top-level node holding it (``create_react_agent`` sets no name;
    in a multi-agent graph each top-level node is an agent). Top-level nodes of a single agent
    (``model``, ``tools``) are not agents, so a run at depth one has none."""
    name = metadata.get("lc_agent_name")
    if name:
        return str(name)
    namespace = metadata.get("langgraph_checkpoint_ns")
    if isinstance(namespace, str) and "|" in namespace:
        return namespace.split("|", 1)[0].split(":", 1)[0] or None
    return None


def shared_messages(value: Any) -> list[dict[str, Any]] | None:
    """The ``messages`` of a state update or ``Send`` argument, in OpenAI chat form."""
    if isinstance(value, Mapping):
        messages = value.get("messages")
    elif isinstance(value, (list, tuple)):  # an update given as (key, value) pairs
        messages = (
            next((v for k, v in value if k == "messages"), None)
            if all(isinstance(p, tuple) and len(p) == 2 for p in value)
            else None
        )
    else:
        messages = None
    if not messages:
        return None
    return [dict(m) for m in convert_to_openai_messages(list(messages))]


def handoff_targets(result: Any) -> list[tuple[str, list[dict[str, Any]] | None]]:
    """(destination agent, shared messages) for each handoff a tool result asks the parent graph
    for: ``Command(graph=Command.PARENT, goto="b", update={"messages": ...})`` or, for parallel
    handoffs, ``goto=[Send("b", {...}), ...]`` each with its own messages."""
    if not isinstance(result, Command) or result.graph != Command.PARENT:
        return []
    goto = result.goto if isinstance(result.goto, (list, tuple)) else [result.goto]
    update_messages = None
    targets: list[tuple[str, list[dict[str, Any]] | None]] = []
    for target in goto:
        if isinstance(target, Send):
            targets.append((target.node, shared_messages(target.arg)))
        elif isinstance(target, str):
            if update_messages is None:
                update_messages = shared_messages(result.update)
            targets.append((target, update_messages))
    return targets


# -- recording (guarded: telemetry never raises into the agent) -------------------------------


def _guarded(what: str, fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception:
        log.debug("maitred: %s not recorded", what, exc_info=True)


def _tool_status(result: Any) -> str:
    return "error" if isinstance(result, ToolMessage) and result.status == "error" else "ok"


def _exc_status(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timeout"
    return "error" if isinstance(exc, Exception) else "interrupted"


#: ``program.start``'s ``framework`` for programs these adapters open.
FRAMEWORK = "langgraph"


def _top_level(config: Mapping[str, Any] | None) -> bool:
    """Whether a node runs in the graph that was invoked, not in a subgraph of it: LangGraph
    nests checkpoint namespaces with ``|`` (``alice:<id>|tools:<id>``)."""
    metadata: Mapping[str, Any] = (config.get("metadata") or _NOTHING) if config else _NOTHING
    return "|" not in str(metadata.get("langgraph_checkpoint_ns") or "")


def _run_status(error: BaseException | None) -> Literal["ok", "error", "cancelled"]:
    """``program.end``'s status for a run that ended with ``error``. An interrupt (``GraphBubbleUp``:
    ``interrupt()``, a ``Command`` to a parent) is how a graph pauses, not a failure."""
    if error is None or isinstance(error, GraphBubbleUp):
        return "ok"
    return "error" if isinstance(error, Exception) else "cancelled"


def _start_program(program_id: str, agent: str | None) -> None:
    emit(ProgramStart(ts=time.time(), program_id=program_id, agent=agent, framework=FRAMEWORK))


def _end_program(program_id: str, agent: str | None, error: BaseException | None = None) -> None:
    emit(ProgramEnd(ts=time.time(), program_id=program_id, agent=agent, status=_run_status(error)))


def _emit_handoffs(program_id: str, agent: str | None, targets: list[tuple[str, list[dict[str, Any]] | None]]) -> None:
    now = time.time()
    for to_agent, messages in targets:
        emit(
            Handoff(
                ts=now,
                program_id=program_id,
                agent=agent,
                from_agent=agent or "main",
                to_agent=to_agent,
                messages=messages,
                context_hash=context_hash(messages) if messages else None,
            )
        )


def _usage(message: Any) -> tuple[int, int, int | None]:
    """(prompt, completion, cached) tokens from an ``AIMessage.usage_metadata``."""
    usage = getattr(message, "usage_metadata", None) or {}
    details = usage.get("input_token_details") or {}
    return int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0), details.get("cache_read")


def _model_name(model: Any) -> str | None:
    """Read from the instance's fields, not with ``getattr``: a chat model without the
    attribute makes pydantic raise and catch an AttributeError, ~10 µs on every step."""
    fields = getattr(model, "__dict__", None) or {}
    name = fields.get("model_name") or fields.get("model")
    if name is None and "bound" in fields:  # a RunnableBinding (model.bind(...)): the model it wraps
        return _model_name(fields["bound"])
    return name if isinstance(name, str) else None


#: An open tool call of the middleware: (program id, agent, call id, start time).
_ToolCall = tuple[str, str | None, str, float]
#: An open model call of the middleware: (program id, agent, request id).
_ModelCall = tuple[str, str | None, str]

# The hooks below run on every tool and model call of the agent, so they are written flat: no
# objects or closures per call, one ``try`` each instead of ``_guarded``.


def _open_tool(request: ToolCallRequest, program_id: str | None, agent: str | None) -> _ToolCall | None:
    """``tool.start``, under the model's own ``tool_call_id``; None when it was not recorded."""
    try:
        program_id, agent = program_and_agent(getattr(request.runtime, "config", None), program_id, agent)
        call = request.tool_call
        call_id = call.get("id") or new_id()
        now = time.time()
        emit(ToolStart(ts=now, program_id=program_id, agent=agent, call_id=call_id, tool=call["name"]))
        return program_id, agent, call_id, now
    except Exception:
        log.debug("maitred: tool.start not recorded", exc_info=True)
        return None


def _close_tool(call: _ToolCall | None, *, result: Any = None, failure: BaseException | None = None) -> None:
    """``tool.end`` (and the handoffs a ``Command`` result asks for) for the sync and async hooks
    alike; never raises into the agent."""
    if call is None:
        return
    try:
        program_id, agent, call_id, started = call
        status = _exc_status(failure) if failure is not None else _tool_status(result)
        now = time.time()
        emit(
            ToolEnd(
                ts=now,
                program_id=program_id,
                agent=agent,
                call_id=call_id,
                status=status,  # type: ignore[arg-type]
                duration_s=now - started,
            )
        )
        if isinstance(result, Command):
            targets = handoff_targets(result)
            if targets:
                _emit_handoffs(program_id, agent, targets)
    except Exception:
        log.debug("maitred: tool.end not recorded", exc_info=True)


def _tagged(request: ModelRequest, program_id: str) -> ModelRequest:
    """The request carrying the program id, as ``extra_body.program_id`` and ``x-program-id``.

    What ``request.override(model_settings=...)`` makes, for a fraction of its cost:
    ``override`` is ``dataclasses.replace``, which reads every field and runs
    ``ModelRequest.__init__`` again (about 10 µs of each agent step). A ``ModelRequest`` is a
    plain dataclass whose state is its instance dict, so a copy of that dict is the same new
    request. Subclasses, which may keep state elsewhere, get ``override``."""
    settings = request.model_settings
    body, headers = settings.get("extra_body"), settings.get("extra_headers")
    settings = {
        **settings,
        "extra_body": {**body, "program_id": program_id} if body else {"program_id": program_id},
        "extra_headers": {**headers, PROGRAM_HEADER: program_id} if headers else {PROGRAM_HEADER: program_id},
    }
    if type(request) is not ModelRequest:
        return request.override(model_settings=settings)
    copy = object.__new__(ModelRequest)
    state = copy.__dict__
    state.update(request.__dict__)
    state["model_settings"] = settings
    return copy


def _close_model(call: _ModelCall | None, response: Any, status: str = "ok") -> None:
    """``llm.end`` with the token counts of the response's ``AIMessage``; never raises into the agent."""
    if call is None:
        return
    try:
        message = response if isinstance(response, AIMessage) else None
        if message is None:
            for item in getattr(response, "result", None) or ():
                if isinstance(item, AIMessage):
                    message = item
                    break
        prompt, completion, cached = _usage(message)
        program_id, agent, request_id = call
        emit(
            LLMEnd(
                ts=time.time(),
                program_id=program_id,
                agent=agent,
                request_id=request_id,
                prompt_tokens=prompt,
                completion_tokens=completion,
                cached_tokens=cached,
                status=status,  # type: ignore[arg-type]
            )
        )
    except Exception:
        log.debug("maitred: llm.end not recorded", exc_info=True)


class MaitredMiddleware(AgentMiddleware):
    """``create_agent`` middleware recording the run, tool calls, model calls and handoffs (sync and async).

    The agent invoked as the graph (``agent.invoke``, ``ainvoke``, ``stream``, ``astream``) is
    the program's run: ``before_agent`` opens it (``program.start``, framework ``langgraph``),
    ``after_agent`` ends it (``program.end`` ok), and an exception leaving the model or tool
    node ends it with status error (listed first, this middleware is the outermost wrapper, so
    what leaves it leaves the node). A thread invoked again starts the program again. An agent
    running as a subgraph (a swarm member) cannot see where the outer run ends: give that
    graph a ``MaitredCallbackHandler(record_calls=False)`` to end its programs.

    ``program_id`` and ``agent`` are fallbacks for runs whose config names neither.
    ``record_model_calls=False`` leaves the steps to the maitred gateway when every model
    request goes through it (it records them itself); the program id is attached either way.
    ``tag_requests=False`` attaches nothing, for chat models whose client refuses the
    ``extra_body`` / ``extra_headers`` keywords (the OpenAI and Anthropic clients take both).
    """

    def __init__(
        self,
        *,
        program_id: str | None = None,
        agent: str | None = None,
        record_model_calls: bool = True,
        tag_requests: bool = True,
    ) -> None:
        super().__init__()
        self.program_id = program_id
        self.agent = agent
        self.record_model_calls = record_model_calls
        self.tag_requests = tag_requests
        #: The last model seen and its name: an agent asks the same model step after step.
        self._named: tuple[Any, str | None] = (None, None)
        #: Programs whose run this middleware opened and has not ended yet.
        self._running: set[str] = set()

    # the run: the agent invoked as the graph, not as a subgraph of a bigger one

    def _run_started(self) -> None:
        try:
            config = var_child_runnable_config.get()
            if not _top_level(config):
                return
            program_id, agent = program_and_agent(config, self.program_id, self.agent)
            self._running.add(program_id)
            _start_program(program_id, agent)
        except Exception:
            log.debug("maitred: program.start not recorded", exc_info=True)

    def _run_ended(self, config: Mapping[str, Any] | None, error: BaseException | None = None) -> None:
        """``program.end`` for the run ``config`` belongs to, once; an exception passing through a
        subgraph's node is the subgraph's business, not the run's end."""
        try:
            if not _top_level(config):
                return
            program_id, agent = program_and_agent(config, self.program_id, self.agent)
            if program_id in self._running:
                self._running.discard(program_id)
                _end_program(program_id, agent, error)
        except Exception:
            log.debug("maitred: program.end not recorded", exc_info=True)

    def before_agent(self, state: Any, runtime: Any) -> None:
        self._run_started()

    async def abefore_agent(self, state: Any, runtime: Any) -> None:
        self._run_started()

    def after_agent(self, state: Any, runtime: Any) -> None:
        self._run_ended(var_child_runnable_config.get())

    async def aafter_agent(self, state: Any, runtime: Any) -> None:
        self._run_ended(var_child_runnable_config.get())

    def wrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], ToolMessage | Command]
    ) -> ToolMessage | Command:
        call = _open_tool(request, self.program_id, self.agent)
        try:
            result = handler(request)
        except BaseException as exc:
            _close_tool(call, failure=exc)
            self._run_ended(getattr(request.runtime, "config", None), exc)
            raise
        _close_tool(call, result=result)
        return result

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command]],
    ) -> ToolMessage | Command:
        call = _open_tool(request, self.program_id, self.agent)
        try:
            result = await handler(request)
        except BaseException as exc:
            _close_tool(call, failure=exc)
            self._run_ended(getattr(request.runtime, "config", None), exc)
            raise
        _close_tool(call, result=result)
        return result

    def _open_model(self, request: ModelRequest) -> tuple[_ModelCall | None, ModelRequest]:
        """The request to send (tagged unless ``tag_requests`` is off) and, when recording, the
        open call after its ``llm.start``. A request that could not be tagged goes as it came,
        and one whose ``llm.start`` was not recorded still goes tagged: the gateway schedules by
        the tag."""
        try:
            # What ``langgraph.config.get_config`` reads, without its raise outside a run.
            program_id, agent = program_and_agent(var_child_runnable_config.get(), self.program_id, self.agent)
            tagged = _tagged(request, program_id) if self.tag_requests else request
        except Exception:
            log.debug("maitred: model call not tagged", exc_info=True)
            return None, request
        if not self.record_model_calls:
            return None, tagged
        try:
            model, name = self._named
            if model is not request.model:
                model, name = self._named = request.model, _model_name(request.model)
            request_id = new_id()
            emit(LLMStart(ts=time.time(), program_id=program_id, agent=agent, request_id=request_id, model=name))
            return (program_id, agent, request_id), tagged
        except Exception:
            log.debug("maitred: llm.start not recorded", exc_info=True)
            return None, tagged

    def wrap_model_call(self, request: ModelRequest, handler: Callable[[ModelRequest], Any]) -> Any:
        call, tagged = self._open_model(request)
        try:
            response = handler(tagged)
        except BaseException as exc:
            _close_model(call, None, "error")
            self._run_ended(var_child_runnable_config.get(), exc)
            raise
        _close_model(call, response)
        return response

    async def awrap_model_call(self, request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[Any]]) -> Any:
        call, tagged = self._open_model(request)
        try:
            response = await handler(tagged)
        except BaseException as exc:
            _close_model(call, None, "error")
            self._run_ended(var_child_runnable_config.get(), exc)
            raise
        _close_model(call, response)
        return response


class MaitredCallbackHandler(BaseCallbackHandler):
    """LangChain callbacks recording tool calls, model calls and handoffs of any graph.

    Handoffs come from the handoff tool's ``Command`` (``on_tool_end``'s output) and, for the
    hand-backs that have no tool call (langgraph-supervisor returning to its supervisor), from
    the change of ``lc_agent_name`` between runs of one program. The root run (the graph's
    ``invoke``, ``ainvoke``, ``stream`` or ``astream``) is the program's run: ``program.start``
    (framework ``langgraph``) when it starts, ``program.end`` when it ends (status error when it
    raised; the exception reaches the caller as it is), naming the agent that ran last; a
    thread invoked again starts the program again. ``record_calls=False`` records only the
    runs, beside a ``MaitredMiddleware`` that records the calls. Runs inline (it only queues
    events), so async graphs do not pay for a thread hop per callback.
    """

    run_inline = True

    def __init__(self, *, program_id: str | None = None, agent: str | None = None, record_calls: bool = True) -> None:
        super().__init__()
        self.program_id = program_id
        self.agent = agent
        self.record_calls = record_calls
        self._tools: dict[UUID, tuple[str, str | None, str, float]] = {}
        self._models: dict[UUID, tuple[str, str | None]] = {}
        #: Per program: the agent that ran last, and handoff destinations not yet entered.
        self._last_agent: dict[str, str] = {}
        self._announced: dict[str, list[str]] = {}
        #: Root runs: their program, and the agent that ran last in them.
        self._roots: dict[UUID, str] = {}
        self._run_agent: dict[str, str | None] = {}

    def _where(self, metadata: Mapping[str, Any] | None) -> tuple[str, str | None]:
        return program_and_agent({"metadata": metadata or {}}, self.program_id, self.agent)

    # tools

    def on_tool_start(
        self, serialized: dict[str, Any], input_str: str, *, run_id: UUID, metadata: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if not self.record_calls:
            return

        def record() -> None:
            program_id, agent = self._where(metadata)
            call_id = kwargs.get("tool_call_id") or str(run_id)
            tool = kwargs.get("name") or (serialized or {}).get("name") or "tool"
            now = time.time()
            self._tools[run_id] = (program_id, agent, call_id, now)
            emit(ToolStart(ts=now, program_id=program_id, agent=agent, call_id=call_id, tool=tool))

        _guarded("tool.start", record)

    def _tool_done(self, run_id: UUID, status: str, output: Any = None) -> None:
        opened = self._tools.pop(run_id, None)
        if opened is None:
            return
        program_id, agent, call_id, started = opened
        now = time.time()
        emit(ToolEnd(ts=now, program_id=program_id, agent=agent, call_id=call_id, status=status, duration_s=now - started))  # type: ignore[arg-type]
        targets = handoff_targets(output)
        if targets:
            self._announced.setdefault(program_id, []).extend(t for t, _ in targets)
            _emit_handoffs(program_id, agent, targets)

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        _guarded("tool.end", lambda: self._tool_done(run_id, _tool_status(output), output))

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        _guarded("tool.end", lambda: self._tool_done(run_id, _exc_status(error)))

    # model calls

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not self.record_calls:
            return

        def record() -> None:
            program_id, agent = self._where(metadata)
            self._models[run_id] = (program_id, agent)
            model = (metadata or {}).get("ls_model_name")
            emit(
                LLMStart(
                    ts=time.time(),
                    program_id=program_id,
                    agent=agent,
                    request_id=str(run_id),
                    model=model if isinstance(model, str) else None,
                )
            )

        _guarded("llm.start", record)

    def _model_done(self, run_id: UUID, response: LLMResult | None, status: str) -> None:
        opened = self._models.pop(run_id, None)
        if opened is None:
            return
        program_id, agent = opened
        message = None
        if response is not None and response.generations and response.generations[0]:
            message = getattr(response.generations[0][0], "message", None)
        prompt, completion, cached = _usage(message)
        emit(
            LLMEnd(
                ts=time.time(),
                program_id=program_id,
                agent=agent,
                request_id=str(run_id),
                prompt_tokens=prompt,
                completion_tokens=completion,
                cached_tokens=cached,
                status=status,  # type: ignore[arg-type]
            )
        )

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        _guarded("llm.end", lambda: self._model_done(run_id, response, "ok"))

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        _guarded("llm.end", lambda: self._model_done(run_id, None, "error"))

    # agent transitions

    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        _guarded("run", lambda: self._entered(run_id, parent_run_id, metadata, inputs))

    def _entered(self, run_id: UUID, parent_run_id: UUID | None, metadata: dict[str, Any] | None, inputs: Any) -> None:
        program_id, named = self._where(metadata)
        if parent_run_id is None:
            self._roots[run_id] = program_id
            self._run_agent[program_id] = named
            _start_program(program_id, named)
        agent = graph_agent(metadata or {})
        if not agent:
            return
        self._run_agent[program_id] = agent
        last = self._last_agent.get(program_id)
        self._last_agent[program_id] = agent
        if last is None or last == agent or not self.record_calls:
            return
        announced = self._announced.get(program_id) or []
        if agent in announced:  # the handoff tool already recorded this one
            announced.remove(agent)
            return
        _emit_handoffs(program_id, last, [(agent, shared_messages(inputs))])

    def _run_done(self, run_id: UUID, error: BaseException | None) -> None:
        program_id = self._roots.pop(run_id, None)
        if program_id is None:
            return
        # The graph run is over: end its program and forget its transitions.
        self._last_agent.pop(program_id, None)
        self._announced.pop(program_id, None)
        _end_program(program_id, self._run_agent.pop(program_id, None), error)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        _guarded("program.end", lambda: self._run_done(run_id, None))

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        _guarded("program.end", lambda: self._run_done(run_id, error))
