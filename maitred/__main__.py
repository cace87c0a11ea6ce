"""Entry point of the ``maitred`` command and of ``python -m maitred``.

``maitred hook claude-code`` runs once per Claude Code tool call, so it is dispatched here,
before ``maitred.cli`` and what it imports (rich, SQLAlchemy, the simulator) are loaded; every
other command goes through ``maitred.cli.main``.
"""

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:2] == ["hook", "claude-code"]:
        from maitred.integrations import claude_code_hook

        return claude_code_hook.main(args[2:])
    from maitred.cli import main as cli_main

    return cli_main(args)


if __name__ == "__main__":
    sys.exit(main())
