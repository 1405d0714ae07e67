"""Invariants, checked always: `python -O` strips `assert`, and a broken invariant must stop the
process (its restart is recovery), never let it go on with wrong state.

Use `invariant(condition, detail...)` where a call costs nothing that matters; in a per-record
loop, test inline and `raise InvariantBroken(...)` (a call per record would show in the figures).
"""

from __future__ import annotations


class InvariantBroken(AssertionError):
    """A condition the code relies on does not hold: a bug, or state damaged under us."""


def invariant(condition: object, *detail: object) -> None:
    if not condition:
        raise InvariantBroken(*detail) if detail else InvariantBroken("an invariant does not hold")
