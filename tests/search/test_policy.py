"""`search.policy` (search/policy.py): the search's own proposers and vetoes as data a profile changes, each rule one
module of search/rules/ behind one interface. A profile that switches the walk's proposers off runs, never queues
a walk step, and the study records the policy it ran with; the same study with the default policy does walk; the
search asks exactly the rule objects the policy names, in its order; a bad rule name is one clear line."""
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


def test_each_rule_is_one_module_with_one_interface() -> None:
    import importlib
    import pkgutil

    from tunectl.search import rules
    mods = [m.name for m in pkgutil.iter_modules(rules.__path__) if m.name != "base" and not m.name.startswith("_")]
    assert sorted(mods) == sorted(RULES)                   # a module per rule, named after it
    for name in mods:
        rule = importlib.import_module(f"tunectl.search.rules.{name}").RULE
        assert rule.name == name and rule.does and isinstance(rule.constants, tuple)
        assert callable(getattr(rule, "check" if rule.kind == "veto" else "propose"))
        for const in rule.constants:                       # the constants it names exist where the search keeps them
            assert any(hasattr(importlib.import_module(m), const) for m in (
                f"tunectl.search.rules.{name}", "tunectl.search.steps", "tunectl.search.sampler",
                "tunectl.search.trials")), (name, const)


def test_the_search_asks_the_rules_the_policy_names_in_its_order(tmp_path: Path, monkeypatch) -> None:
    from tunectl.search import rules
    asked: list[str] = []

    class Recording:
        def __init__(self, rule):
            self.rule = rule
            self.name, self.kind, self.does, self.constants = rule.name, rule.kind, rule.does, rule.constants

        def propose(self, ctx):
            asked.append(self.name)
            return self.rule.propose(ctx)

        def check(self, params, ctx):
            asked.append(self.name)
            return self.rule.check(params, ctx)

    for table in (rules.PROPOSERS, rules.VETOES):
        for name, rule in list(table.items()):
            monkeypatch.setitem(table, name, Recording(rule))
    from tunectl.search.steps import Steps
    real_next = Steps.next

    def next_round(self, trials):
        asked.append("|")                                  # one round of asking: one Steps.next
        return real_next(self, trials)

    monkeypatch.setattr(Steps, "next", next_round)
    order = ["log_hint", "local", "load_repair"]
    _search(tmp_path, "asked", {"proposers": order, "vetoes": ["foresight"]})
    assert set(asked) - {"|"} <= {*order, "foresight"}    # nothing the policy left out was asked
    rounds = [[n for n in r.split(",") if n and n != "foresight"] for r in ",".join(asked).split("|")]
    asking = [r for r in rounds if r]
    assert asking and {"log_hint", "local"} <= {n for r in asking for n in r}
    for r in asking:                                       # each round asks a prefix of the policy's order
        assert r == order[:len(r)], r


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
