import json
import time

import pytest

from maitred.events import (
    EVENT_TYPES,
    EventError,
    Handoff,
    LLMEnd,
    ToolEnd,
    ToolStart,
    check_event,
    decode_batch,
    decode_event,
    dumps_batch,
    encode_event,
    loads_batch,
    to_otel_attributes,
)

NOW = 1_800_000_000.0

EXAMPLES = [
    {"type": "program.start", "ts": NOW, "program_id": "p", "agent": "planner", "framework": "langgraph", "attrs": {"k": 1}},
    {"type": "program.end", "ts": NOW, "program_id": "p", "status": "error"},
    {"type": "llm.start", "ts": NOW, "program_id": "p", "request_id": "r1", "model": "m", "prompt_tokens": 10},
    {
        "type": "llm.end",
        "ts": NOW,
        "program_id": "p",
        "request_id": "r1",
        "prompt_tokens": 10,
        "cached_tokens": 8,
        "completion_tokens": 3,
        "worker": "http://w:30000",
        "ttft_s": 0.05,
        "status": "ok",
    },
    {
        "type": "tool.start",
        "ts": NOW,
        "program_id": "p",
        "call_id": "c1",
        "tool": "Bash",
        "signature": "Bash:pytest",
        "deadline_s": 120.0,
        "background": True,
    },
    {"type": "tool.progress", "ts": NOW, "program_id": "p", "call_id": "c1", "fraction": 0.5, "eta_s": 3.0},
    {"type": "tool.end", "ts": NOW, "program_id": "p", "call_id": "c1", "status": "timeout", "duration_s": 120.0},
    {
        "type": "handoff",
        "ts": NOW,
        "program_id": "p",
        "from_agent": "a",
        "to_agent": "b",
        "child_program_id": "c",
        "messages": [{"role": "user", "content": "x"}],
        "expected_prompt": "You are b.",
    },
    {"type": "program.wait", "ts": NOW, "program_id": "p", "reason": "Stop"},
    {"type": "program.resume", "ts": NOW, "program_id": "p"},
    {"type": "adapter.publish", "ts": NOW, "program_id": "p", "adapter": "lora-a", "version": "7"},
]


def test_every_event_type_has_an_example_that_round_trips():
    assert {e["type"] for e in EXAMPLES} == set(EVENT_TYPES)
    for data in EXAMPLES:
        event = decode_event(data, now=NOW)
        wire = encode_event(event)
        assert wire["v"] == 1
        assert {k: v for k, v in wire.items() if k != "v"} == {k: v for k, v in data.items()}
        assert decode_event(wire, now=NOW) == event


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"type": "tool.start", "ts": NOW, "program_id": "p", "tool": "grep"}, "call_id", "Field required"),
        ({"type": "tool.start", "ts": NOW, "program_id": "p", "call_id": 5, "tool": "grep"}, "call_id", "string"),
        ({"type": "tool.start", "ts": "soon", "program_id": "p", "call_id": "c", "tool": "grep"}, "ts", "number"),
        ({"type": "tool.explode", "ts": NOW, "program_id": "p"}, "type", "unknown event type 'tool.explode'"),
        ({"ts": NOW, "program_id": "p"}, "type", "missing"),
        ({"type": "program.end", "ts": NOW, "program_id": "x" * 10_240}, "program_id", "at most 256"),
        ({"type": "program.end", "ts": NOW + 3600, "program_id": "p"}, "ts", "in the future"),
        ({"type": "program.end", "ts": NOW, "program_id": "p", "status": "exploded"}, "status", "'ok', 'error'"),
        (
            {"type": "tool.progress", "ts": NOW, "program_id": "p", "call_id": "c", "fraction": 1.5},
            "fraction",
            "less than or equal to 1",
        ),
        (
            {"type": "tool.end", "ts": NOW, "program_id": "p", "call_id": "c", "durations": 1.0},
            "durations",
            "unknown field (in tool.end)",
        ),
        ({"type": "program.end", "ts": NOW, "program_id": "p", "v": 2}, "v", "unsupported schema version"),
        ("not an object", "event", "expected a JSON object"),
    ],
)
def test_bad_event_names_the_field(data, field, words):
    with pytest.raises(EventError) as info:
        decode_event(data, now=NOW)
    assert info.value.field == field
    assert words in str(info.value)
    assert str(info.value).startswith(f"{field}:")


def test_one_bad_event_does_not_drop_the_good_ones_beside_it():
    items = [
        EXAMPLES[4],
        {"type": "nope", "ts": NOW, "program_id": "p"},
        EXAMPLES[6],
        {"type": "tool.end", "ts": NOW, "program_id": "p" * 300, "call_id": "c"},
    ]
    batch = decode_batch(items, now=NOW)
    assert [e.TYPE for e in batch.events] == ["tool.start", "tool.end"]
    assert [(r.index, r.field) for r in batch.rejected] == [(1, "type"), (3, "program_id")]
    assert batch.rejected[0].message().startswith("event[1].type: unknown event type")


