"""Property tests of ``loads_batch``, the parser every untrusted batch goes through.

For bodies mixing good events with bad lines of every kind hypothesis can make (text that is
not JSON, JSON that is not an event, events with one bad field, 100,000 nested brackets, bytes
that are not UTF-8, integers of thousands of digits), in NDJSON and JSON-array form:
``loads_batch`` raises nothing but ``EventError``; every good event is decoded exactly once, in
order; every bad line is rejected by its position; and the good events written to a real
SQLite store are stored exactly once.
"""

import json
import time
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from maitred.events import EVENT_TYPES, EventError, decode_event, encode_event, loads_batch
from maitred.storage import SessionStore

NOW = time.time()
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# -- good events -----------------------------------------------------------------------------------

TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)
ID = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=40)
TOKENS = st.integers(0, 2**63 - 1)
SECONDS = st.floats(0, 1e6, allow_nan=False, allow_infinity=False)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)
REQUIRED: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "program.start": {},
    "program.end": {},
    "program.wait": {},
    "program.resume": {},
    "llm.start": {"request_id": ID},
    "llm.end": {"request_id": ID, "prompt_tokens": TOKENS, "completion_tokens": TOKENS},
    "tool.start": {"call_id": ID, "tool": ID},
    "tool.progress": {"call_id": ID},
    "tool.end": {"call_id": ID},
    "handoff": {"from_agent": ID, "to_agent": ID},
    "adapter.publish": {"adapter": ID, "version": ID},
}
OPTIONAL: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "program.start": {"framework": TEXT, "attrs": st.dictionaries(TEXT, JSON, max_size=4)},
    "program.end": {"status": st.sampled_from(["ok", "error", "cancelled"])},
    "llm.start": {"model": TEXT, "prompt_tokens": TOKENS},
    "llm.end": {"cached_tokens": TOKENS, "worker": TEXT, "ttft_s": SECONDS},
    "tool.start": {"signature": ID, "deadline_s": st.floats(0.001, 1e6), "background": st.booleans()},
    "tool.progress": {"fraction": st.floats(0, 1), "eta_s": SECONDS},
    "tool.end": {"status": st.sampled_from(["ok", "error", "timeout", "interrupted"]), "duration_s": SECONDS},
    "handoff": {
        "messages": st.lists(st.dictionaries(TEXT, JSON, max_size=3), max_size=3),
        "context_tokens": TOKENS,
        "expected_prompt": TEXT,
    },
    "program.wait": {"reason": TEXT},
}


@st.composite
def good_event(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(sorted(EVENT_TYPES)))
    data: dict[str, Any] = {"type": kind, "ts": draw(st.floats(1e9, NOW)), "program_id": "placeholder"}
    data.update({name: draw(s) for name, s in REQUIRED[kind].items()})
    for name, s in OPTIONAL.get(kind, {}).items():
        if draw(st.booleans()):
            data[name] = draw(s)
    return data


def numbered(events: list[dict[str, Any]], program_id: str) -> list[dict[str, Any]]:
    """Each good event made distinct (the store keeps identical events once, by design)."""
    return [{**e, "program_id": program_id, "agent": f"agent-{i}"} for i, e in enumerate(events)]


# -- bad lines -------------------------------------------------------------------------------------


def parses_to(text: str | bytes, kind: type) -> bool:
    try:
        return isinstance(json.loads(text), kind)
    except (ValueError, RecursionError):
        return False


NOT_AN_OBJECT = st.text(max_size=60).filter(lambda t: "\n" not in t and t.strip() and not parses_to(t, dict))
MUTATIONS = {
    "unknown type": lambda e: {**e, "type": "tool.explode"},
    "missing program_id": lambda e: {k: v for k, v in e.items() if k != "program_id"},
    "NUL in program_id": lambda e: {**e, "program_id": "p\x00q"},
    "unknown field": lambda e: {**e, "surprise": 1},
    "ts a string": lambda e: {**e, "ts": "soon"},
    "ts in the future": lambda e: {**e, "ts": NOW + 10**6},
    "attrs 300 deep": lambda e: {**e, "type": "program.start", "attrs": json.loads('{"k":' * 300 + "1" + "}" * 300)},
    "tokens beyond 64 bits": lambda e: {**e, "type": "llm.start", "request_id": "r", "prompt_tokens": 10**20},
    "schema version 2": lambda e: {**e, "v": 2},
}


