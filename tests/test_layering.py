"""Dependencies point one way (docs/architecture.md): each room imports only the rooms below it. Checked on the
source, so a lazy import inside a function is caught too."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# the ground floor: plain data and knowledge, importable from every room
GROUND = ("tunectl.models", "tunectl.profile", "tunectl.yamlmodel", "tunectl.errors", "tunectl.knobs",
          "tunectl.engines", "tunectl.redact", "tunectl.stats", "tunectl.goodput", "tunectl.traces", "tunectl.workloads",
          "tunectl.datasets", "tunectl.objective", "tunectl.energy",
          "tunectl.sglang")     # SGLang's physics: flags, versions, scopes, crashes, memory

# room (folder) -> the tunectl modules it may import, and the outside modules it must not
RULES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "tunectl/sglang/crashes": (("tunectl.sglang.crashes", "tunectl.models"), ("optuna", "subprocess", "paramiko")),
    "tunectl/sglang": (("tunectl.sglang", "tunectl.models", "tunectl.profile", "tunectl.knobs", "tunectl.errors"),
                       ("optuna", "subprocess", "paramiko", "aiohttp")),
    "search": ((*GROUND, "tunectl.search"), ("subprocess", "paramiko", "aiohttp")),
    "reports": ((*GROUND, "tunectl.store", "tunectl.reports"), ("subprocess", "paramiko", "aiohttp")),
    "sim": (("tunectl.sim", "tunectl.sglang.flags", "tunectl.errors", "tunectl.yamlmodel"), ("optuna", "paramiko")),
    "runners/hosts": (("tunectl.runners.hosts", "tunectl.errors", "tunectl.profile", "tunectl.store"), ("optuna",)),
    "runners/clients": (("tunectl.runners.clients", "tunectl.runners.hosts.base", "tunectl.models", "tunectl.profile",
                         "tunectl.stats", "tunectl.goodput", "tunectl.traces", "tunectl.workloads",
                         "tunectl.datasets"),
                        ("optuna", "paramiko")),
    "runners/checks": ((*GROUND, "tunectl.runners.checks", "tunectl.runners.hosts"), ("optuna",)),
    "runners/server": ((*GROUND, "tunectl.runners"), ("optuna",)),
    "tunectl/wiring": ((*GROUND, "tunectl.store", "tunectl.launches", "tunectl.slurmspec", "tunectl.wiring",
                        "tunectl.search", "tunectl.runners", "tunectl.sim", "tunectl.sglang_patches",
                        "tunectl.REPO_ROOT", "tunectl.__version__"),
                       ("tunectl.reports", "tunectl.commands", "tunectl.cli")),
}

# the ground floor's files (tunectl/*.py but the console) and what they may import: the ground floor itself, and
# two data files of the stand-in's, named: the sim card names a profile may give (profile.py) and the tokenizer
# folder the stand-in engine serves (engines.py)
CONSOLE = ("cli.py", "__main__.py", "__init__.py", "_rooms.py")
GROUND_FILES = (*GROUND, "tunectl.store", "tunectl.launches", "tunectl.slurmspec", "tunectl.REPO_ROOT",
                "tunectl.__version__", "tunectl.sim.card.known_cards", "tunectl.sim.TOKENIZER")


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


def test_the_ground_floor_imports_only_the_ground_floor() -> None:
    bad = {}
    for path in sorted((ROOT / "tunectl").glob("*.py")):
        if path.name in CONSOLE:
            continue
        rel = str(path.relative_to(ROOT))
        names = imported_modules("tunectl")[rel]
        wrong = sorted(n for n in names if n.startswith("<relative>")
                       or (n.split(".")[0] == "tunectl" and not _within(n, GROUND_FILES)))
        if wrong:
            bad[rel] = wrong
    assert bad == {}
    # every module of the package is the console's, the ground floor's or in a room of its own
    rooms = {p.parent.name for p in (ROOT / "tunectl").glob("*/__init__.py")}
    assert rooms == {"commands", "wiring", "sglang"}


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


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """String constants in the code of `path`, docstrings left out."""
    tree = ast.parse(path.read_text(), str(path))
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_the_search_names_no_sglang_flag_its_physics_lives_in_tunectl_sglang() -> None:
    from tunectl.sglang.flags import bundled_flags
    from tunectl.sglang.versions import bundled_versions

    flags = {f.lstrip("-") for v in bundled_versions() for f in bundled_flags(v)}
    assert {"mem-fraction-static", "cuda-graph-max-bs", "kv-cache-dtype"} <= flags
    found = {f"{p.relative_to(ROOT)}:{line}": s for p in sorted((ROOT / "search").rglob("*.py"))
             for line, s in _code_strings(p) if s.lstrip("-") in flags or s.replace("_", "-") in flags}
    assert found == {}
    # the walk does see them where they live
    assert "mem-fraction-static" in {s for _, s in _code_strings(ROOT / "tunectl" / "sglang" / "memory.py")}


def _runtime_imports(path: Path) -> set[str]:
    """The tunectl modules `path` imports when it runs (at import time or in a function), those under
    `if TYPE_CHECKING:` left out: annotations only."""
    tree = ast.parse(path.read_text(), str(path))
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
            and getattr(node.test, "id", None) == "TYPE_CHECKING" for b in node.body for n in ast.walk(b)}
    out: set[str] = set()
    for n in ast.walk(tree):
        if id(n) in skip:
            continue
        if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("tunectl") and n.level == 0:
            out |= {f"{n.module}.{a.name}" for a in n.names}          # a module, or a name in one
        elif isinstance(n, ast.Import):
            out |= {a.name for a in n.names if a.name.startswith("tunectl")}
    return out


def test_the_ground_floor_has_no_import_circle() -> None:
    files = [p for p in (ROOT / "tunectl").glob("*.py") if p.name not in CONSOLE]
    files += sorted((ROOT / "tunectl" / "sglang").rglob("*.py"))
    mod = {p: "tunectl." + ".".join(p.relative_to(ROOT / "tunectl").with_suffix("").parts) for p in files}
    mod = {p: m.removesuffix(".__init__") for p, m in mod.items()}
    known = set(mod.values())
    graph = {m: {next((k for k in sorted(known, key=len, reverse=True) if i == k or i.startswith(k + ".")), None)
                 for i in _runtime_imports(p)} - {None, m} for p, m in mod.items()}
    assert graph["tunectl.profile"] >= {"tunectl.sglang.scopes"}       # the walk sees the imports

    def circle(start: str) -> list[str] | None:
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    return path + [start]
                if nxt not in path:
                    stack.append((nxt, path + [nxt]))
        return None

    assert {m: c for m in graph if (c := circle(m))} == {}


def test_docs_architecture_names_every_module() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    code = [p for folder in ("tunectl", "search", "runners", "reports", "sim", "sglang_patches")
            for p in sorted((ROOT / folder).rglob("*.py")) if "__pycache__" not in p.parts]
    assert len(code) > 100
    assert [str(p.relative_to(ROOT)) for p in code if f"`{p.relative_to(ROOT)}`" not in doc] == []
