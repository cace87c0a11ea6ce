"""Whether an address can be listened on, checked before a server starts: uvicorn reports a
taken port as a multi-line log and its own exit status, after the app has been built."""

import socket


def check_bindable(host: str, port: int) -> None:
    """Raise ``ValueError`` naming the flags when ``host:port`` cannot be listened on."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ValueError(f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc})") from None
