"""kv_pressure: relief for the incumbent's KV pool when its server retracted requests (soft evidence, no crash):
an FP8 KV cache where the config runs another, then the catalog's repairs for a full pool (a higher memory
fraction, fewer running requests), bounded by the requests the logged pool holds; moves that already lost from an
earlier incumbent are left out.

Evidence: docs/search.md, "Proposals" (retractions as soft evidence); the real pool-full log
tests/fixtures/logs/llama8b-h100/kv-pressure.log (tests/sglang/test_memory.py).
"""
from __future__ import annotations

from typing import ClassVar

from tunectl.search.repair import lookup, pool_bounds, pool_relief
from tunectl.search.rules.base import Context, Evidence
from tunectl.search.trials import facts

from tunectl.models import ladder_steps

KV_PRESSURE = "kv_pool_oom"         # the catalog signature whose repairs answer a full KV pool (retractions)
KV_PRESSURE_SHARE = 0.1        # retractions worth a repair: at least this share of the top level's requests


class KvPressure:
    name: ClassVar[str] = "kv_pressure"
    kind: ClassVar[str] = "repair"
    does: ClassVar[str] = ("relieves the incumbent's KV pool when its server retracted requests (FP8 KV, a "
                           "higher memory fraction, fewer running requests)")
    constants: ClassVar[tuple[str, ...]] = ("KV_PRESSURE_SHARE",)

    def propose(self, ctx: Context) -> list[Evidence]:
        t = ctx.incumbent
        if t is None:
            return []
        logged = facts(t)
        top = max((st.concurrency for st in ladder_steps(t.user_attrs.get("ladder")) if st.status == "ok"),
                  default=0)
        if logged.get("retracted_reqs", 0) < KV_PRESSURE_SHARE * top or top <= 0:
            return []
        fixes = [*pool_relief(ctx.prof.search, dict(t.params), logged), *lookup(ctx.steps.repairs, KV_PRESSURE)]
        return [Evidence(t, ctx.unlost(fixes),
                         pool_bounds(logged, ctx.tokens_per_request), KV_PRESSURE)]


RULE = KvPressure()
