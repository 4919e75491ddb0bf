"""local: one knob away from the leader (the best pooled estimate), best-rated first, past the knobs already moved
alone from it with no effect (`flat_knobs`); graphs switched on come with the room they need. From LOCAL_AFTER
finished trials on.

Evidence: docs/search.md, the rounds "After TPE's random start the loop's steps take every turn" and "The loop's
steps from the baseline on".
"""
from __future__ import annotations

from typing import Any, ClassVar

from tunectl.search.rules.base import Context


class Local:
    name: ClassVar[str] = "local"
    kind: ClassVar[str] = "walk"
    does: ClassVar[str] = ("steps one knob away from the leader (best pooled estimate), best-rated first, "
                           "past flat knobs")
    constants: ClassVar[tuple[str, ...]] = ("LOCAL_AFTER", "FLAT")

    def propose(self, ctx: Context) -> list[dict[str, Any]]:
        walk = ctx.walk
        return [] if walk is None else ctx.runnable(walk.neighbours)


RULE = Local()
