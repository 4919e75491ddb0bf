"""Dependencies point one way: search/ never imports runners (no SSH, no processes); runners/ never imports
Optuna. Checked on the source, so a lazy import inside a function is caught too."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imported_modules(folder: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
            elif isinstance(node, ast.ImportFrom) and node.level:
                names.add(f"<relative>.{node.module or ''}")
        out[str(path.relative_to(ROOT))] = names
    return out


def test_search_never_imports_runners_or_processes() -> None:
    bad = {f: sorted(n for n in names if n.startswith(("tunectl.runners", "paramiko", "subprocess", "tunectl.trial",
                                                          "tunectl.sim")))
           for f, names in imported_modules("search").items()}
    assert not {f: n for f, n in bad.items() if n}


def test_runners_never_import_optuna() -> None:
    bad = {f: sorted(n for n in names if n.split(".")[0] == "optuna" or n.startswith("tunectl.search"))
           for f, names in imported_modules("runners").items()}
    assert not {f: n for f, n in bad.items() if n}


def test_the_walk_sees_imports() -> None:
    assert "optuna" in set().union(*imported_modules("search").values())
