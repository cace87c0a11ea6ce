"""Which body fields of a model request reach the worker.

SGLang reads far more of a request body than the public APIs it speaks define, and some of its
fields are not a client's to set through a shared gateway: ``custom_logit_processor`` runs code
in the worker (with ``--enable-custom-logit-processor``), ``bootstrap_host``/``port``/``room``
make a disaggregated worker open a connection, ``lora_path`` loads adapters, ``session_params``
and ``session_id`` reach another client's session, ``routed_dp_rank``/``data_parallel_rank``
pin a data-parallel rank, ``return_hidden_states`` ships activations back. So each route
forwards an allow-list: the fields of the public API it speaks (OpenAI chat and completions,
OpenAI Responses, Anthropic Messages, SGLang's ``/generate``) plus SGLang's documented sampling
extras (``python/sglang/srt/entrypoints/openai/protocol.py``, ``io_struct.GenerateReqInput``).
Anything else is dropped and named in the answer's ``x-maitred-dropped-fields`` header;
``maitred serve --forward-unknown-fields`` forwards it instead.

``priority`` and ``rid`` are maitred's: the scheduler sets the SGLang priority of a request (a
client's 2**62 would outrank everyone), and request ids are the gateway's. A client that sends
one is refused with 400 naming the field, also with ``--forward-unknown-fields``, so it learns
that the field has no effect rather than finding out later.
"""

from collections.abc import Mapping
from typing import Any

from maitred.gateway.guard import HTTPProblem

#: Fields a client never sets through maitred (see the module docstring).
RESERVED = frozenset({"priority", "rid"})

#: SGLang's documented sampling and decoding extras on its OpenAI routes (``protocol.py``).
_SGLANG_SAMPLING = frozenset(
    {
        "top_k",
        "min_p",
        "min_tokens",
        "repetition_penalty",
        "regex",
        "ebnf",
        "json_schema",
        "stop_token_ids",
        "stop_regex",
        "no_stop_trim",
        "ignore_eos",
        "skip_special_tokens",
        "cache_salt",
    }
)
_OPENAI_CHAT = frozenset(
    {
        "messages",
        "model",
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "max_tokens",
        "metadata",
        "modalities",
        "n",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "prompt_cache_key",
        "reasoning_effort",
        "response_format",
        "safety_identifier",
        "seed",
        "service_tier",
        "stop",
        "store",
        "stream",
        "stream_options",
        "temperature",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "user",
        "verbosity",
        "web_search_options",
        # SGLang's chat-only extras
        "chat_template_kwargs",
        "continue_final_message",
        "separate_reasoning",
        "stream_reasoning",
    }
)
_OPENAI_COMPLETIONS = frozenset(
    {
        "model",
        "prompt",
        "best_of",
        "echo",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "max_tokens",
        "metadata",
        "n",
        "presence_penalty",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "suffix",
        "temperature",
        "top_p",
        "user",
    }
)
_RESPONSES = frozenset(
    {
        "background",
        "conversation",
        "include",
        "input",
        "instructions",
        "max_output_tokens",
        "max_tool_calls",
        "metadata",
        "model",
        "parallel_tool_calls",
        "previous_response_id",
        "prompt",
        "prompt_cache_key",
        "reasoning",
        "safety_identifier",
        "service_tier",
        "store",
        "stream",
        "stream_options",
        "temperature",
        "text",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "truncation",
        "user",
        # SGLang's extras on /v1/responses
        "chat_template_kwargs",
        "frequency_penalty",
        "presence_penalty",
        "stop",
        "top_k",
        "min_p",
        "repetition_penalty",
        "cache_salt",
    }
)
_ANTHROPIC_COUNT = frozenset({"model", "messages", "system", "tools", "tool_choice", "thinking"})
_ANTHROPIC_MESSAGES = _ANTHROPIC_COUNT | frozenset(
    {
        "max_tokens",
        "metadata",
        "stop_sequences",
        "stream",
        "temperature",
        "top_k",
        "top_p",
        "service_tier",
        "container",
        "context_management",
        "mcp_servers",
    }
)
#: SGLang's own ``/generate`` (``GenerateReqInput``): the prompt, sampling and logprob fields;
#: not the multimodal ``*_data`` fields, which name files and URLs the worker would read.
_GENERATE = frozenset(
    {
        "text",
        "input_ids",
        "sampling_params",
        "stream",
        "return_logprob",
        "logprob_start_len",
        "top_logprobs_num",
        "token_ids_logprob",
        "return_text_in_logprobs",
        "model",
    }
)

#: The allow-list of each model route, by its name (``model_routes.ENDPOINTS``).
ALLOWED: Mapping[str, frozenset[str]] = {
    "chat": _OPENAI_CHAT | _SGLANG_SAMPLING,
    "completions": _OPENAI_COMPLETIONS | _SGLANG_SAMPLING,
    "responses": _RESPONSES,
    "messages": _ANTHROPIC_MESSAGES,
    "count_tokens": _ANTHROPIC_COUNT,
    "generate": _GENERATE,
}


def screen_fields(route: str, body: dict[str, Any], *, forward_unknown: bool) -> tuple[str, ...]:
    """Refuse maitred's own fields, drop (in place) what ``route`` does not forward, and return
    the names dropped, sorted (empty: ``body`` is unchanged)."""
    reserved = sorted(RESERVED.intersection(body))
    if reserved:
        raise HTTPProblem(
            400,
            f"{reserved[0]}: set by the maitred gateway, not by clients (the scheduler sets SGLang's "
            "priority and the request id); remove it from the request",
            field=reserved[0],
        )
    if forward_unknown:
        return ()
    allowed = ALLOWED[route]
    dropped = tuple(sorted(name for name in body if name not in allowed))
    for name in dropped:
        del body[name]
    return dropped
