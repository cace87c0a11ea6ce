"""Who may do what on a gateway: its bearer tokens and the programs each may touch.

The trust model (README "What is guaranteed", ``docs/deploy.md``):

- **No token** (the default): the gateway trusts whoever reaches it, so it binds loopback only
  (``maitred serve`` refuses another address without a token) and answers only ``Host`` names
  of that address (``maitred.gateway.origin``), so a web page cannot reach it either.
- **With tokens** (``--token``, ``$MAITRED_TOKEN``, ``--token-file``): every endpoint but
  ``/metrics`` and ``/healthz`` needs one — the model routes included, because a model request
  changes its program's state (its phase, open tool, context, worker and tier, its history
  rows) as much as an event does. Clients send it as ``Authorization: Bearer <token>`` (OpenAI
  clients: their API key) or ``x-api-key: <token>`` (Anthropic clients).
- **Scoped tokens**: a ``--token-file`` line ``TOKEN PREFIX [PREFIX ...]`` gives a token only
  the programs whose id starts with one of the prefixes (a line with the token alone, or the
  prefix ``*``, gives every program). A scoped token is refused (403, ``program_id``) a model
  request, admission or event naming another program, and sees only its own programs in
  ``GET /v1/programs``; ``GET /v1/journal`` (every program's decisions) needs an unscoped token.
  Requests without a program id (one-step programs) touch no one's state and are allowed.
"""

import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import HTTPConnection

from maitred.events import Event, Handoff, ProgramStart
from maitred.gateway.guard import HTTPProblem

#: The shortest token ``maitred serve`` accepts: a blank one would lock everyone out, a short
#: one is guessed (``openssl rand -hex 16`` makes 32 characters).
MIN_TOKEN_CHARS = 16


def check_token_text(token: str, where: str) -> str:
    """``token`` if it can serve as a bearer token; else ``ValueError`` naming ``where``."""
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(
            f"{where}: a token needs at least {MIN_TOKEN_CHARS} characters, got {len(token)} (try: openssl rand -hex 16)"
        )
    if any(c.isspace() or not c.isprintable() for c in token):
        raise ValueError(f"{where}: a token cannot hold spaces or control characters")
    return token


@dataclass(frozen=True, slots=True)
class Scope:
    """The programs one credential may touch: all of them (``prefixes`` None), or those whose
    id starts with one of ``prefixes``."""

    prefixes: tuple[str, ...] | None = None

    @property
    def everything(self) -> bool:
        return self.prefixes is None

    def allows(self, program_id: str) -> bool:
        return self.prefixes is None or program_id.startswith(self.prefixes)

    def refuse(self, program_id: str, field: str = "program_id") -> HTTPProblem:
        return HTTPProblem(
            403, f"{field}: {program_id[:64]!r} is not among this token's programs", field=field, kind="permission_error"
        )

    def check(self, program_id: str | None, field: str = "program_id") -> None:
        """Raise 403 unless ``program_id`` (None: no program) is within the scope."""
        if program_id is not None and not self.allows(program_id):
            raise self.refuse(program_id, field)

    def outside(self, event: Event) -> str | None:
        """The field of ``event`` naming a program outside the scope, or None."""
        for name, pid in (
            ("program_id", event.program_id),
            ("parent_program_id", event.parent_program_id if isinstance(event, ProgramStart) else None),
            ("child_program_id", event.child_program_id if isinstance(event, Handoff) else None),
        ):
            if pid is not None and not self.allows(pid):
                return name
        return None


EVERYTHING = Scope()


class Tokens:
    """The gateway's credentials: none (every request is trusted) or tokens, each with a scope."""

    def __init__(self, table: Mapping[str, Scope] | None = None) -> None:
        self._table = [(t.encode(), s) for t, s in (table or {}).items()]

    @property
    def required(self) -> bool:
        return bool(self._table)

    @classmethod
    def of(cls, token: str | None = None, lines: Iterable[str] = (), *, where: str = "--token-file") -> "Tokens":
        """An unscoped ``token`` (if any) and the ``--token-file`` ``lines``."""
        table: dict[str, Scope] = {}
        if token:  # (never a blank one: a blank credential would match it)
            table[token] = EVERYTHING
        for number, line in enumerate(lines, 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            token_text = check_token_text(words[0], f"{where}: line {number}")
            prefixes = tuple(words[1:])
            scope = EVERYTHING if not prefixes or "*" in prefixes else Scope(prefixes)
            known = table.get(token_text)
            if known is not None and not (known.everything or scope.everything):
                scope = Scope((*(known.prefixes or ()), *(scope.prefixes or ())))
            elif known is not None:
                scope = EVERYTHING
            table[token_text] = scope
        return cls(table)

    @classmethod
    def from_file(cls, path: str, token: str | None = None) -> "Tokens":
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as exc:
            raise ValueError(f"--token-file: cannot read {path}: {exc.strerror or exc}") from None
        tokens = cls.of(token, lines, where=f"--token-file {path}")
        if not tokens.required:
            raise ValueError(f"--token-file: {path} holds no token")
        return tokens

    def scope_of(self, request: HTTPConnection) -> Scope:
        """The scope of the request's credential (``Authorization: Bearer`` or ``x-api-key``);
        401 when tokens are required and it has none that is known. Every known token is
        compared, in constant time each, so timing tells nothing of which one nearly matched."""
        if not self._table:
            return EVERYTHING
        scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
        given = bearer.strip() if scheme.lower() == "bearer" else request.headers.get("x-api-key", "").strip()
        found: Scope | None = None
        for token, scope in self._table:
            if hmac.compare_digest(given.encode(), token) and found is None:
                found = scope
        if found is None:
            raise HTTPProblem(
                401,
                "missing or wrong token (Authorization: Bearer <token>, or x-api-key: <token>)",
                field="authorization",
                kind="authentication_error",
            )
        return found


OPEN = Tokens()
