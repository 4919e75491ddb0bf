"""gpu: a backend this GPU has no kernels for (its SM version against where SGLang's source says the backend
runs: tunectl/sglang/scopes.py) is never proposed, before any crash says so.

Evidence: docs/search.md, the round "a backend the GPU has no kernels for is vetoed before it crashes".
"""
from __future__ import annotations

from typing import Any, ClassVar

from tunectl.search.foresight import Seen
from tunectl.search.rules.base import Context

from tunectl.profile import Profile
from tunectl.sglang import scopes


def lacks(prof: Profile, params: dict[str, Any], gpu_sm: int | None) -> bool:
    return scopes.gpu_lacks(prof, params, gpu_sm)


class Gpu:
    name: ClassVar[str] = "gpu"
    kind: ClassVar[str] = "veto"
    does: ClassVar[str] = "drops a backend this GPU has no kernels for (its SM version)"
    constants: ClassVar[tuple[str, ...]] = ()

    def check(self, params: dict[str, Any], ctx: Context) -> tuple[float, Seen | None] | None:
        return (1.0, None) if lacks(ctx.prof, params, ctx.steps.gpu_sm) else None


RULE = Gpu()
