"""The field lane runs only when asked (``./dev field``, which sets ``SAFEDMA_FIELD=1``):
it installs real packages from the package index and takes minutes per kernel family.
``SAFEDMA_FIELD_SLICE=ci`` keeps the kernels not marked slow and their mutants (what CI
runs)."""

from __future__ import annotations

import os

FIELD = os.environ.get("SAFEDMA_FIELD") == "1"

collect_ignore = [] if FIELD else ["test_field.py", "test_mutants.py"]
