"""`tunectl versions`: the bundled SGLang versions, what changed between two, a profile moved to another one, and
a new version's --help and config refusals read from a host (or an unpacked SGLang wheel)."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.table import Table

from tunectl.sglang import versions as V
from tunectl.cli import app
from tunectl.commands._common import console, err_console, get_profile, one_line_errors, show_table
from tunectl.errors import RunnerError, UsageError
from tunectl.sglang.flags import HELP_DIR, bundled_flags, config_refused, flag_index

cmd = typer.Typer(help="SGLang versions: bundled --help texts, renames and removals, moving a profile.",
                  invoke_without_command=True)
app.add_typer(cmd, name="versions")


@cmd.callback()
@one_line_errors
def listing(ctx: typer.Context) -> None:
    """The bundled versions: flags, deprecated flags, options the --config file refuses."""
    if ctx.invoked_subcommand:
        return
    t = Table(title=f"bundled SGLang --help texts ({HELP_DIR.name}/)")
    for col in ("version", "flags", "deprecated", "refused by --config"):
        t.add_column(col, justify="left" if col == "version" else "right")
    for v in V.bundled_versions():
        refused = config_refused(v)
        t.add_row(v, str(len(bundled_flags(v))), str(len(V.deprecations(v))), str(len(refused)) if refused else "-")
    show_table(t, keep=("version",))


@cmd.command()
@one_line_errors
def diff(old: str, new: str) -> None:
    """Flags of OLD renamed, removed or deprecated in NEW, and the flags NEW adds."""
    try:
        flags_old, flags_new = bundled_flags(old), bundled_flags(new)
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None
    renamed, removed = [], []
    known = flag_index(flags_new)
    for name in flags_old:
        if name in known:
            continue
        try:
            moved = V.translate(name, V.ANY if flags_old[name].takes_value else True, old, new)
            renamed.append(f"--{name} -> {', '.join(f'--{n}' for n in moved.flags)}")
        except V.FlagGone:
            removed.append(f"--{name}")
    added = sorted(n for n in flags_new if n not in flag_index(flags_old))
    dep = [d.describe() for n, d in V.deprecations(new).items() if n in flags_old]
    for title, rows in ((f"renamed ({len(renamed)})", renamed), (f"removed ({len(removed)})", removed),
                        (f"deprecated in {new} ({len(dep)})", dep), (f"new in {new} ({len(added)})",
                                                                     [f"--{a}" for a in added])):
        console.print(f"[bold]{title}[/bold]")
        for r in rows:
            console.print(f"  {r}", highlight=False, markup=False)


ProfileOpt = Annotated[Path | None, typer.Option("--profile", "-p", help="profile YAML (default: sim-glm5)")]


@cmd.command()
@one_line_errors
def move(to: Annotated[str, typer.Option("--to", help="the SGLang version to move to")], profile: ProfileOpt = None,
         out: Annotated[Path | None, typer.Option("--out", help="write the moved profile here (default: print)")]
         = None) -> None:
    """The profile as SGLang TO spells it: flags and knobs renamed, patches not for TO dropped; notes on stderr."""
    from tunectl.wiring.migrate import move_profile
    from tunectl.yamlmodel import read_yaml

    known = V.bundled_versions()
    if to not in known:
        raise UsageError(f"--to {to}: no bundled --help text for SGLang {to}; bundled: {', '.join(known)} "
                         "(tunectl versions add reads one from a host)")
    prof = get_profile(profile)            # one line for a file that is no profile (not YAML, a list, bad fields)
    path = str(prof.source or profile)
    src = prof.server.sglang_version
    if src not in known:
        raise UsageError(f"{path}: server.sglang_version: {src!r}: no bundled --help text to move from; bundled: "
                         f"{', '.join(known)}")
    data, _ = read_yaml(path, "profile")
    try:
        moved, notes = move_profile(data, to)
    except V.FlagGone as e:
        raise UsageError(f"{path}: {e}") from None
    for n in notes:
        err_console.print(f"  {n}", highlight=False, markup=False)
    text = yaml.safe_dump(moved, sort_keys=False)
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text)
        err_console.print(f"{path} on SGLang {to}: {out} ({len(notes)} changes)", highlight=False)


@cmd.command()
@one_line_errors
def add(profile: ProfileOpt = None,
        source: Annotated[Path | None, typer.Option("--source", help="an unpacked SGLang package folder (the one "
                                                    "holding srt/): only its --config refusals")] = None,
        version: Annotated[str | None, typer.Option("--version", help="the version (default: the host's)")] = None
        ) -> None:
    """Read a new SGLang version's `launch_server --help` and its parser's --config refusals from the profile's
    host (or an unpacked wheel with --source) into tunectl's bundled texts."""
    from tunectl.sglang.source import PARSER_FILES, record, refused

    if source is not None:
        if not version:
            raise UsageError("--source needs --version (the SGLang version of that folder)")
        files = [source / PARSER_FILES[0], *sorted((source / PARSER_FILES[1]).rglob("*.py"))]
        if not files[0].is_file():
            raise UsageError(f"--source {source}: no {PARSER_FILES[0]} there (give the sglang package folder)")
        texts = {str(p.relative_to(source)): p.read_text() for p in files}
        help_text = None
    else:
        prof = get_profile(profile)
        if prof.server.engine == "sim":
            raise UsageError(f"{prof.source or prof.name}: server.engine: sim: the stand-in's --help is not a "
                             "real SGLang version's, and the bundled texts are read from real SGLang; give a "
                             "profile with server.engine: sglang on the host that has the new version, or --source")
        version, help_text, texts = _from_host(prof, version)
    if not _VERSION.fullmatch(version):
        raise UsageError(f"--version {version!r}: a version is letters, digits, '.', '+' and '-' (e.g. 0.5.24, "
                         "0.5.24rc1): it names the files written beside the bundled ones")
    dests = refused(texts)
    (HELP_DIR / f"launch_server-{version}.config.json").write_text(json.dumps(record(version, dests), indent=1) + "\n")
    if help_text is not None:
        (HELP_DIR / f"launch_server-{version}.txt").write_text(help_text)
    console.print(f"SGLang {version}: {len(dests)} options the --config file refuses"
                  + (f", {len(bundled_flags(version))} flags" if help_text else "") + f", written to {HELP_DIR}",
                  highlight=False)