def test_batches_decode_from_json_array_and_ndjson_alike():
    events = [decode_event(e, now=NOW) for e in EXAMPLES]
    from_array = loads_batch(dumps_batch(events), now=NOW)
    from_ndjson = loads_batch(dumps_batch(events, ndjson=True).encode(), now=NOW)
    assert from_array.events == from_ndjson.events == events
    assert not from_array.rejected and not from_ndjson.rejected


def test_ndjson_line_that_is_not_json_is_reported_by_position():
    body = "\n".join([json.dumps(EXAMPLES[1]), "{broken", json.dumps(EXAMPLES[9])])
    batch = loads_batch(body, now=NOW)
    assert len(batch.events) == 2
    assert [(r.index, r.field) for r in batch.rejected] == [(1, "line")]


def test_a_body_that_is_not_json_at_all_is_an_error():
    with pytest.raises(EventError, match="body: invalid JSON array"):
        loads_batch("[{", now=NOW)


def test_ts_defaults_to_the_real_clock():
    assert decode_event({"type": "program.end", "ts": time.time(), "program_id": "p"}).status == "ok"


def test_otel_attributes_use_genai_names():
    tool = ToolStart(ts=NOW, program_id="p", agent="coder", call_id="c1", tool="grep", deadline_s=5.0)
    attrs = to_otel_attributes(tool)
    assert attrs["gen_ai.conversation.id"] == "p"
    assert attrs["gen_ai.agent.name"] == "coder"
    assert attrs["gen_ai.tool.name"] == "grep"
    assert attrs["gen_ai.tool.call.id"] == "c1"
    assert attrs["maitred.deadline_s"] == 5.0
    assert attrs["maitred.event.type"] == "tool.start"
    llm = to_otel_attributes(LLMEnd(ts=NOW, program_id="p", request_id="r", prompt_tokens=7, completion_tokens=2))
    assert llm["gen_ai.usage.input_tokens"] == 7 and llm["gen_ai.usage.output_tokens"] == 2
    handoff = to_otel_attributes(Handoff(ts=NOW, program_id="p", from_agent="a", to_agent="b", messages=[{"x": 1}]))
    assert "maitred.messages" not in handoff and handoff["maitred.to_agent"] == "b"
    assert to_otel_attributes(ToolEnd(ts=NOW, program_id="p", call_id="c"))["maitred.status"] == "ok"


def _deep(levels: int) -> dict:
    root: dict = {}
    node = root
    for _ in range(levels - 1):
        node["k"] = {}
        node = node["k"]
    return root


UNSTORABLE = [
    # integers beyond what a 64-bit column holds
    (
        {"type": "llm.end", "ts": NOW, "program_id": "p", "request_id": "r", "prompt_tokens": 10**20, "completion_tokens": 1},
        "prompt_tokens",
        "less than or equal to 9223372036854775807",
    ),
    (
        {"type": "handoff", "ts": NOW, "program_id": "p", "from_agent": "a", "to_agent": "b", "context_tokens": 2**63},
        "context_tokens",
        "less than or equal to",
    ),
    ({"type": "program.start", "ts": NOW, "program_id": "p", "attrs": {"n": [1, -(2**64)]}}, "attrs.n.1", "64-bit"),
    # NUL bytes, in a top-level string and deep inside free-form JSON (keys too)
    ({"type": "tool.start", "ts": NOW, "program_id": "p", "call_id": "c", "tool": "grep\x00"}, "tool", "NUL byte"),
    ({"type": "program.wait", "ts": NOW, "program_id": "p", "reason": "\x00"}, "reason", "NUL byte"),
    (
        {
            "type": "handoff",
            "ts": NOW,
            "program_id": "p",
            "from_agent": "a",
            "to_agent": "b",
            "messages": [{"role": "user", "content": [{"text": "a\x00b"}]}],
        },
        "messages.0.content.0.text",
        "NUL byte",
    ),
    ({"type": "program.start", "ts": NOW, "program_id": "p", "attrs": {"a\x00": 1}}, "attrs", "key contains a NUL"),
    (
        {"type": "handoff", "ts": NOW, "program_id": "p", "from_agent": "a", "to_agent": "b", "expected_prompt": "x\x00"},
        "expected_prompt",
        "NUL byte",
    ),
    # lone surrogates (what bytes that are not UTF-8 become)
    ({"type": "program.start", "ts": NOW, "program_id": "p", "attrs": {"s": "\ud800"}}, "attrs.s", "not valid UTF-8"),
    # nesting and size of free-form JSON
    ({"type": "program.start", "ts": NOW, "program_id": "p", "attrs": _deep(300)}, "attrs.k.k", "deeper than 32"),
    (
        {"type": "program.start", "ts": NOW, "program_id": "p", "attrs": {"blob": "x" * 70_000}},
        "attrs",
        "more than the 65536 allowed",
    ),
    (
        {
            "type": "handoff",
            "ts": NOW,
            "program_id": "p",
            "from_agent": "a",
            "to_agent": "b",
            "messages": [{"content": "x" * (9 << 20)}],
        },
        "messages",
        "more than the 8388608 allowed",
    ),
    # numbers JSON cannot hold
    ({"type": "tool.end", "ts": NOW, "program_id": "p", "call_id": "c", "duration_s": float("inf")}, "duration_s", "finite"),
    ({"type": "program.start", "ts": NOW, "program_id": "p", "attrs": {"x": float("nan")}}, "attrs.x", "not a finite number"),
]


