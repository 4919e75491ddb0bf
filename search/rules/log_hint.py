"""log_hint: what the incumbent's server log, then its ties' (`peers`), asks for (tunectl/sglang/memory.py
`log_hints`: decode batches above the captured graph sizes, graphs off, requests queued at max-running-requests,
a full KV pool), as soft evidence; moves that already lost from an earlier incumbent are left out.

Evidence: docs/search.md, "The log hints ... moved the 8B card" and "Log hints from the configs that tied the
incumbent"; each hint read from real logs in tests/sglang/.
"""
from __future__ import annotations

from typing import ClassVar

from tunectl.search.repair import log_hints
from tunectl.search.rules.base import Context, Evidence
from tunectl.search.trials import facts, peers

from tunectl import knobs


class LogHint:
    name: ClassVar[str] = "log_hint"
    kind: ClassVar[str] = "repair"
    does: ClassVar[str] = ("acts on what the incumbent's (and its ties') server log asks for: decode batches "
                           "above the captured graphs, requests queued at max-running-requests, a full KV pool")
    constants: ClassVar[tuple[str, ...]] = ()

    def propose(self, ctx: Context) -> list[Evidence]:
        if ctx.incumbent is None:
            return []
        out = []
        for peer in peers(ctx.incumbent, ctx.done):
            flags = knobs.merge(ctx.prof, dict(peer.params))[0]
            for fixes, bounds in log_hints(ctx.prof.search, dict(peer.params), flags, facts(peer),
                                           ctx.tokens_per_request):
                out.append(Evidence(peer, ctx.unlost(fixes), bounds,
                                    "hint:" + ",".join(sorted({str(target) for target, _ in fixes}))))
        return out


RULE = LogHint()
