"""`search.policy` (search/policy.py): the search's own proposers and vetoes as data a profile changes. A profile that
switches the walk's proposers off runs, never queues a walk step, and the study records the policy it ran with; the
same study with the default policy does walk; a bad rule name is one clear line."""
from __future__ import annotations

import json
from pathlib import Path

import optuna
import yaml
from typer.testing import CliRunner

from tunectl import REPO_ROOT
from tunectl.cli import app
from tunectl.profile import PROPOSERS, VETOES
from tunectl.search.policy import RULES, as_dict


def _search(tmp_path: Path, name: str, policy: dict | None) -> tuple[dict, dict, list[str]]:
    data = yaml.safe_load((Path(REPO_ROOT) / "profiles" / "sim-glm5.yaml").read_text())
    if policy is not None:
        data["search"]["policy"] = policy
    prof = tmp_path / f"{name}.yaml"
    prof.write_text(yaml.safe_dump(data))
    root = tmp_path / "results"
    res = CliRunner().invoke(app, ["search", "-p", str(prof), "--virtual", "--json", "-n", "16", "--study", name,
                                   "--results", str(root)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output[-2000:]
    out = json.loads(res.stdout[res.stdout.index("{"):])
    study = json.loads((root / name / "study.json").read_text())
    trials = optuna.load_study(study_name=name, storage=f"sqlite:///{root / name / 'study.db'}").trials
    return out, study, [str(t.user_attrs.get("proposed_by")) for t in trials]


def test_a_profile_switching_the_walk_off_runs_without_it_and_the_study_records_it(tmp_path: Path) -> None:
    repairs_only = [p for p in PROPOSERS if RULES[p].kind == "repair"]
    out, study, by = _search(tmp_path, "no-walk", {"proposers": repairs_only})
    assert study["profile"]["search"]["policy"]["proposers"] == repairs_only
    assert out["policy"] == {"proposers": repairs_only, "vetoes": list(VETOES), "off": ["split", "local"]}
    assert out["best"] is not None and "local" not in by
    default, _, by_default = _search(tmp_path, "default", None)
    assert default["policy"]["off"] == [] and "local" in by_default      # the switch is what removed the walk


def test_the_policy_lists_every_rule_once_in_its_order() -> None:
    assert tuple(RULES) == (*PROPOSERS, *VETOES)
    assert all(r.does for r in RULES.values())
    from tunectl.profile import Policy
    pol = Policy(proposers=["local", "load_repair"], vetoes=[])
    assert as_dict(pol)["off"] == ["kv_pressure", "startup_repair", "log_hint", "split", *VETOES]


def test_a_bad_rule_name_is_one_line_naming_the_field_and_the_choices(tmp_path: Path) -> None:
    data = yaml.safe_load((Path(REPO_ROOT) / "profiles" / "sim-glm5.yaml").read_text())
    data["search"]["policy"] = {"proposers": ["local", "walk_far"]}
    prof = tmp_path / "bad.yaml"
    prof.write_text(yaml.safe_dump(data))
    res = CliRunner().invoke(app, ["search", "-p", str(prof), "--virtual", "-n", "4", "--results",
                                   str(tmp_path / "r")], env={"COLUMNS": "200"})
    assert res.exit_code != 0 and "Traceback" not in res.output
    line = next(x for x in res.output.splitlines() if "walk_far" in x)
    assert "bad.yaml" in line and "search.policy.proposers" in line and "load_repair" in line and "local" in line
