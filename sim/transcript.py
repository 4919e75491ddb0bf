"""The server log a virtual run would have written: the stand-in's own lines, without processes or clocks.

`transcript(setup, ladder)` renders what the live stand-in logs for the same setup and outcome (startup milestones,
the pool line, decode lines per level (its largest batch and its fullest KV pool), KV retractions, a crash's traceback
and death lines), so the virtual path reads crashes and facts with the same classifier and log watcher as a live trial.
"""
from __future__ import annotations

import io

from tunectl.sim.logs import RETRACT, SITE, Log, runtime_crash
from tunectl.sim.model import VirtualLadder
from tunectl.sim.phases import ready_line, startup_script
from tunectl.sim.setup import Setup
from tunectl.sim.spec import accept_part, refusal_text

PID = 4242
# decode lines per level (its largest batch, its fullest KV pool), as the live stand-in (sim/engine.py) and SGLang
# log each batch
DECODE_LINE = ("Decode batch, #running-req: {bs}, #token: {tokens}, token usage: {usage:.2f}, cuda graph: {graph}, "
               "gen throughput (token/s): {tput:.2f}, #queue-req: {queue}")


def transcript(setup: Setup, ladder: VirtualLadder) -> str:
    out = io.StringIO()
    log = Log(setup.card.gpu.count, out)
    for _, begin, _, end in startup_script(setup):
        for line in (*begin, *end):
            log(line, rank=True)
    if setup.refused is not None:             # refused before the first log line: a bare traceback, exit 1
        log.raw(refusal_text(setup.refused, SITE))
        return out.getvalue()
    if setup.crash is not None:
        log.exception("startup", setup.crash.exception, setup.crash.phase)  # noqa: PLE1205 (sim Log)
        log.death("startup", PID)
        return out.getvalue()
    log(ready_line(setup), rank=True)
    log("The server is fired up and ready to roll!")
    for lv in ladder.levels:
        for bs, graph, queue, tokens, usage in (lv.decode if lv.output_throughput is not None else ()):
            line = DECODE_LINE.format(bs=bs, graph=graph, tput=lv.output_throughput, queue=queue, tokens=tokens,
                                      usage=usage)
            log(line.replace("cuda graph:", accept_part(setup) + "cuda graph:"), rank=True)
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
