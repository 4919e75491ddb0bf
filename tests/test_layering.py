"""Dependencies point one way (docs/architecture.md): each room imports only the rooms below it. Checked on the
source, so a lazy import inside a function is caught too."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# the ground floor: plain data and knowledge, importable from every room
GROUND = ("tunectl.models", "tunectl.profile", "tunectl.yamlmodel", "tunectl.errors", "tunectl.flags", "tunectl.knobs",
          "tunectl.engines", "tunectl.redact", "tunectl.crashes", "tunectl.stats", "tunectl.versions",
          "tunectl.goodput", "tunectl.traces", "tunectl.workloads", "tunectl.datasets", "tunectl.objective",
          "tunectl.scopes", "tunectl.energy")

# room (folder) -> the tunectl modules it may import, and the outside modules it must not
RULES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "tunectl/crashes": (("tunectl.crashes", "tunectl.models"), ("optuna", "subprocess", "paramiko")),
    "search": ((*GROUND, "tunectl.search"), ("subprocess", "paramiko", "aiohttp")),
    "reports": ((*GROUND, "tunectl.store", "tunectl.reports"), ("subprocess", "paramiko", "aiohttp")),
    "sim": (("tunectl.sim", "tunectl.flags", "tunectl.errors", "tunectl.yamlmodel"), ("optuna", "paramiko")),
    "runners/hosts": (("tunectl.runners.hosts", "tunectl.errors", "tunectl.profile", "tunectl.store"), ("optuna",)),
    "runners/clients": (("tunectl.runners.clients", "tunectl.runners.hosts.base", "tunectl.models", "tunectl.profile",
                         "tunectl.stats", "tunectl.goodput", "tunectl.traces", "tunectl.workloads",
                         "tunectl.datasets"),
                        ("optuna", "paramiko")),
    "runners/checks": ((*GROUND, "tunectl.runners.checks", "tunectl.runners.hosts"), ("optuna",)),
    "runners/server": ((*GROUND, "tunectl.runners"), ("optuna",)),
}


def imported_modules(folder: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.update(f"{node.module}.{a.name}" for a in node.names)     # `from tunectl import knobs`
            elif isinstance(node, ast.ImportFrom) and node.level:
                names.add(f"<relative>.{node.module or ''}")
        out[str(path.relative_to(ROOT))] = names
    return out


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def violations(folder: str, allowed: tuple[str, ...], banned: tuple[str, ...]) -> dict[str, list[str]]:
    bad = {}
    for f, names in imported_modules(folder).items():
        wrong = sorted(n for n in names if n.startswith("<relative>")
                       or (n.split(".")[0] == "tunectl" and not _within(n, allowed)) or _within(n, banned))
        if wrong:
            bad[f] = wrong
    return bad


def test_each_room_imports_only_what_docs_architecture_allows() -> None:
    assert {room: v for room, (allowed, banned) in RULES.items() if (v := violations(room, allowed, banned))} == {}


def test_runners_never_import_optuna_or_the_search() -> None:
    assert violations("runners", ("tunectl.runners", *GROUND, "tunectl.store"), ("optuna",)) == {}


def test_the_rules_cover_every_room_and_the_walk_sees_imports() -> None:
    rooms = {p.parent.relative_to(ROOT).as_posix() for p in ROOT.glob("runners/*/__init__.py")}
    assert rooms <= set(RULES)
    assert "optuna" in {n.split(".")[0] for n in set().union(*imported_modules("search").values())}
    assert "tunectl.runners.hosts.base.ProcHandle" in set().union(*imported_modules("runners/server").values())
    assert "tunectl.knobs" in set().union(*imported_modules("search").values())


def test_a_forbidden_import_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "search").mkdir()
    (tmp_path / "search" / "bad.py").write_text("def f():\n    from tunectl.runners.hosts import ssh\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    allowed, banned = RULES["search"]
    assert violations("search", allowed, banned) == {"search/bad.py": ["tunectl.runners.hosts.ssh"]}
