"""load_repair: the crash catalog's repairs for the fastest configs that crashed under load after serving more
than the incumbent did at the same levels (a config fast up to a load crash, e.g. 1,950 tok/s at 256 then
page_table_1_flattened at 512, is one flag away from a fast stable config more often than any random neighbour).

Evidence: docs/search.md, "Proposals" (the repair step) and the rounds under "Search efficiency"; the seeds' GLM-5
crash at 512 after 1,950 tok/s at 256.
"""
from __future__ import annotations

from typing import ClassVar

from tunectl.search.rules.base import Context, Evidence
from tunectl.search.trials import outpaced


class LoadRepair:
    name: ClassVar[str] = "load_repair"
    kind: ClassVar[str] = "repair"
    does: ClassVar[str] = ("repairs the fastest configs that crashed under load after serving more than the "
                           "incumbent did at the same levels (the crash catalog's repairs)")
    constants: ClassVar[tuple[str, ...]] = ("REPAIRS_PER_CRASH",)

    def propose(self, ctx: Context) -> list[Evidence]:
        return [Evidence(t, ctx.fixes(t), {}, str(t.user_attrs.get("crash_signature", "")))
                for t in sorted((t for t in ctx.done if outpaced(t, ctx.incumbent)), key=lambda t: -t.values[0])]


RULE = LoadRepair()
