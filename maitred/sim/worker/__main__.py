"""``python -m maitred.sim.worker``: the same as ``maitred sim-worker``."""

import sys

from maitred.sim.worker.config import main

sys.exit(main())
