"""The ``maitred`` command (SPEC section 11): ``main`` parses the command line
(``maitred.cli.parser``) and runs the chosen subcommand (``maitred.cli.commands``).

Every error is one line on stderr naming the flag or the path it is about, never a traceback
(unless ``MAITRED_DEBUG`` is set): exit status 2 for a refused command line (argparse's
convention), 1 for a failure while doing the work (a missing or damaged database, an unreadable
trace, a file that cannot be written).
"""

import os
import shlex
import sys
from collections.abc import Sequence

from maitred.cli.commands import CliError, UsageError, stderr_line
from maitred.cli.parser import build_parser
from maitred.middleware.config import default_db_url
from maitred.sim.traces import TraceError
from maitred.storage import StoreError, normalize_db_url

__all__ = ["CliError", "UsageError", "build_parser", "main"]


def _default_db() -> str:
    """``$MAITRED_DB`` or ``maitred.db``, checked here so a bad variable is named as such."""
    try:
        return normalize_db_url(default_db_url())
    except StoreError as exc:
        raise UsageError(f"$MAITRED_DB: {exc}") from None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.command_line = "maitred " + shlex.join(argv)  # what reports print as the command that made them
    try:
        if not getattr(args, "plugged", False) and "db" in vars(args) and args.db is None:
            args.db = _default_db()
        return int(args.func(args))
    except UsageError as exc:
        stderr_line("error", str(exc))
        return 2
    except (CliError, StoreError, TraceError, ValueError) as exc:
        stderr_line("error", str(exc))
        return 1
    except Exception as exc:
        if os.environ.get("MAITRED_DEBUG"):
            raise
        stderr_line("error", f"{type(exc).__name__}: {exc}")
        return 1
