"""The command line. The CLI owns the console: library code reports through callbacks, never prints.

Each command family lives in tunectl/commands/<name>.py and registers itself on `app`.
"""
from __future__ import annotations

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Unattended, crash-aware tuning of SGLang server flags.")


def _register() -> None:
    import importlib
    import pkgutil

    from tunectl import commands

    for mod in sorted(m.name for m in pkgutil.iter_modules(commands.__path__)):
        if not mod.startswith("_"):
            importlib.import_module(f"tunectl.commands.{mod}")


_register()

if __name__ == "__main__":
    app()
