"""The noise a real server plays: fresh launches of one config differ, and so do the levels of one launch.

`Speed(noise, seed)` scales every modeled step time by two factors, both log-normal with median 1 (the card's
noise-free model is the config's true value): one drawn once per launch (`noise.launch`: the spread between fresh
launches: clocks, placement, allocator state) and one redrawn every `noise.period_s` modeled seconds of work
(`noise.level`: drift within a launch, so two levels of one launch differ too). Draws come from the seed alone and
the work done, never from wall time: the host's load never changes a reading, and the live stand-in and the
virtual clock play the same noise for the same seed. `scale` multiplies both (0: the noise-free card).
"""
from __future__ import annotations

import math
import random

from tunectl.sim.card import Noise


def _draw(key: str, sd: float) -> float:
    """exp(N(0, sd)): median 1."""
    return math.exp(random.Random(key).gauss(0.0, sd)) if sd > 0 else 1.0


class Speed:
    def __init__(self, noise: Noise, seed: int | str, scale: float = 1.0):
        self.seed, self.period_ms = seed, noise.period_s * 1000.0
        self.level_sd = noise.level * scale
        self.launch = _draw(f"launch:{seed}", noise.launch * scale)
        self.busy_ms = 0.0                # modeled work done so far (noise-free step times)
        self._segment, self._level = -1, 1.0

    def factor(self) -> float:
        segment = int(self.busy_ms // self.period_ms)
        if segment != self._segment:
            self._segment, self._level = segment, _draw(f"level:{self.seed}:{segment}", self.level_sd)
        return self.launch * self._level

    def __call__(self, ms: float) -> float:
        """A step's noise-free modeled time -> the time it takes on this launch at this point of its work."""
        out = ms * self.factor()
        self.busy_ms += ms
        return out
