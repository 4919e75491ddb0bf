"""`search.pool` is a policy a profile switches (search/pooling.py): the study records which one it ran with, the
race's rule says it, and with pooling off every finalist is ranked on its own launches' mean."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tunectl import REPO_ROOT
from tunectl.cli import app


def _search(tmp_path: Path, pool: bool) -> tuple[dict, dict]:
    data = yaml.safe_load((Path(REPO_ROOT) / "profiles" / "sim-glm5.yaml").read_text())
    data.setdefault("search", {})["pool"] = pool
    prof = tmp_path / f"pool-{pool}.yaml"
    prof.write_text(yaml.safe_dump(data))
    root = tmp_path / "results"
    res = CliRunner().invoke(app, ["search", "-p", str(prof), "--virtual", "--json", "-n", "16", "--study",
                                   f"pool-{pool}", "--results", str(root)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output[-2000:]
    out = json.loads(res.stdout[res.stdout.index("{"):])
    study = json.loads((root / f"pool-{pool}" / "study.json").read_text())
    return out, study


@pytest.mark.parametrize("pool", [True, False])
def test_the_study_records_the_pooling_it_ran_with(tmp_path: Path, pool: bool) -> None:
    out, study = _search(tmp_path, pool)
    assert study["profile"]["search"]["pool"] is pool
    race = out["best"]["race"]
    raced = [f for f in out["finalists"] if f["launches"] >= 2]
    assert raced and out["best"]["confirmed_value"] in [f["score"] for f in raced]
    if pool:
        assert "pooled" in race["rule"] and race["misfit"] is not None
        assert any(abs(f["estimate"] - f["score"]) > 1e-6 * f["score"] for f in out["finalists"])
    else:
        assert "pooled" not in race["rule"] and race["misfit"] is None
        assert all(f["estimate"] == f["score"] for f in out["finalists"])
        win = max(raced, key=lambda f: f["score"])
        assert out["best"]["trial"] == win["trial"]         # the best mean of two or more launches
