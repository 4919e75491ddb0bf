"""foresight: a config the history says repeats a crash (the same crash's cause, a memory footprint at or above
one that ran out of memory: search/foresight.py) is dropped; a local step it drops is tried with the crash's
repair applied (`Steps._step`).

Evidence: docs/search.md, "Proposals" (vetoes) and the rounds "A startup OOM weighs the mem fraction and the graphs
together", "A repair step that would repeat a repairable crash comes with that crash's repair".
"""
from __future__ import annotations

from typing import Any, ClassVar

from tunectl.search.foresight import Seen, predicted_crash
from tunectl.search.rules.base import Context


class Foresight:
    name: ClassVar[str] = "foresight"
    kind: ClassVar[str] = "veto"
    does: ClassVar[str] = ("drops a config the history says repeats a crash (same crash's cause, a memory "
                           "footprint at or above one that ran out of memory); a local step it drops is tried "
                           "with the crash's repair applied")
    constants: ClassVar[tuple[str, ...]] = ()

    def check(self, params: dict[str, Any], ctx: Context) -> tuple[float, Seen | None] | None:
        like = predicted_crash(ctx.prof.search, params, ctx.known, ctx.footprint())
        return None if like is None else (1.0, like)


RULE = Foresight()
