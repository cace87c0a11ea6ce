"""Where batches of events go: the session store, or a running maitred runtime over HTTP.

A sink's ``send`` raises on failure (the emitter owns retries, backoff and drop accounting) and
returns how many events it refused for their content, which the emitter counts as dropped.
``PermanentSinkError`` marks a whole batch that can never succeed, so the emitter drops it
instead of retrying forever.
"""

import logging
from collections.abc import Sequence
from typing import Protocol

import httpx

from maitred.events import Event, EventError, decode_event, dumps_batch, encode_event

log = logging.getLogger("maitred")


class PermanentSinkError(Exception):
    """The batch was refused for what it contains; retrying it cannot help."""


class Sink(Protocol):
    def send(self, events: Sequence[Event]) -> int: ...

    def close(self) -> None: ...


def valid_events(events: Sequence[Event]) -> list[Event]:
    """Events built in-process skip validation on the agent's hot path; check them here, on the
    emitter's thread, so one bad value (a 10 KB program id) is refused alone instead of failing
    every retry of the whole batch against the database."""
    valid: list[Event] = []
    for event in events:
        try:
            decode_event(encode_event(event))
        except EventError as exc:
            log.warning("maitred: refused a %s event: %s", event.TYPE, exc)
        else:
            valid.append(event)
    return valid


class StoreSink:
    """Writes through ``SessionStore``; the store (and its migrations) open on the first batch,
    in the emitter's thread, so configuring never touches the database in the caller's thread."""

    def __init__(self, db_url: str) -> None:
        self.db_url = db_url
        self._store = None

    def send(self, events: Sequence[Event]) -> int:
        if self._store is None:
            from maitred.storage import SessionStore

            self._store = SessionStore(self.db_url, connect_timeout_s=3.0)
        valid = valid_events(events)
        self._store.write(valid)
        return len(events) - len(valid)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


class HttpSink:
    """POSTs each batch as a JSON array to ``<runtime_url>/v1/events``."""

    def __init__(self, runtime_url: str, *, token: str | None = None, timeout_s: float = 5.0) -> None:
        self.url = runtime_url.rstrip("/") + "/v1/events"
        headers = {"content-type": "application/json", "user-agent": "maitred-middleware"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        self._client = httpx.Client(headers=headers, timeout=timeout_s)

    def send(self, events: Sequence[Event]) -> int:
        response = self._client.post(self.url, content=dumps_batch(events))
        if response.status_code in (400, 413, 422):
            raise PermanentSinkError(f"{self.url} refused the batch: {response.status_code} {response.text[:300]}")
        response.raise_for_status()
        try:
            rejected = response.json().get("rejected") or []
        except (ValueError, AttributeError):
            return 0
        if rejected:
            log.warning("maitred: the runtime refused %d events, first: %s", len(rejected), rejected[0])
        return len(rejected)

    def close(self) -> None:
        self._client.close()