@st.composite
def bad_line(draw: st.DrawFn, program_id: str, *, in_array: bool = False) -> str | bytes:
    """A line no parser should accept as an event. ``in_array``: only what stays one element
    inside a JSON array (balanced brackets, closed strings), so positions can be checked."""
    kinds = ["json", "mutation", "brackets", "digits", "not utf-8"] + ([] if in_array else ["text"])
    kind = draw(st.sampled_from(kinds))
    if kind == "text":
        return draw(NOT_AN_OBJECT)
    if kind == "json":
        return json.dumps(draw(JSON.filter(lambda v: not isinstance(v, dict))))
    event = {**draw(good_event()), "program_id": program_id}
    if kind == "mutation":
        return json.dumps(draw(st.sampled_from(sorted(MUTATIONS.items())))[1](event))
    if kind == "brackets":
        n = draw(st.sampled_from([2_000, 100_000]))
        return draw(st.sampled_from(["[" * n + "]" * n, '{"a":' * n + "1" + "}" * n] + ([] if in_array else ["[" * n])))
    if kind == "digits":
        return json.dumps({**event, "ts": 1}).replace('"ts": 1', '"ts": ' + "9" * 5000)
    return json.dumps({**event, "program_id": "@@"}).encode().replace(b"@@", b"\xff\xfe")


# -- the properties --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    with SessionStore(f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'fuzz.db'}") as store:
        yield store


def check_stored_once(store: SessionStore, program_id: str, decoded: list[Any], good: list[dict[str, Any]]) -> None:
    result = store.write(decoded)
    assert (result.stored, result.rejected) == (len(good), [])
    stored = store.events(program_id)
    assert sorted(json.dumps(e, sort_keys=True) for e in stored) == sorted(
        json.dumps(encode_event(e), sort_keys=True) for e in decoded
    )


@SETTINGS
@given(data=st.data(), good=st.lists(good_event(), max_size=8), as_bytes=st.booleans(), crlf=st.booleans())
def test_ndjson_every_good_line_decoded_and_stored_once_every_bad_line_rejected_alone(store, data, good, as_bytes, crlf):
    program_id = f"fuzz-{uuid.uuid4().hex}"
    good = numbered(good, program_id)
    bad = data.draw(st.lists(bad_line(program_id), max_size=6))
    order = data.draw(st.permutations([("good", i) for i in range(len(good))] + [("bad", i) for i in range(len(bad))]))
    lines: list[bytes] = []
    for kind, i in order:
        line = json.dumps(good[i], ensure_ascii=data.draw(st.booleans())) if kind == "good" else bad[i]
        lines.append(line if isinstance(line, bytes) else line.encode("utf-8", "surrogatepass"))
        if data.draw(st.booleans()):
            lines.append(b"   ")  # blank lines are skipped, not counted
    body = (b"\r\n" if crlf else b"\n").join(lines)
    assume(not parses_to(body, list))  # a body that is one JSON array is read as an array, not a line
    try:
        batch = loads_batch(body if as_bytes else body.decode("utf-8", "surrogateescape"), now=NOW)
    except EventError as exc:  # only a body that is one line, an array that never closes
        assert exc.field == "body" and len(order) == 1 and body.strip().startswith(b"[")
        return

    positions = [kind for kind, _ in order]
    assert [r.index for r in batch.rejected] == [p for p, kind in enumerate(positions) if kind == "bad"]
    assert batch.events == [decode_event(good[i], now=NOW) for kind, i in order if kind == "good"]
    check_stored_once(store, program_id, batch.events, good)


@SETTINGS
@given(data=st.data(), good=st.lists(good_event(), max_size=8))
def test_json_array_every_good_element_decoded_and_stored_once_every_bad_one_rejected_alone(store, data, good):
    program_id = f"fuzz-{uuid.uuid4().hex}"
    good = numbered(good, program_id)
    bad = data.draw(st.lists(bad_line(program_id, in_array=True), max_size=5))
    order = data.draw(st.permutations([("good", i) for i in range(len(good))] + [("bad", i) for i in range(len(bad))]))
    elements = [json.dumps(good[i]).encode() if kind == "good" else bad[i] for kind, i in order]
    body = b"[" + b",".join(e if isinstance(e, bytes) else e.encode() for e in elements) + b"]"
    batch = loads_batch(body, now=NOW)

    assert [r.index for r in batch.rejected] == [p for p, (kind, _) in enumerate(order) if kind == "bad"]
    assert batch.events == [decode_event(good[i], now=NOW) for kind, i in order if kind == "good"]
    check_stored_once(store, program_id, batch.events, good)


@SETTINGS
@given(body=st.one_of(st.text(), st.binary(), st.text(alphabet='[]{}",:\\ 0a\n').map(lambda t: "[" + t)))
def test_any_body_whatsoever_gives_a_batch_or_one_event_error(body):
    try:
        batch = loads_batch(body, now=NOW)
    except EventError as exc:
        assert exc.field == "body"
    else:
        assert all(r.index >= 0 for r in batch.rejected)