@pytest.mark.parametrize(("data", "field", "words"), UNSTORABLE)
def test_what_the_store_cannot_hold_is_refused_naming_the_field(data, field, words):
    with pytest.raises(EventError) as info:
        decode_event(data, now=NOW)
    assert info.value.field.startswith(field)
    assert words in str(info.value)


def test_free_form_json_within_the_limits_is_accepted():
    attrs = {"nested": _deep(31), "big": 2**63 - 1, "small": -(2**63), "text": "héllo ✓", "list": [1.5, None, True]}
    assert decode_event({"type": "program.start", "ts": NOW, "program_id": "p", "attrs": attrs}, now=NOW).attrs == attrs


def test_an_ndjson_line_nested_past_the_parser_is_rejected_alone():
    good = [json.dumps(EXAMPLES[1]), json.dumps(EXAMPLES[9])]
    body = "\n".join([good[0], "[" * 100_000 + "]" * 100_000, "{" * 100_000, good[1], "9" * 5000])
    batch = loads_batch(body.encode(), now=NOW)
    assert [e.TYPE for e in batch.events] == ["program.end", "program.resume"]
    assert [(r.index, r.field) for r in batch.rejected] == [(1, "line"), (2, "line"), (4, "line")]
    assert "nested too deeply" in batch.rejected[0].reason


def test_a_json_array_with_one_pathological_element_keeps_the_others():
    elements = [json.dumps(EXAMPLES[1]), "[" * 100_000 + "]" * 100_000, json.dumps(EXAMPLES[9]), "{broken}"]
    batch = loads_batch("[" + ",".join(elements) + "]", now=NOW)
    assert [e.TYPE for e in batch.events] == ["program.end", "program.resume"]
    assert [(r.index, r.field) for r in batch.rejected] == [(1, "element"), (3, "element")]
    with pytest.raises(EventError, match="body: invalid JSON array: text after"):
        loads_batch("[1] [2]", now=NOW)


def test_bytes_that_are_not_utf8_reject_their_line_alone():
    good = json.dumps(EXAMPLES[1]).encode()
    bad = b'{"type": "program.end", "ts": 1800000000.0, "program_id": "\xff\xfe"}'
    batch = loads_batch(b"\n".join([good, bad, good.replace(b'"p"', b'"q"')]), now=NOW)
    assert [e.program_id for e in batch.events] == ["p", "q"]
    assert [(r.index, r.field) for r in batch.rejected] == [(1, "program_id")]


def test_ndjson_splits_on_newlines_only_and_takes_a_pretty_printed_object():
    data = dict(EXAMPLES[8], reason="line\u2028separator\x1cinside")
    assert loads_batch(json.dumps(data, ensure_ascii=False), now=NOW).events[0].reason == data["reason"]
    assert loads_batch(json.dumps(EXAMPLES[8], indent=2), now=NOW).events[0].reason == "Stop"


@pytest.mark.parametrize(("data", "field", "words"), UNSTORABLE)
def test_events_built_in_process_are_checked_like_their_wire_form(data, field, words):
    body = {k: v for k, v in data.items() if k != "type"}
    event = EVENT_TYPES[data["type"]](**body)
    with pytest.raises(EventError) as in_process:
        check_event(event, now=NOW)
    with pytest.raises(EventError) as wire:
        decode_event(data, now=NOW)
    assert in_process.value.field == wire.value.field and words in str(in_process.value)
    for example in EXAMPLES:
        check_event(decode_event(example, now=NOW), now=NOW)


@pytest.mark.timeout(30)  # a guard: scanning used to be quadratic in the escaped quotes of an unterminated string
def test_an_unterminated_string_full_of_escaped_quotes_is_refused_in_linear_time():
    with pytest.raises(EventError, match="body: invalid JSON array: its brackets never close"):
        loads_batch('[{"a": 1}, "' + '\\"' * 1_000_000, now=NOW)
