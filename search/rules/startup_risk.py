"""startup_risk: the odds a proposal crashes at startup by the startup-crash model fitted to the history
(search/surrogate.py `startup_risk`), from TPE_STARTUP finished trials on; the caller drops it at VETO_RISK.

Evidence: docs/search.md, "Proposals" (vetoes): a sampler proposal the startup-crash model rates at VETO_RISK is
told FAIL unrun.
"""
from __future__ import annotations

from typing import Any, ClassVar

from tunectl.search.foresight import Seen
from tunectl.search.rules.base import Context
from tunectl.search.sampler import TPE_STARTUP


class StartupRisk:
    name: ClassVar[str] = "startup_risk"
    kind: ClassVar[str] = "veto"
    does: ClassVar[str] = "drops a proposal the startup-crash model rates at or above VETO_RISK"
    constants: ClassVar[tuple[str, ...]] = ("VETO_RISK", "TPE_STARTUP")

    def check(self, params: dict[str, Any], ctx: Context) -> tuple[float, Seen | None] | None:
        if len(ctx.done) < TPE_STARTUP:
            return None
        return ctx.startup_risk(params), None


RULE = StartupRisk()
