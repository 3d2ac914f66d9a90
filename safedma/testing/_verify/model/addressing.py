"""The copies a kernel addressed by device id, as the messages name them.

Why: when a copy goes to the wrong device, the error appears where the bytes land
(two copies into one buffer, a count left over) or where they do not (a receive wait
that never returns). Those messages name the copy's line; the line to fix is the one
that computed its device id. Each copy started with a device id is noted here by its
line (once per line, and a few of the devices it went from and to); the lines that
computed the id are found only when a message asks (``device_ids.origin_lines``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["Addressing"]

# (issuer, target) pairs kept per copy line and per destination semaphore: enough to
# show where the copies went, bounded on a large mesh.
_KEPT = 4


class Addressing:
    """Copies started with a device id: their lines, where they went, how the ids were
    computed."""

    def __init__(self) -> None:
        # copy line -> the lines that computed its device id, found on demand
        self._origins: dict[str, Callable[[], list[str]]] = {}
        self._found: dict[str, list[str]] = {}
        self._what: dict[str, str] = {}  # copy line -> "copy" or "signal"
        # destination semaphore label -> copy line -> a few (issuer, target) pairs seen
        self.sent: dict[str, dict[str, list[tuple[int, int]]]] = {}
        # destination semaphore label -> every device a copy by device id reached
        self.reached: dict[str, set[int]] = {}

    def knows(self, where: str) -> bool:
        """Whether the copy at ``where`` was noted (its origin is then known)."""
        return where in self._origins

    def learn(self, where: str, origin: Callable[[], list[str]], what: str = "copy") -> None:
        """How to find the lines that computed the device id of the copy (or ``what``:
        signal) at ``where``."""
        self._origins[where] = origin
        self._what[where] = what

    def note(self, where: str, issuer: int, target: int, sem_label: str) -> None:
        """A copy started at ``where`` on ``issuer``, addressed to ``target``, landing
        on the semaphore ``sem_label`` there."""
        reached = self.reached.get(sem_label)
        if reached is None:
            reached = self.reached[sem_label] = set()
        reached.add(target)
        by_line = self.sent.setdefault(sem_label, {})
        pairs = by_line.get(where)
        if pairs is None:
            pairs = by_line[where] = list[tuple[int, int]]()
        if len(pairs) < _KEPT and (issuer, target) not in pairs:
            pairs.append((issuer, target))

    def origin(self, where: str) -> list[str]:
        """The user's lines that computed the device id of the copy at ``where``."""
        found = self._found.get(where)
        if found is None:
            try:
                found = self._origins[where]() if where in self._origins else list[str]()
            except Exception:  # noqa: BLE001 - a hint only: the error itself stands
                found = list[str]()
            self._found[where] = found
        return found

    def computed(self, where: str) -> str:
        """``"its device id is computed at L1 (from L2)"``, or ``""`` when unknown."""
        lines = self.origin(where)
        if not lines:
            return ""
        text = f"its device id is computed at {lines[0]}"
        if len(lines) > 1:
            text += f", from {' and '.join(lines[1:])}"
        return text

    def note_for(self, labels: Sequence[str], where: str, issuer: int, target: int) -> str:
        """``" (sent to device 1 (x=1); its device id is computed at L)"``: what a
        message adds where it names a copy addressed by device id (``""`` otherwise)."""
        computed = self.computed(where)
        if not computed:
            return ""
        to = "to itself" if issuer == target else f"to {labels[target]}"
        return f" (addressed {to}; {computed})"

    def missing(self, labels: Sequence[str], sem_label: str, owner: int) -> str:
        """For a wait on ``sem_label`` of ``owner`` that no copy feeds: the copies
        addressed to that semaphore on other devices, and how their ids were computed;
        ``""`` when a copy did reach ``owner`` or none was addressed by device id."""
        by_line = self.sent.get(sem_label)
        if not by_line or owner in self.reached.get(sem_label, ()):
            return ""
        parts: list[str] = []
        for where, pairs in list(by_line.items())[:2]:
            went = ", ".join(
                f"{labels[i]} to {'itself' if i == t else labels[t]}" for i, t in pairs[:3]
            )
            computed = self.computed(where)
            parts.append(
                f"the {self._what.get(where, 'copy')} at {where} went from {went}"
                + (f"; {computed}" if computed else "")
            )
        return (
            f" Nothing sent by device id was addressed to {labels[owner]}'s {sem_label}: "
            + "; ".join(parts)
            + ". Check the device id names the device that waits."
        )
