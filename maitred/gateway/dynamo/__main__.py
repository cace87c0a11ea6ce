"""``python -m maitred.gateway.dynamo``: see ``maitred.gateway.dynamo``."""

import sys

from maitred.gateway.dynamo.component import main

if __name__ == "__main__":
    sys.exit(main())
