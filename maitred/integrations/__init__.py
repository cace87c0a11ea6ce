"""Framework integrations: one line in the framework a user already runs (SPEC section 8).

Each module imports its framework itself, and only when used, so ``import maitred`` never pulls in
LangGraph, LiteLLM or the OpenAI Agents SDK, and the Claude Code command hook starts fast:

- ``maitred.integrations.claude_code``: Claude Code hooks (``http`` and ``command``).
- ``maitred.integrations.langgraph``: ``MaitredMiddleware`` and ``MaitredCallbackHandler``.
- ``maitred.integrations.openai_agents``: ``MaitredTracingProcessor`` and ``MaitredRunHooks``.
- ``maitred.integrations.litellm``: ``MaitredLogger`` for the LiteLLM proxy.
- ``maitred.integrations.otel``: ``MaitredSpanProcessor`` for OpenTelemetry spans (OpenInference,
  OpenLLMetry, GenAI conventions); ``otel_spans`` is its span mapping, which imports no
  OpenTelemetry and is shared with the gateway's OTLP receiver.
"""