_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+-]{0,63}")

_PROBE = """import importlib.metadata as m, importlib.util as u, json, pathlib
d = pathlib.Path(u.find_spec('sglang').submodule_search_locations[0])
files = [d / 'srt/server_args.py', *sorted((d / 'srt/arg_groups').rglob('*.py'))]
print(json.dumps({'version': m.version('sglang'),
                  'files': {str(p.relative_to(d)): p.read_text() for p in files if p.is_file()}}))"""


def _from_host(prof, version: str | None) -> tuple[str, str, dict[str, str]]:  # type: ignore[no-untyped-def]
    """The host's SGLang version, its --help (run there) and its parser source (read there, not imported)."""
    from tunectl.runners.checks.flagcheck import help_argv
    from tunectl.wiring.study import make_runner

    runner = make_runner(prof)
    res = runner.run([prof.server.python, "-c", _PROBE], timeout=120)
    if not res.ok:
        raise RunnerError(f"{runner.name}: cannot read SGLang's parser source", [prof.server.python, "-c", "..."],
                          res.exit_code, res.tail)
    found = json.loads(res.stdout)
    helped = runner.run(help_argv(prof), timeout=300)
    if not helped.ok or "--" not in helped.stdout:
        raise RunnerError(f"{runner.name}: `{' '.join(help_argv(prof))}` failed", help_argv(prof),
                          helped.exit_code, helped.tail)
    return version or found["version"], helped.stdout, found["files"]
