"""Moved: the live shell is ``maitred.gateway`` and the simulated SGLang server ``maitred.sim.worker``.

Kept so that an old path fails with one line naming the new one: ``python -m
maitred.runtime.service.serve`` prints it and exits 2 (while Python locates a ``-m`` module,
``sys.argv[0]`` is ``"-m"``); an import raises ``ImportError`` with it.
"""

import sys

MOVED = (
    "maitred.runtime.service moved: the gateway is maitred.gateway (`maitred serve`, or python -m "
    "maitred.gateway.serve), the simulated worker maitred.sim.worker (`maitred sim-worker`, or python -m maitred.sim.worker)"
)

if sys.argv[:1] == ["-m"]:
    sys.stderr.write(f"error: {MOVED}\n")
    raise SystemExit(2)
raise ImportError(MOVED)
