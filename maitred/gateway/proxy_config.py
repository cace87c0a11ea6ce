"""The proxy's settings (``maitred serve --max-body-mb``, ``--request-timeout`` and the like).

Apart from the proxy itself so that what reads them (the streams it passes through, the app,
``maitred serve``) need not import the whole proxy.
"""

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    max_body_bytes: int = 32 << 20  # parsing one holds the interpreter ~2 ms per MB (maitred.gateway.offload)
    request_timeout_s: float = 600.0  # a long generation is not a failure; this bounds a hung worker
    max_attempts: int = 3  # sends of one request (a worker died under it: try another)
    forward_unknown_fields: bool = False  # forward body fields off the route's allow-list (``fields``)
