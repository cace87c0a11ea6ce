"""maitred's runtime policy as a router component inside NVIDIA Dynamo.

Shaped like Dynamo's own ``dynamo.thunderagent_router``: the workers register their endpoint
for topology only (under a model name clients do not use), this component registers the
public model name with Dynamo's frontend, and the frontend (``--router-mode round-robin``)
sends every request to it, already tokenized. For each turn the component

- reads the program from ``agent_context.session_id`` (the ``x-dynamo-session-id`` header;
  Dynamo's frontend passes no other header through and refuses unknown body fields, so
  ``X-Program-Id`` and body ``program_id`` do not reach it), and ends the program on
  ``x-dynamo-session-final`` without calling a worker;
- waits for admission in maitred's live driver (``LiveDriver.admit``: admitted at once when the
  program fits, held otherwise, forced after the bounded wait); every rule (admission,
  holding, placement, GPU/host tiering) is ``maitred.runtime``'s, as in ``maitred serve``;
- pins the request to the worker the core chose with Dynamo's routing field
  ``routing.backend_instance_id``, through Dynamo's ``KvRouter`` (which still books the request
  in its load and KV-overlap accounting, kept from the workers' KV events);
- feeds the usage of the stream's last chunk (prompt, completion and cached tokens, and
  whether it finished) back into the core as the step's ``llm.end``.

Worker capacity comes from each instance's model deployment card (``kv_cache_block_size`` x
``total_kv_blocks``, plus a native host-offloading pool where the card has one); load from the
KV router (``get_potential_loads``: active requests and decode blocks per instance).

What Dynamo exposes for eviction priority, and what the component does with it: Dynamo's
SGLang worker reads ``routing.priority`` and passes it to SGLang as the request priority, which
``--radix-eviction-policy priority`` keeps cached prefixes by; with ``--priority`` the component
puts the core's encoding there (``RuntimeCore.priority_for``, ratchet-aware, as ``maitred
serve --priority`` does for SGLang directly). Dynamo 1.6's ``RoutingHints`` declares
``priority_jump`` and ``strict_priority`` (the KV router's own queue order, used only with
``--router-queue-threshold``) but no eviction field, so whether ``routing.priority`` survives
the KV router's hop is not tested here (no SGLang worker on the test machine), and the mocker
and vLLM workers have no priority eviction at all. Dynamo has no call that pins, demotes or
evicts one program's KV; the core's tier moves therefore act through admission and placement
only, as they do for SGLang.

Tool events: the component serves maitred's own ``POST /v1/events`` (``--http-port``), so
agents instrumented with maitred's middleware (``maitred.configure(runtime_url=...)``) send tool
starts and ends exactly as to ``maitred serve``; idleness and readiness then work as there.
Dynamo's agent-tracing tool events (``DYN_REQUEST_TRACE_TOOL_EVENTS_ZMQ_ENDPOINT``) are bound
by the frontend and land in its trace sink (JSONL files), not on the event plane a router can
subscribe to, so the component does not read them; without maitred's events a program is
reasoning between its turns and ``acting`` is unknown (ThunderAgent's view).

Not done here: pre-prefill warmups (Dynamo's KV router has no prefill-only request; the
driver runs with warmups off), a history store (``--db``), and data-parallel ranks within one
instance (a pin names the instance; the KV router picks the rank).

Run it: ``python -m maitred.gateway.dynamo --endpoint dyn://dynamo.backend.generate
--model-name NAME --model-path DIR`` (flags in ``args``; docs/dynamo.md has the whole stack).
Dynamo is an optional extra: ``pip install 'maitred[dynamo]'`` and ``pip install --no-deps
ai-dynamo``.
"""
