"""The server log a virtual run would have written: the stand-in's own lines, without processes or clocks.

`transcript(setup, ladder)` renders what the live stand-in logs for the same setup and outcome (startup milestones,
the pool line, KV retractions, a crash's traceback and death lines), so the virtual path reads crashes and facts
with the same classifier and log watcher as a live trial.
"""
from __future__ import annotations

import io

from tunectl.sim.logs import RETRACT, Log, runtime_crash
from tunectl.sim.model import VirtualLadder
from tunectl.sim.phases import ready_line, startup_script
from tunectl.sim.setup import Setup

PID = 4242


def transcript(setup: Setup, ladder: VirtualLadder) -> str:
    out = io.StringIO()
    log = Log(setup.card.gpu.count, out)
    for _, begin, _, end in startup_script(setup):
        for line in (*begin, *end):
            log(line, rank=True)
    if setup.crash is not None:
        log.exception("startup", setup.crash.exception, setup.crash.phase)  # noqa: PLE1205 (sim Log)
        log.death("startup", PID)
        return out.getvalue()
    log(ready_line(setup), rank=True)
    log("The server is fired up and ready to roll!")
    if ladder.retractions:
        log(RETRACT.format(n=ladder.retractions, a=setup.card.admission.new_token_ratio, b=1.0), rank=True)
    if ladder.crash is not None:
        before, frames = runtime_crash(ladder.crash.signature, ladder.crash.exception)
        for line in before:
            log(line, rank=True)
        if frames is not None:
            log.exception(frames, ladder.crash.exception)
        log.death("runtime", PID)
    return out.getvalue()
