"""``python -m maitred.sim.worker``: the same as ``maitred sim-worker``."""

import sys

from maitred.sim.worker.server import main

sys.exit(main())
