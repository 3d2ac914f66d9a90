"""What verifying one run of a program concluded, and how it reads in a test report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

__all__ = ["CLEAN", "FINDING", "UNSUPPORTED", "VERIFY_ERROR", "Kind", "Outcome"]

Kind = Literal["clean", "finding", "unsupported", "verify-error"]
CLEAN: Final = "clean"
FINDING: Final = "finding"  # verify proved a protocol mistake
UNSUPPORTED: Final = "unsupported"  # verify does not model the program, or ran out of time
VERIFY_ERROR: Final = "verify-error"  # verify itself failed (a bug in verify)


@dataclass(frozen=True)
class Outcome:
    """One program's verdict. ``kernels``: "name (called at file:line)" of each kernel
    the program calls; ``error``: the class name of verify's error ("" when clean);
    ``seconds``: what verifying it cost (0 for a verdict taken from the cache);
    ``observed``: why the finding is no news to the test (the run raised to it, or
    the test says it runs this mistake on purpose), "" when it is."""

    kind: Kind
    program: str
    kernels: tuple[str, ...]
    error: str = ""
    message: str = ""
    seconds: float = 0.0
    cached: bool = False
    observed: str = ""
    # the error's class and its bases, by name (an expected LeftoverSemaphoreError
    # matches verify's VerifiedLeftoverError)
    error_classes: tuple[str, ...] = ()

    def is_one_of(self, names: frozenset[str]) -> bool:
        """Whether verify's error is (a subclass of) one of ``names``; any, if empty."""
        return not names or bool(names.intersection(self.error_classes))

    def fails_the_test(self, fail_unsupported: bool) -> bool:
        """A finding the test has not received otherwise (or, if asked, any program
        verify could not check) turns the test into a failure."""
        if self.kind == CLEAN or self.observed:
            return False
        return self.kind == FINDING or fail_unsupported

    def kernel_list(self) -> str:
        return ", ".join(self.kernels) or "(none found)"

    def headline(self, test: str) -> str:
        """One line naming the kernels, the program and the test that ran them."""
        where = f"kernel(s) {self.kernel_list()} in program {self.program!r}, run by {test}"
        if self.kind == FINDING:
            return f"safedma verify found a protocol mistake ({self.error}) in {where}"
        if self.kind == UNSUPPORTED:
            return f"safedma verify could not check {where}: {self.error}"
        return f"safedma verify failed on {where}: {self.error}"

    def text(self, test: str) -> str:
        """The headline, then verify's own message."""
        seen = f"\n(not a new failure: {self.observed})" if self.observed else ""
        return f"{self.headline(test)}\n{self.error}: {self.message}{seen}"

    def as_record(self, test: str) -> dict[str, object]:
        """A plain dict (reports travel between pytest-xdist workers as such)."""
        return {
            "kind": self.kind,
            "program": self.program,
            "kernels": list(self.kernels),
            "error": self.error,
            "message": self.message,
            "seconds": self.seconds,
            "cached": self.cached,
            "observed": self.observed,
            "error_classes": list(self.error_classes),
            "test": test,
        }
