"""The Runner conformance suite on SlurmRunner against a real Slurm (slurmctld + slurmd started by the tests), plus
what only Slurm can show: a detached run is a job holding its GPUs, found again from its directory, cancelled by
its id only."""
from __future__ import annotations

import pytest

from tests.runners.conformance import *
from tests.runners.conformance import finish, py, start, wait_for
from tests.runners.slurm_cluster import GPUS, PARTITION
from tunectl.profile import HostSpec
from tunectl.runners.hosts import slurm_jobs as jobs
from tunectl.runners.hosts.slurm import SlurmRunner

pytestmark = pytest.mark.slurm


def slurm_host(shared: str, **kw) -> HostSpec:
    return HostSpec(kind="slurm", workdir=f"{shared}/node", slurm={"shared_dir": shared, "partition": PARTITION,
                                                                  "time_limit": "10:00", **kw})


@pytest.fixture
def runner_factory(slurm, tmp_path):
    made = []

    def make(**kw):
        made.append(SlurmRunner(slurm_host(str(tmp_path)), gpus=kw.pop("gpus", 0), start_wait_s=60))
        return made[-1]

    yield make
    for r in made:
        r.close()


@pytest.fixture
def runner(runner_factory):
    return runner_factory()


# ---------------------------------------------------------------------------------------------- Slurm only

def test_a_detached_run_is_a_job_holding_its_gpus(runner_factory, workdir):
    r = runner_factory(gpus=2)
    h = start(r, workdir, py("import os; print('CVD', os.environ.get('CUDA_VISIBLE_DEVICES'))"))
    assert finish(r, h) == 0
    assert wait_for(lambda: r.state(h.extra["job_id"], fresh=True).state == "COMPLETED", timeout=20)
    assert r.state(h.extra["job_id"]).kind == "done"
    visible = r.read_file(h.log_path).decode().split()[-1]
    assert len(visible.split(",")) == 2                     # the job's two GPUs, handed out by Slurm
    again = r.attach(h.run_id, h.dir)                        # found again from its directory
    assert again.extra["job_id"] == h.extra["job_id"] and again.pgid == h.pgid


def test_cancel_is_by_job_id_and_touches_nothing_else(runner, workdir, slurm):
    a = start(runner, workdir, py("import time; time.sleep(60)"), name="a")
    b = start(runner, workdir, py("import time; time.sleep(60)"), name="b")
    try:
        runner.cancel(a)
        assert wait_for(lambda: runner.poll(a) is not None, timeout=20)
        assert runner.state(a.extra["job_id"], fresh=True).state == "CANCELLED"
        assert runner.poll(b) is None and runner.state(b.extra["job_id"], fresh=True).kind == "running"
    finally:
        runner.cancel(b)


def test_state_kinds():
    kinds = {s: jobs.JobInfo("1", s).kind for s in ("PENDING", "RUNNING", "COMPLETED", "FAILED", "TIMEOUT",
                                                      "NODE_FAIL", "PREEMPTED", "CANCELLED by 0", "GONE")}
    assert kinds == {"PENDING": "waiting", "RUNNING": "running", "COMPLETED": "done", "FAILED": "done",
                     "TIMEOUT": "infra", "NODE_FAIL": "infra", "PREEMPTED": "infra", "CANCELLED by 0": "infra",
                     "GONE": "gone"}


# ---------------------------------------------------------------------------------------------- tunectl check

def check_profile(tmp_path, **slurm_kw):
    import yaml

    from tunectl import REPO_ROOT

    data = yaml.safe_load(open(f"{REPO_ROOT}/profiles/parallel-sim-llama70b-8xh100.yaml").read())
    (tmp_path / "shared").mkdir(exist_ok=True)
    data["host"] = {"kind": "slurm", "workdir": str(tmp_path / "node"),
                    "slurm": {"shared_dir": str(tmp_path / "shared"), "partition": PARTITION, **slurm_kw}}
    path = tmp_path / "slurm.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def check_rows(tmp_path, **slurm_kw):
    from typer.testing import CliRunner

    from tunectl.cli import app

    res = CliRunner().invoke(app, ["check", "-p", str(check_profile(tmp_path, **slurm_kw))],
                             env={"COLUMNS": "250"})
    rows = {}
    for line in res.output.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) > 3 and cells[2] in ("pass", "FAIL"):
            rows.setdefault(cells[1], cells[2])
    return res, rows


def test_check_a_slurm_profile(slurm, tmp_path):
    res, rows = check_rows(tmp_path)
    assert res.exit_code == 0, res.output
    assert {k: rows.get(k) for k in ("partition", "account", "gpus", "shared_dir", "tunectl", "python", "sglang")} \
        == dict.fromkeys(("partition", "account", "gpus", "shared_dir", "tunectl", "python", "sglang"), "pass")
    assert not list((tmp_path / "shared").iterdir())          # the probe file is gone again


def test_check_names_what_the_cluster_lacks(slurm, tmp_path):
    res, rows = check_rows(tmp_path, partition="nosuchpartition")
    assert res.exit_code != 0 and rows.get("partition") == "FAIL" and "python" not in rows   # no job ran
    assert "nosuchpartition" in res.output
    res, rows = check_rows(tmp_path, gpus_per_trial=GPUS + 4)
    assert rows.get("gpus") == "FAIL" and rows.get("partition") == "pass" and "python" not in rows
    assert f"has {GPUS}" in res.output


def test_sweep_on_a_slurm_profile_is_one_line(tmp_path):
    from typer.testing import CliRunner

    from tunectl.cli import app

    res = CliRunner().invoke(app, ["sweep", "-p", str(check_profile(tmp_path)), "-c", "1"])
    assert res.exit_code == 2 and "tunectl sweep needs host.kind local or ssh" in res.output
    assert "Traceback" not in res.output


def test_profile_mistakes_are_one_line(tmp_path):
    from typer.testing import CliRunner

    from tunectl.cli import app

    for kw, words in (({"time_limit": "soon"}, "time_limit 'soon'"), ({"sbatch_options": ["exclusive"]},
                      "sbatch_options 'exclusive'"), ({"shared_dir": "rel/dir"}, "absolute path")):
        res = CliRunner().invoke(app, ["check", "-p", str(check_profile(tmp_path, **kw))])
        assert res.exit_code == 2 and words in res.output and "Traceback" not in res.output, res.output
