"""What keeps a web page out of a gateway: the ``Host`` it is asked by, and JSON bodies only.

A tokenless gateway on loopback trusts whoever reaches it, and a browser is one way to reach it:
a page the user visits can POST to ``http://127.0.0.1:8000`` (a "simple" cross-site request,
sent without asking: ``text/plain``, form encodings, or no content type at all), and a DNS name
the page's owner re-points to 127.0.0.1 (DNS rebinding) lets it read the answers too. So:

- every ``POST`` must say its body is JSON (``application/json``; ``/v1/events`` also takes
  ``application/x-ndjson``, and the OTLP receiver ``/v1/traces`` ``application/x-protobuf``,
  OTLP/HTTP's binary encoding), which no page can send without a CORS preflight that the gateway
  never grants (none of them is a CORS-safelisted type: only ``text/plain`` and the two form
  encodings are); otherwise 415 naming ``content-type``. maitred's own clients (the middleware's
  HTTP sink, the Claude Code hook and Claude Code's http hooks, the LiteLLM callback) and the
  OpenAI and Anthropic SDKs all send ``application/json``.
- the ``Host`` header must name the gateway: ``maitred serve --allowed-host`` (repeatable), by
  default the bound address and, when bound to loopback, ``localhost``, ``127.0.0.1`` and
  ``::1``; a gateway bound to another address needs a token on every endpoint anyway and by
  default answers any ``Host``. Otherwise 400 naming ``host``. A request without ``Host``
  (HTTP/1.0) is not a browser's and passes.

Both checks read headers only: a pure ASGI wrapper, microseconds per request.
"""

from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from maitred.gateway.guard import error_response

#: Host names a loopback gateway answers to besides the address it is bound to.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
ANY_HOST = "*"
JSON_TYPES = frozenset({"application/json"})
#: Paths that take another body type besides JSON: NDJSON events (``maitred.events.loads_batch``),
#: and OTLP protobuf (``maitred.gateway.otlp_receiver``). Each needs a CORS preflight, as JSON does.
OTHER_TYPES = {"/v1/events": frozenset({"application/x-ndjson"}), "/v1/traces": frozenset({"application/x-protobuf"})}


def host_name(header: str) -> str:
    """The host of a ``Host`` header, without its port or IPv6 brackets, lower case."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


def default_allowed_hosts(bound: str) -> tuple[str, ...]:
    """What a gateway bound to ``bound`` answers to when ``--allowed-host`` is not given."""
    if bound in LOOPBACK_HOSTS or bound.startswith("127."):
        return tuple(dict.fromkeys((bound.strip("[]").lower(), *LOOPBACK_HOSTS)))
    return (ANY_HOST,)


class OriginGuard:
    """Refuses requests by ``Host`` and, for ``POST``, by content type (see the module docstring)."""

    def __init__(self, app: ASGIApp, *, allowed_hosts: Iterable[str]) -> None:
        self.app = app
        hosts = {h.lower().strip("[]") for h in allowed_hosts}
        self.any_host = ANY_HOST in hosts
        self.hosts = frozenset(hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            problem = self._problem(scope)
            if problem is not None:
                status, message, field = problem
                anthropic = scope["path"].startswith("/v1/messages")
                await error_response(status, message, field=field, anthropic=anthropic)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _problem(self, scope: Scope) -> tuple[int, str, str] | None:
        host = content_type = None
        for name, value in scope["headers"]:
            if name == b"host":
                host = value.decode("latin-1")
            elif name == b"content-type":
                content_type = value.decode("latin-1")
        if host is not None and not self.any_host and host_name(host) not in self.hosts:
            return (
                400,
                f"host: {host[:100]!r} is not a name of this gateway (allowed: {', '.join(sorted(self.hosts))}; "
                "maitred serve --allowed-host NAME adds one)",
                "host",
            )
        if scope["method"] == "POST":
            media = (content_type or "").partition(";")[0].strip().lower()
            accepted = JSON_TYPES | OTHER_TYPES.get(scope["path"], frozenset())
            if media not in accepted:
                return (
                    415,
                    f"content-type: expected {' or '.join(sorted(accepted))}, got {(content_type or 'none')[:100]!r}",
                    "content-type",
                )
        return None
