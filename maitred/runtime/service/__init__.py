"""Moved: the live shell is ``maitred.gateway`` and the simulated SGLang server ``maitred.sim.worker``.

Kept so that an old import path (``python -m maitred.runtime.service.serve``) fails with one line
naming the new one instead of a bare ``ModuleNotFoundError``.
"""

raise ImportError(
    "maitred.runtime.service moved: the gateway is maitred.gateway (python -m maitred.gateway.serve, "
    "or `maitred serve`), the simulated worker maitred.sim.worker (python -m maitred.sim.worker, or `maitred sim-worker`)"
)
