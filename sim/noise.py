"""The noise a real server plays: fresh launches of one config differ, and so do the levels of one launch.

`Speed(noise, seed)` scales every modeled step time by two factors, both log-normal with median 1 (the card's
noise-free model is the config's true value): one drawn once per launch (`noise.launch`: the spread between fresh
launches: clocks, placement, allocator state) and one redrawn every `noise.period_s` modeled seconds of work
(`noise.level`: drift within a launch, so two levels of one launch differ too). An eager decode step (graphs off, or
a batch above their max bs) takes its launch factor from `noise.launch_eager` where the card sets it: the same draw
scaled to that sd, so a slow launch is slow in both modes, eager more so. Draws come from the seed alone and
the work done, never from wall time: the host's load never changes a reading, and the live stand-in and the
virtual clock play the same noise for the same seed. `scale` multiplies all of them (0: the noise-free card).

A third factor belongs to the machine, not the launch (`noise.machine`, off unless the card sets it): the
machine's state at the launch's place in the campaign, `machine=(key, index)` (the seed, and the launch's index:
tunectl's trial number). A state lasts `noise.machine_launches` launches on average, so launches run next to each
other read it alike (a comparison in pairs cancels it) and launches far apart do not. Eager decode steps take the
state's draw at `noise.machine_eager` where the card sets it (another machine's host launches kernels at its own
speed: a config x machine interaction, eager configs moving most).
"""
from __future__ import annotations

import math
import random

from tunectl.sim.card import Noise


def _draw(key: str, sd: float) -> float:
    """exp(N(0, sd)): median 1."""
    return math.exp(random.Random(key).gauss(0.0, sd)) if sd > 0 else 1.0


def _draws(key: str, *sds: float) -> tuple[float, ...]:
    """exp(z x sd) for each sd, one z ~ N(0, 1) drawn from `key` (each equals `_draw(key, sd)`)."""
    z = random.Random(key).gauss(0.0, 1.0)
    return tuple(math.exp(z * sd) if sd > 0 else 1.0 for sd in sds)


def machine_start(key: int | str, index: int, launches: float) -> int:
    """The launch index at which the machine state of the launch at `index` began: a new state begins before launch
    k with probability 1 / `launches` (always at 0), and holds until the next one begins."""
    k = max(0, int(index))
    while k > 0 and random.Random(f"machine-step:{key}:{k}").random() >= 1.0 / launches:
        k -= 1
    return k


def machine_state(key: int | str, index: int, sd: float, launches: float) -> float:
    """The machine's speed factor for the launch at `index` (exp(N(0, sd)), median 1), the same for every launch
    of one state (`machine_start`)."""
    if sd <= 0:
        return 1.0
    return _draw(f"machine:{key}:{machine_start(key, index, launches)}", sd)


def machine_states(key: int | str, index: int, sd: float, sd_eager: float,
                   launches: float) -> tuple[float, float]:
    """`machine_state` for graphed and for eager steps: one draw of the state, at each sd (the first equals
    `machine_state(key, index, sd, launches)`)."""
    if sd <= 0 and sd_eager <= 0:
        return 1.0, 1.0
    graphed, eager = _draws(f"machine:{key}:{machine_start(key, index, launches)}", sd, sd_eager)
    return graphed, eager


class Speed:
    def __init__(self, noise: Noise, seed: int | str, scale: float = 1.0,
                 machine: tuple[int | str, int] | None = None):
        """`machine`: (key, index) of the machine state this launch runs in (`machine_state`); None: the seed's
        first."""
        self.seed, self.period_ms = seed, noise.period_s * 1000.0
        self.level_sd = noise.level * scale
        eager = noise.launch if noise.launch_eager is None else noise.launch_eager
        self.launch, self.launch_eager = _draws(f"launch:{seed}", noise.launch * scale, eager * scale)
        key, index = machine if machine is not None else (seed, 0)
        on_eager = noise.machine if noise.machine_eager is None else noise.machine_eager
        state, state_eager = machine_states(key, index, noise.machine * scale, on_eager * scale,
                                            noise.machine_launches)
        self.launch, self.launch_eager = self.launch * state, self.launch_eager * state_eager
        self.busy_ms = 0.0                # modeled work done so far (noise-free step times)
        self._segment, self._level = -1, 1.0

    def factor(self, eager: bool = False) -> float:
        segment = int(self.busy_ms // self.period_ms)
        if segment != self._segment:
            self._segment, self._level = segment, _draw(f"level:{self.seed}:{segment}", self.level_sd)
        return (self.launch_eager if eager else self.launch) * self._level

    def __call__(self, ms: float, eager: bool = False) -> float:
        """A step's noise-free modeled time -> the time it takes on this launch at this point of its work (`eager`:
        a decode step run without a CUDA graph)."""
        out = ms * self.factor(eager)
        self.busy_ms += ms
        return out
