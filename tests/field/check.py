"""Run the checkers on field kernels from the command line, for writing a driver.

python -m tests.field.check                      every kernel, verify and trace
python -m tests.field.check NAME [NAME ...]      these kernels (a name prefix works)
python -m tests.field.check --simulate NAME      simulate too (the lane runs it on one-device programs)
python -m tests.field.check --full NAME          print each finding's whole message
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*")
    parser.add_argument("--simulate", action="store_true")
    parser.add_argument("--full", action="store_true")
    options = parser.parse_args(argv)

    from tests.field import _packages

    _packages.put_on_path()
    from tests.field import _verdicts
    from tests.field.drivers import all_kernels

    kernels = [
        k
        for k in all_kernels()
        if not options.names or any(k.name.startswith(n) for n in options.names)
    ]
    if not kernels:
        print("no field kernel matches", options.names, file=sys.stderr)
        return 2
    failed = 0
    for kernel in kernels:
        try:
            program = kernel.program()
        except Exception as err:  # a driver that cannot build its program
            print(f"{kernel.name}: BUILD FAILED {type(err).__name__}: {err}")
            failed += 1
            continue
        tools = ["verify", "trace"] + (["simulate"] if options.simulate else [])
        for tool in tools:
            verdict = _verdicts.CHECKERS[tool](program)
            print(f"{kernel.name} [{tool}] {verdict.outcome} {verdict.error} "
                  f"({verdict.seconds:.1f} s) {verdict.detail} {verdict.headline}")  # fmt: skip
            if options.full and verdict.message:
                print("    " + verdict.message.replace("\n", "\n    "))
            failed += verdict.outcome == "crash"
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
