"""Which program a model request belongs to (SPEC 7.5), and what the worker must not see of it.

The places are ``maitred.identity.ID_SOURCES``, read in order, the first present winning:
maitred's own body fields and header, then the session ids LiteLLM, Claude Code and Codex send,
then SGLang's gateway and Dynamo's affinity keys. maitred's body fields (``program_id``,
``extra_body.program_id``, ``metadata.program_id``) are stripped before forwarding (workers reject
or ignore unknown fields; SGLang's OpenAI protocol forbids some), emptied containers with them,
and every one is checked, also those after the one that wins. Other clients' fields
(``metadata.user_id``, ``metadata.session_id``) stay in the forwarded body. Behind a LiteLLM proxy
the id only arrives as the top-level body ``program_id`` (LiteLLM forwards neither client headers
nor body ``metadata``), which is where maitred's LiteLLM callback puts it.
"""

from collections.abc import Mapping
from typing import Any

from maitred.events import MAX_ID_LENGTH, name_problem
from maitred.gateway.guard import HTTPProblem
from maitred.identity import ID_SOURCES, IdSource, client_program_id

_OWN = tuple(s for s in ID_SOURCES if s.strip)


def _valid(value: Any, where: str) -> str:
    problem = name_problem(value, empty=False)
    if problem is not None:
        raise HTTPProblem(
            400, f"{where}: expected a string of 1 to {MAX_ID_LENGTH} characters: {problem}, got {str(value)[:64]!r}", field=where
        )
    return value


def _pop(body: dict[str, Any], source: IdSource) -> Any:
    """Remove maitred's field at ``source`` from ``body`` (and its container, once empty)."""
    *outer, key = source.path
    container: Any = body
    for name in outer:
        container = container.get(name) if isinstance(container, dict) else None
    if not isinstance(container, dict) or key not in container:
        return None
    value = container.pop(key)
    if outer and not container:
        del body[outer[0]]
    return value


def take_program_id(body: dict[str, Any], headers: Mapping[str, str]) -> tuple[str | None, bool]:
    """The program id (None: a one-step program) and whether ``body`` was changed."""
    found: str | None = None
    changed = False
    for source in _OWN:
        value = _pop(body, source)
        if value is not None:
            changed = True
            checked = _valid(value, source.field)
            found = found or checked
    if found is None:
        sent = client_program_id(body, headers)
        if sent is not None:
            return _valid(sent[0], sent[1].field), changed
    return found, changed
