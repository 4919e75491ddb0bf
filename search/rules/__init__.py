"""The search's rules, one module each (a `RULE` with `name`, `kind`, `does`, `constants`, and `propose` or
`check`: search/rules/base.py), found here by their modules: a new rule is its module plus its name in the
policy's default order (tunectl/profile.py `PROPOSERS` / `VETOES`). docs/search.md, "The policy"."""
from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from tunectl.profile import PROPOSERS as PROPOSER_ORDER
from tunectl.profile import VETOES as VETO_ORDER


def _found() -> dict[str, Any]:
    rules = {}
    for m in pkgutil.iter_modules(__path__):
        if m.name != "base" and not m.name.startswith("_"):
            rule = importlib.import_module(f"{__name__}.{m.name}").RULE
            rules[rule.name] = rule
    return rules


_RULES = _found()
if set(_RULES) != {*PROPOSER_ORDER, *VETO_ORDER}:           # a module without its name in the order, or the reverse
    raise ImportError(f"search rules {sorted(_RULES)} against the policy's names "
                      f"{sorted({*PROPOSER_ORDER, *VETO_ORDER})} (tunectl/profile.py)")
PROPOSERS = {n: _RULES[n] for n in PROPOSER_ORDER}          # in the default order
VETOES = {n: _RULES[n] for n in VETO_ORDER}
