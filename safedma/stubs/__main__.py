"""``python -m safedma.stubs CHECKER [--config]``: where the stubs are for one checker.

Standard output is one line, what a script needs: the directory, or with
``--config`` the configuration line. Where it goes is said on standard error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from safedma.stubs import CHECKERS, WHERE, Checker, config_line, directory


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m safedma.stubs",
        description="Print the directory (or, with --config, the configuration line) that "
        "enables safedma's strict pltpu stubs for one type checker.",
    )
    parser.add_argument("checker", choices=CHECKERS)
    parser.add_argument(
        "--config",
        action="store_true",
        help="print the configuration line instead of the directory (paths relative to the "
        "current directory when the stubs are inside it)",
    )
    ns = parser.parse_args(argv)
    checker = cast(Checker, ns.checker)
    if ns.config:
        print(f"# {WHERE[checker]}", file=sys.stderr)
        print(config_line(checker, relative_to=Path.cwd()))
    else:
        role = "PYTHONPATH for mypy" if checker == "mypy" else f"stub/search path for {checker}"
        print(f"# {role}", file=sys.stderr)
        print(directory(checker).as_posix())
    return 0


if __name__ == "__main__":
    sys.exit(main())
