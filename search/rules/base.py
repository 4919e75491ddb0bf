"""The two interfaces every rule of the search implements, and the history they read.

A **proposer** (`propose(ctx)`) says what to run next, of one of two kinds: a *repair* proposer gives evidence,
configs with the changes some evidence asks for (`Evidence`: a crash's catalog repairs, a full KV pool's relief, a
log hint), which `Steps` turns into runnable configs (grid values, bounds, the repair budget per chain, the
vetoes); a *walk* proposer gives candidate configs near the leader, which `Steps` runs as they are or with the
repair of the crash they would repeat. A **veto** (`check(params, ctx)`) objects to a proposal: the odds it
crashes and the crash it would repeat, or None. Each rule is one module of this package with a `RULE`; the
profile's `search.policy` orders them (docs/search.md, "The policy").
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol

from optuna.trial import FrozenTrial

from tunectl.profile import Profile
from tunectl.search import finalists as fin
from tunectl.search.space import config_key
from tunectl.search.trials import lost_moves

if TYPE_CHECKING:
    from tunectl.search.foresight import Seen
    from tunectl.search.steps import Steps


class Evidence(NamedTuple):
    """A config and the changes some evidence asks of it (`why`: the crash signature or hint it answers)."""

    config: FrozenTrial
    fixes: Any
    bounds: dict[str, float]
    why: str


class Walk(NamedTuple):
    """Where the walk stands: the leader to step from, its params, its neighbours one knob away in the order they
    are tried, their rank by config key, and what a step from the leader becomes (graphs' room)."""

    leader: FrozenTrial
    parent: dict[str, Any]
    neighbours: list[dict[str, Any]]
    rank: dict[str, int]
    room: Any


class Context:
    """What the rules read, each computed once per question: the finished trials (`done`), what each says
    (`known`), the incumbent (the best candidate; None before any served config) and the configs run (`seen`)."""

    def __init__(self, steps: Steps, done: list[FrozenTrial], known: list[Seen],
                 incumbent: FrozenTrial | None = None, seen: set[str] | None = None):
        self.steps, self.done, self.known, self.incumbent = steps, done, known, incumbent
        self.seen = seen if seen is not None else set()

    @property
    def prof(self) -> Profile:
        return self.steps.prof

    @property
    def tokens_per_request(self) -> int:
        wl = self.prof.bench.workloads[0]
        return wl.input_len + wl.output_len

    def fixes(self, t: FrozenTrial) -> Any:
        """The crash catalog's repairs for `t`'s crash."""
        return self.steps._fixes(t)

    def unlost(self, fixes: Any) -> list[Any]:
        """Soft-evidence changes less the moves that already lost from an earlier incumbent."""
        return self.steps._unlost(fixes, self.lost)

    @functools.cached_property
    def lost(self) -> set[tuple[str, Any]]:
        return lost_moves(self.done)

    def footprint(self) -> Any:
        """The study's memory footprint from the servers' logs (None before one is logged)."""
        return self.steps._footprint(self.done)

    def startup_risk(self, params: dict[str, Any]) -> float:
        return self.steps._startup_risk(self.done, self.known)(params)

    @functools.cached_property
    def walk(self) -> Walk | None:
        """The walk from the leader, None with no served config to step from."""
        best = fin.candidates(self.done)
        return self.steps._walk_base(self.done, self.seen, self.known, best) if best else None

    def runnable(self, cands: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Walk candidates as a step from the leader makes them (`Walk.room`), less those already run."""
        walk = self.walk
        assert walk is not None
        return [c for c in map(walk.room, cands) if config_key(c) not in self.seen]


class Proposer(Protocol):
    name: ClassVar[str]
    kind: ClassVar[str]                 # "repair" | "walk"
    does: ClassVar[str]
    constants: ClassVar[tuple[str, ...]]

    def propose(self, ctx: Context) -> list[Any]:
        """repair: [Evidence], in the order tried; walk: candidate configs, in the order tried."""
        ...


class Veto(Protocol):
    name: ClassVar[str]
    kind: ClassVar[str]                 # "veto"
    does: ClassVar[str]
    constants: ClassVar[tuple[str, ...]]

    def check(self, params: dict[str, Any], ctx: Context) -> tuple[float, Seen | None] | None:
        """The odds `params` crash and the crash they would repeat; None: no objection."""
        ...
