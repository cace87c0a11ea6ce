"""What the live driver asks of a worker, whatever serves it: an SGLang server over HTTP
(``sglang.client.SGLangClient``) or a Dynamo worker instance (``dynamo.fleet.DynamoWorker``)."""

from typing import Any, Protocol

from maitred.gateway.sglang.client import WorkerCapacity, WorkerLoad


class WorkerBackend(Protocol):
    """One worker as ``LiveDriver``, ``WorkerWatch`` and ``WarmupSender`` use it. ``capacity``
    and ``load`` raise ``WorkerError`` (``sglang.client``) when the worker cannot tell;
    ``healthy`` never raises."""

    async def healthy(self) -> bool: ...

    async def capacity(self) -> WorkerCapacity: ...

    async def host_capacity(self) -> int | None: ...

    async def load(self) -> WorkerLoad: ...

    async def warmup(self, text_or_input_ids: str | list[int], *, priority: int | None = None) -> int | None: ...

    async def tokenize(
        self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None, add_generation_prompt: bool = False
    ) -> list[int]: ...
