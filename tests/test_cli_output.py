"""What a user reads at the terminal: tables whole at 80 columns and when piped (whatever COLUMNS says), names
printed as written (no emoji, no markup), YAML errors naming file and line, `--version`, the default study said
out loud, `tunectl studies`."""
from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

from tests.reports.fixtures import build_search_study, build_sweep
from tunectl.cli import app
from tunectl.commands._common import show_table


def cli(*args: str, columns: str | None = "80") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = columns
    return subprocess.run([sys.executable, "-m", "tunectl", *args], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("results")
    build_search_study(root, name="glm5-search-with-a-rather-long-study-name")
    build_sweep(root, name="sweep-20261203-101500")          # written last: the latest study, but a sweep
    return root


@pytest.mark.parametrize("columns", ["80", "40", None])
def test_piped_tables_are_whole_whatever_columns_says(root: Path, columns: str | None) -> None:
    res = cli("trials", "--results", str(root), columns=columns)
    assert res.returncode == 0, res.stderr
    assert "…" not in res.stdout and "..." not in res.stdout
    assert "disable-cuda-graph=true max-running-requests=1024 moe-runner-backend=flashinfer_cutlass" in res.stdout
    assert "glm5-search-with-a-rather-long-study-name: 11 trials" in res.stdout
    assert "load_crash @c=512" in res.stdout


def test_names_and_numbers_stay_whole_at_an_80_column_terminal() -> None:
    out = io.StringIO()
    term = Console(file=out, force_terminal=True, width=80, color_system=None)
    tab = Table()
    for col in ("study", "notes", "tok/s"):
        tab.add_column(col, justify="right" if col == "tok/s" else "left", overflow="fold")
    tab.add_row("glm5-nvfp4-8x-rtx-pro-6000-march-baseline", "words " * 20, "1,262,144.5")
    show_table(tab, keep=("study",), out=term)
    text = out.getvalue()
    assert "glm5-nvfp4-8x-rtx-pro-6000-march-baseline" in text and "1,262,144.5" in text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_default_study_is_the_latest_search_said_out_loud(root: Path) -> None:
    res = cli("best", "--results", str(root))
    assert res.returncode == 0, res.stderr
    assert "study: glm5-search-with-a-rather-long-study-name (the latest search" in res.stderr
    assert res.stdout.startswith("# glm5-search-with-a-rather-long-study-name: trial")
    sweep = cli("best", "--study", "sweep-20261203-101500", "--results", str(root))    # best of a sweep works
    assert sweep.returncode == 0 and "sweep-20261203-101500: trial 0" in sweep.stdout, sweep.stderr


def test_studies_lists_every_study_and_marks_the_default(root: Path) -> None:
    res = cli("studies", "--results", str(root))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    row = next(line for line in lines if "glm5-search-with-a-rather-long-study-name" in line)
    assert "(default)" in row and "search" in row and " 11 " in row
    assert any("sweep-20261203-101500" in line and "sweep" in line for line in lines)


def test_names_print_as_written_no_emoji_no_markup(tmp_path: Path) -> None:
    build_sweep(tmp_path, name="study")
    res = CliRunner().invoke(app, ["trials", "--study", "study:smile:[bold]x[/bold]", "--results", str(tmp_path)])
    assert res.exit_code == 2
    assert "'study:smile:[bold]x[/bold]'" in res.output and "😄" not in res.output


def test_yaml_errors_name_file_and_line_and_no_none(tmp_path: Path) -> None:
    bad = tmp_path / "p.yaml"
    bad.write_text("name: x\nmodel:\n  path: m\n server: {}\n")
    res = CliRunner().invoke(app, ["sweep", "--dry-run", "-p", str(bad)])
    assert res.exit_code == 2
    assert f"{bad}:4: not valid YAML" in res.output and "None" not in res.output
    bad.write_text("model:\n  path: m\n")
    res = CliRunner().invoke(app, ["sweep", "--dry-run", "-p", str(bad)])
    assert res.exit_code == 2 and f"{bad}:1: name: missing key" in res.output and "None" not in res.output


def test_version_names_the_interpreter() -> None:
    from tunectl import __version__

    res = cli("--version")
    assert res.returncode == 0 and res.stdout.startswith(f"tunectl {__version__} ")
    assert sys.executable in res.stdout


@pytest.mark.parametrize(("args", "names"), [
    (("search", "--trials", "abc"), ("tunectl search", "--trials", "integer")),
    (("serch",), ("tunectl", "serch", "search")),                         # with its did-you-mean
    (("search", "--bogus"), ("tunectl search", "--bogus")),
    (("sweep", "-c"), ("tunectl sweep", "-c", "requires an argument")),
])
def test_a_usage_error_is_one_line_naming_what_was_wrong(args: tuple[str, ...], names: tuple[str, ...]) -> None:
    res = cli(*args)
    assert res.returncode == 2 and res.stdout == ""
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--help" in lines[0], res.stderr
    assert all(n in lines[0] for n in names), lines[0]
    assert "Traceback" not in res.stderr and "╭" not in res.stderr


def test_no_arguments_print_the_help_and_no_error_line() -> None:
    res = cli()
    assert res.returncode == 2 and "Usage: tunectl" in res.stdout and "search" in res.stdout
    assert "error" not in res.stderr
