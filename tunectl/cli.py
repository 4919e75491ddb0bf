"""The command line. The CLI owns the console: library code reports through callbacks, never prints.

Each command family lives in tunectl/commands/<name>.py and registers itself on `app`.
"""
from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Unattended, crash-aware tuning of SGLang server flags.")


def _version(value: bool) -> None:
    if value:
        import sys

        from tunectl import __version__

        print(f"tunectl {__version__} (Python {sys.version.split()[0]} at {sys.executable})")
        raise typer.Exit()


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="print the version and the interpreter, then exit")] = False
          ) -> None:
    """Unattended, crash-aware tuning of SGLang server flags."""
    from tunectl.commands._common import stop_on_terminate

    stop_on_terminate()


def _register() -> None:
    import importlib
    import pkgutil

    from tunectl import commands

    for mod in sorted(m.name for m in pkgutil.iter_modules(commands.__path__)):
        if not mod.startswith("_"):
            importlib.import_module(f"tunectl.commands.{mod}")


_register()


def _command_path(args: list[str]) -> str:
    """`tunectl <command>` for the command named in `args` (an error raised before its context exists)."""
    group = typer.main.get_command(app)
    names = set(getattr(group, "commands", {}))
    first = next((a for a in args if not a.startswith("-")), None)
    return f"tunectl {first}" if first in names else "tunectl"


def main() -> None:
    """The `tunectl` command: `app`, with a usage error (an unknown command or option, a value of the wrong type, a
    missing argument) as one line, like every other bad input, instead of the framed block typer prints."""
    import sys

    try:
        code = app(prog_name="tunectl", standalone_mode=False)
    except typer.Abort:
        print("error: aborted", file=sys.stderr)
        sys.exit(1)
    except Exception as e:
        kinds = {c.__name__ for c in type(e).__mro__}    # typer's click (vendored or not): ClickException & co.
        if "ClickException" not in kinds:
            raise
        msg = " ".join(e.format_message().split())      # type: ignore[attr-defined]
        ctx = getattr(e, "ctx", None)
        if not msg:                                     # no arguments: the help was the answer
            sys.exit(getattr(e, "exit_code", 2))
        if "UsageError" in kinds:
            where = ctx.command_path if ctx is not None else _command_path(sys.argv[1:])
            msg = f"{where}: {msg} (see '{where} --help')"
        print(f"error: {msg}", file=sys.stderr)
        sys.exit(getattr(e, "exit_code", 2))
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":            # `python -m tunectl.cli`: the commands registered on the imported module
    from tunectl.cli import main as _main

    _main()
