"""Print the field lane's closing line from a run folder; ``--record`` writes results.json.

python -m tests.field.summary RUN_FOLDER [--record]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tests.field import _results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--record", action="store_true")
    options = parser.parse_args(argv)
    results = _results.gathered(options.folder)
    if not results["kernels"]:
        print("field: no kernel ran", file=sys.stderr)
        return 1
    if options.record:
        _results.record_run(results)
        print(
            f"recorded {len(results['kernels'])} kernels, {len(results['mutants'])} mutants in {_results.RESULTS}"
        )
    print(_results.per_path_line(results))
    print(_results.summary(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
