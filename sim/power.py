"""The stand-in's board power: what each GPU draws, step by step, on the modeled clock (the card's `power:`).

A step of `ms` modeled milliseconds draws, on every GPU the server spans, `idle_w + (max_w - idle_w) x load`: a
decode step's load is `bs / (bs + decode_half_bs)` (a small batch is memory-bound: the tensor cores wait on HBM and
the board stays well below its limit; a large one is compute-bound and nears it), a prefill step's `prefill_load`;
both times the attention backend's and MoE runner's `kernel_mult` (kernels that keep more of the chip busy draw
more). Time with no step is idle (`idle_w`). nvidia-smi's `utilization.gpu` is the share of time a kernel ran.

`Meter` keeps the energy of its last window: `draw()` is what `nvidia-smi --query-gpu=power.draw` reads on the host
(the board's average over its last modeled second, as recent drivers report it over their last second), and
`average()` the mean between two points of the modeled clock (the virtual model's level figure).
"""
from __future__ import annotations

from collections import deque

from tunectl.sim.card import Card, Power
from tunectl.sim.setup import Setup

WINDOW_S = 1.0          # modeled seconds power.draw averages over (a real board's: its last second)


def step_watts(p: Power, setup: Setup, kind: str, bs: int) -> float:
    """Watts per GPU while this step runs."""
    load = p.prefill_load if kind == "prefill" else bs / (bs + p.decode_half_bs)
    mult = p.kernel_mult.get(setup.attention or "", 1.0) * p.kernel_mult.get(setup.moe or "", 1.0)
    return p.idle_w + (p.max_w - p.idle_w) * min(1.0, load * mult)


class Meter:
    """Per-GPU power on the modeled clock: `step(...)` for each step the scheduler ran, idle in between."""

    def __init__(self, card: Card, window_s: float = WINDOW_S):
        self.power, self.window = card.power, window_s
        self.t = 0.0                                         # modeled end of the last step seen
        self.joules = 0.0                                    # per GPU, since start
        self.recent: deque[tuple[float, float, float]] = deque()   # (end, seconds, joules) of recent steps

    def step(self, setup: Setup, t_end: float, kind: str, bs: int, ms: float) -> None:
        if self.power is None or ms <= 0:
            return
        dt = ms / 1000.0
        self._idle_until(t_end - dt)
        j = step_watts(self.power, setup, kind, bs) * dt
        self.joules += j
        self.recent.append((t_end, dt, j))
        self.t = t_end
        while self.recent and self.recent[0][0] < t_end - self.window:
            self.recent.popleft()

    def _idle_until(self, t: float) -> None:
        if self.power is not None and t > self.t:
            self.joules += self.power.idle_w * (t - self.t)
            self.t = t

    def draw(self, now: float) -> tuple[float, float] | None:
        """(watts, utilization %) per GPU averaged over the window before `now` (modeled seconds)."""
        if self.power is None:
            return None
        busy = [(dt, j) for end, dt, j in self.recent if end > now - self.window]
        busy_s = min(self.window, sum(dt for dt, _ in busy))
        joules = sum(j for _, j in busy) + self.power.idle_w * (self.window - busy_s)
        return joules / self.window, 100.0 * busy_s / self.window

    def average(self, t0: float, j0: float, now: float) -> float | None:
        """Mean watts per GPU from (t0, joules then) to `now`."""
        if self.power is None or now <= t0:
            return None
        self._idle_until(now)
        return (self.joules - j0) / (now - t0)
