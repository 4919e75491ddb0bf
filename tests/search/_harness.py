"""A search harness run as its own process, so tests can kill -9 it mid-trial and run it again.

    python -m tests.search._harness ROOT TRIALS [STORAGE_URL] [GPU]

Each trial starts a real detached process group through LocalRunner (the trial's "server"), records launch.json
as the trial engine does, runs the ladder on the stand-in's virtual model at a slowed pace, and tears the group
down. Killing this process leaves that server running, as a real harness crash would.
"""
from __future__ import annotations

import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import optuna

from tests.search.conftest import make_profile
from tunectl.models import LaunchPlan, TrialResult
from tunectl.runners.hosts.local import LocalRunner
from tunectl.store import StudyStore
from tunectl.wiring.study import run_search
from tunectl.wiring.virtual import VirtualEvaluator

SERVER = [sys.executable, "-c", "import time; time.sleep(600)"]


class ProcessEngine:
    def __init__(self, prof: Any, store: StudyStore, runner: LocalRunner, work: Path, level_s: float):
        self.virtual, self.store, self.runner = VirtualEvaluator(prof), store, runner
        self.work, self.level_s = work, level_s

    def __call__(self, n: int, params: dict[str, Any], role: str, should_prune: Any = None) -> TrialResult:
        run_id = f"tunectl-test-{n}-{uuid.uuid4().hex[:8]}"
        d = str(self.work / f"{n}-{run_id}")
        handle = self.runner.start_detached(SERVER, d, {}, run_id)
        self.store.write_launch(n, LaunchPlan(argv=SERVER, config=dict(params), env={}, run_id=run_id,
                                              trial_dir=d, params=dict(params)), "")
        res = self.virtual(n, params, role, should_prune)
        time.sleep(self.level_s * max(1, len(res.levels)))
        self.runner.signal_group(handle, signal.SIGKILL)
        return res


def _print_resume(kind: str, data: dict[str, Any]) -> None:
    if kind == "resume":
        from tunectl.commands.search import resume_line

        print(data["mode"], resume_line(data), flush=True)


def main(argv: list[str]) -> None:
    root, trials = Path(argv[0]), int(argv[1])
    storage = argv[2] if len(argv) > 2 and argv[2] != "-" else None
    gpu = int(argv[3]) if len(argv) > 3 else None
    prof = make_profile(search__finalists={"top_k": 1, "reruns": 1}, host__gpus=None if gpu is None else [gpu])
    store = StudyStore(prof.name, root)
    runner = LocalRunner()
    engine = ProcessEngine(prof, store, runner, root / "hostwork", level_s=0.05)
    out = run_search(prof, trials=trials, root=root, storage_url=storage, evaluate=engine, runner=runner,
                     heartbeat_s=1, seed=gpu or 0, on_event=_print_resume)
    print(f"done trials={out.trials} evaluated={out.evaluated}", flush=True)


if __name__ == "__main__":
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    main(sys.argv[1:])
