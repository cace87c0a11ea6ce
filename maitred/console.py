"""The rich console commands print through.

Rich sizes its output to the terminal, and to 80 columns when stdout is not one, which cuts
tables (``maitred programs``, the demo's summary) when they are piped to a file or a pager. So
piped output gets room for the widest table instead; ``COLUMNS`` still decides when set.
"""

import os
import sys

from rich.console import Console

#: Width of piped output: wide enough for every table the commands print.
PIPED_WIDTH = 200


def output_console() -> Console:
    piped = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(width=PIPED_WIDTH if piped else None)
