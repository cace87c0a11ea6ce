"""Where batches of events go: the session store, or a running maitred runtime over HTTP.

A sink's ``send`` raises on failure; the emitter owns retries, backoff and drop accounting.
``PermanentSinkError`` marks a batch that can never succeed (the runtime rejected it), so the
emitter drops it instead of retrying forever.
"""

from collections.abc import Sequence
from typing import Protocol

import httpx

from maitred.events import Event, dumps_batch


class PermanentSinkError(Exception):
    """The batch was refused for what it contains; retrying it cannot help."""


class Sink(Protocol):
    def send(self, events: Sequence[Event]) -> None: ...

    def close(self) -> None: ...


class StoreSink:
    """Writes through ``SessionStore``; the store (and its migrations) open on the first batch,
    in the emitter's thread, so configuring never touches the database in the caller's thread."""

    def __init__(self, db_url: str) -> None:
        self.db_url = db_url
        self._store = None

    def send(self, events: Sequence[Event]) -> None:
        if self._store is None:
            from maitred.storage import SessionStore

            self._store = SessionStore(self.db_url, connect_timeout_s=3.0)
        self._store.write(events)

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

    def send(self, events: Sequence[Event]) -> None:
        response = self._client.post(self.url, content=dumps_batch(events))
        if response.status_code in (400, 413, 422):
            raise PermanentSinkError(f"{self.url} refused the batch: {response.status_code} {response.text[:300]}")
        response.raise_for_status()

    def close(self) -> None:
        self._client.close()
