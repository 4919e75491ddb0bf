"""startup_repair: the crash catalog's repairs for configs that crashed at startup which the value model rates
near the incumbent (at least STARTUP_REPAIR_SHARE of its value), or that were repair steps themselves (a hint from
the server's log whose config crashed), newest first, with the bounds the OOM message gives.

Evidence: docs/search.md, the fourth round under "Search efficiency": a DeepSeek startup crash this rule left
unrepaired until trial 37 (the model rated it 0.70 of the incumbent); three ways around it, each measured on every
card, none kept.
"""
from __future__ import annotations

from typing import ClassVar

from tunectl.search.repair import oom_bounds
from tunectl.search.rules.base import Context, Evidence
from tunectl.search.surrogate import Surrogate
from tunectl.search.trials import history, outcome

# A startup crash is repaired when the value model rates its config at least this share of the incumbent's value.
STARTUP_REPAIR_SHARE = 0.9


class StartupRepair:
    name: ClassVar[str] = "startup_repair"
    kind: ClassVar[str] = "repair"
    does: ClassVar[str] = ("repairs configs that crashed at startup which the value model rates near the "
                           "incumbent, or that were repairs themselves")
    constants: ClassVar[tuple[str, ...]] = ("STARTUP_REPAIR_SHARE", "REPAIRS_PER_CRASH")

    def propose(self, ctx: Context) -> list[Evidence]:
        incumbent = ctx.incumbent
        crashed = [t for t in ctx.done if outcome(t) == "startup" and ctx.fixes(t)]
        if incumbent is None or not crashed or not incumbent.values:
            return []
        model = Surrogate(ctx.prof.search, history(ctx.done, ctx.known), ctx.steps.admission)
        out = []
        for t in sorted(crashed, key=lambda t: -t.number):
            if t.user_attrs.get("proposed_by") == "repair" or \
                    model.value.predict(dict(t.params)) >= STARTUP_REPAIR_SHARE * incumbent.values[0]:
                exc = str(t.user_attrs.get("crash_exception", ""))
                out.append(Evidence(t, ctx.fixes(t), oom_bounds(exc, dict(t.params), ctx.prof.search),
                                    str(t.user_attrs.get("crash_signature", ""))))
        return out


RULE = StartupRepair()
