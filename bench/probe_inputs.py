"""Bad input, probed as a user makes it: each case runs the real CLI in a scratch folder and must end with ONE line
on stderr (an `error: ...` naming what is wrong), exit 1 or 2, and no traceback. Prints a table, one row per case;
exits 1 if any case fails.

    python bench/probe_inputs.py [-k SUBSTRING] [--tunectl "CMD ..."] [--keep]

Cases: bad profile fields and files, bad --set values, bad study names, bad storage URLs, --results/--out paths
that are files or missing, read-only results folders (as root: run with CAP_DAC_OVERRIDE dropped through
`setpriv`, else skipped), damaged study.db files, bad numbers and choices on the command line. The option
parser's own errors (an unknown option, a number that is not one) are click's usage block: accepted with exit 2
when they carry no traceback ("parser" in the table). Nothing starts a server: every case fails before a launch.
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "profiles" / "sim-glm5.yaml"
LONG = "a" * 300


@dataclass
class Case:
    name: str
    argv: list[str]
    setup: Callable[[Path], None] | None = None
    codes: tuple[int, ...] = (1, 2)
    parser: bool = False                  # the option parser's usage block (several lines) is the answer
    unprivileged: bool = False            # run without root's power over read-only folders
    secret: str | None = None             # must not appear in the output
    results: bool = True                  # the command takes --results (versions does not)
    extra: dict[str, str] = field(default_factory=dict)


def profile(tmp: Path, edit: Callable[[dict], None], name: str = "bad.yaml") -> None:
    """The default profile with one mistake, on a free port (should a case ever get as far as a launch)."""
    import socket

    data = yaml.safe_load(DEFAULT.read_text())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        data["server"]["port"] = s.getsockname()[1]
    edit(data)
    (tmp / name).write_text(yaml.safe_dump(data, sort_keys=False))


def text(name: str, body: str) -> Callable[[Path], None]:
    return lambda tmp: (tmp / name).write_text(body)


def setter(path: str, value: object) -> Callable[[Path], None]:
    def edit(d: dict) -> None:
        keys = path.split(".")
        for k in keys[:-1]:
            d = d.setdefault(k, {})
        d[keys[-1]] = value
    return lambda tmp: profile(tmp, edit)


def a_study(tmp: Path, name: str = "s") -> None:
    """A finished virtual study to damage (2 trials, seconds)."""
    subprocess.run([*TUNECTL, "search", "--virtual", "--trials", "2", "--study", name, "--results",
                    str(tmp / "results")], cwd=tmp, capture_output=True, check=True, timeout=300)


def truncated_db(tmp: Path) -> None:
    a_study(tmp)
    db = tmp / "results" / "s" / "study.db"
    db.write_bytes(db.read_bytes()[: db.stat().st_size // 2])


def empty_db(tmp: Path) -> None:
    a_study(tmp)
    (tmp / "results" / "s" / "study.db").write_bytes(b"")


def read_only(tmp: Path) -> None:
    a_study(tmp)
    for p in [tmp / "results", *(tmp / "results").rglob("*")]:
        if p.is_dir():
            p.chmod(stat.S_IRUSR | stat.S_IXUSR)


def a_file(tmp: Path) -> None:
    (tmp / "afile").write_text("not a folder\n")


SV = ["search", "--virtual", "--trials", "2"]                 # fails before any trial, or runs none
DRY = ["sweep", "--dry-run"]
P = ["-p", "bad.yaml"]
CASES = [
    # profiles
    Case("profile: missing file", [*DRY, "-p", "nope.yaml"]),
    Case("profile: a folder", [*DRY, "-p", "."]),
    Case("profile: not YAML", [*DRY, *P], text("bad.yaml", "name: [1,\n")),
    Case("profile: empty", [*DRY, *P], text("bad.yaml", "")),
    Case("profile: a list", [*DRY, *P], text("bad.yaml", "- a\n- b\n")),
    Case("profile: unknown top-level key", [*DRY, *P], setter("colour", "red")),
    Case("profile: server.port not a number", [*DRY, *P], setter("server.port", "abc")),
    Case("profile: server.port out of range", [*DRY, *P], setter("server.port", 70000)),
    Case("profile: unknown server.engine", [*DRY, *P], setter("server.engine", "vllm-ish")),
    Case("profile: unknown sim card", [*DRY, *P], setter("server.sim.card", "no-such-card")),
    Case("profile: unknown host.kind", [*DRY, *P], setter("host.kind", "ftp")),
    Case("profile: unknown search.sampler", [*DRY, *P], setter("search.sampler", "genetic")),
    Case("profile: knob choices not a list", [*DRY, *P], setter("search.space.max-running-requests.choices", 5)),
    Case("profile: knob of an unknown type", [*DRY, *P], setter("search.space.max-running-requests.type", "matrix")),
    Case("profile: unknown flag in server.flags", ["sweep", "-c", "1", *P], setter("server.flags.no-such-flag", 1)),
    Case("profile: negative bench level", [*DRY, *P], setter("bench.levels", [-1])),
    Case("profile: unknown objective.metric", [*DRY, *P], setter("objective.metric", "vibes")),
    Case("profile: knob default not a choice", [*SV, *P], setter("search.space.max-running-requests.default", 99999)),
    Case("profile: bool knob default 'yes'", [*SV, *P], setter("search.space.disable-radix-cache.default", "yes")),
    Case("profile: knob step negative", [*SV, *P], setter("search.space.mem-fraction-static.step", -0.01)),
    Case("profile: try_first value not a choice", [*SV, *P],
         setter("search.try_first", [{"max-running-requests": "lots"}])),
    Case("profile: search.seed -1", [*SV, *P], setter("search.seed", -1)),
    Case("profile: no workloads", [*SV, *P], setter("bench.workloads", [])),
    Case("profile: negative SLO limit", [*SV, *P], setter("objective.slo", {"p99_ttft_ms": -5})),
    Case("profile: min_level_s above max_level_s", [*SV, *P],
         lambda t: profile(t, lambda d: d["bench"].update(min_level_s=200, max_level_s=100))),
    Case("profile: a key given twice", [*SV, *P], text("bad.yaml", "name: a\nname: b\nmodel: {path: x}\n")),
    Case("profile: not UTF-8", [*SV, *P], lambda t: (t / "bad.yaml").write_bytes(bytes(range(128, 256)))),
    Case("profile: tp-size not a number (virtual)", [*SV, *P], setter("server.flags.tp-size", "eight")),
    Case("profile: unknown flag knob (virtual)", [*SV, *P],
         setter("search.space.no-such-flag", {"type": "bool"})),
    Case("profile: server.flags.config", [*DRY, *P], setter("server.flags.config", "/tmp/other.yaml")),
    Case("profile: relative host.workdir", [*DRY, *P], setter("host.workdir", "relative/dir")),
    Case("profile: host.gpus [-1]", [*DRY, *P], setter("host.gpus", [-1])),
    Case("profile: host.port 70000", [*DRY, *P], setter("host.port", 70000)),
    Case("profile: host.min_free_disk_gb nan", [*DRY, *P], setter("host.min_free_disk_gb", float("nan"))),
    Case("profile: knob's base flag not among its choices", [*SV, *P], lambda t: profile(t, lambda d: (
        d["server"]["flags"].update({"max-running-requests": 64}),
        d["search"]["space"].update({"max-running-requests": {"type": "categorical", "choices": [128, 256]}})))),
    Case("profile: server.env name with a space", [*DRY, *P], setter("server.env", {"A B": "x"})),
    Case("profile: api-key as a knob", [*SV, *P], setter("search.space.api-key", {"type": "categorical",
                                                                                  "choices": ["k1", "k2"]})),
    Case("profile: --api-key in server.flags", [*DRY, *P], setter("server.flags", {"--api-key": "abc"})),
    # --set
    Case("--set without =", [*DRY, "--set", "max-running-requests"]),
    Case("--set with no name", [*DRY, "--set", "=5"]),
    Case("--set unknown flag", [*DRY, "--set", "max-runing-requests=5"]),
    Case("--set knob off its type", [*DRY, "--set", "mem-fraction-static=lots"]),
    Case("--set bool not a bool", [*DRY, "--set", "disable-radix-cache=maybe"]),
    Case("--set not one of the choices", [*DRY, "--set", "attention-backend=bogus"]),
    Case("--set value not YAML ([1,)", [*DRY, "--set", "context-length=[1,"]),
    Case("--set value not YAML (: :)", [*DRY, "--set", "tp-size=: :"]),
    Case("--set value a YAML tag", [*DRY, "--set", "served-model-name=!!python/object x"]),
    Case("--set config=FILE (tunectl's own)", [*DRY, "--set", "config=/etc/passwd"]),
    # study names
    Case("--study ../../x (search)", [*SV, "--study", "../../x"]),
    Case("--study with a space", [*SV, "--study", "a b"]),
    Case("--study $(id)", [*SV, "--study", "$(id)"]),
    Case("--study 300 characters (search)", [*SV, "--study", LONG]),
    Case("--study 300 characters (sweep)", ["sweep", "-c", "1", "--study", LONG]),
    Case("--study empty", [*SV, "--study", ""]),
    Case("--study unknown (trials)", ["trials", "--study", "nope"], a_study),
    Case("--study 300 characters (report)", ["report", "--study", LONG]),
    Case("--set tp-size=0 (a type SGLang takes, a size it cannot run)", ["sweep", "--dry-run", "-c", "1", "--set",
                                                                     "tp-size=0"], codes=(2,)),
    # storage URLs
    Case("--storage not a URL", [*SV, "--study", "s", "--storage", "bogus"]),
    Case("--storage unknown scheme", [*SV, "--study", "s", "--storage", "nosuchdb://u:p@h/db"]),
    Case("--storage unreachable PostgreSQL", [*SV, "--study", "s", "--storage",
                                              "postgresql://u:hunter2@127.0.0.1:1/db"], secret="hunter2"),
    Case("--storage SQLite in a missing folder", [*SV, "--study", "s", "--storage", "sqlite:////nonexistent/d/x.db"]),
    Case("--storage empty (an unset variable)", [*SV, "--study", "s", "--storage", ""], codes=(2,)),
    Case("--storage SQLite in memory", [*SV, "--study", "s", "--storage", "sqlite:///:memory:"]),
    Case("--storage SQLite without a file", [*SV, "--study", "s", "--storage", "sqlite://relative.db"]),
    Case("--storage SQLite naming a folder", [*SV, "--study", "s", "--storage", "sqlite:////tmp"]),
    Case("--storage driver not installed", [*SV, "--study", "s", "--storage", "mysql://u:hunter2@127.0.0.1:1/db"],
         secret="hunter2"),
    # paths
    Case("--results is a file (search)", [*SV, "--results", "afile"], a_file),
    Case("--results is a file (sweep)", ["sweep", "-c", "1", "--study", "s", "--results", "afile"], a_file),
    Case("--results is a file (report)", ["report", "--results", "afile"], a_file),
    Case("report --out under a file", ["report", "--study", "s", "--out", "afile/r.html"],
         lambda t: (a_study(t), a_file(t))),
    Case("export --out is a file", ["export", "--study", "s", "--out", "afile"],
         lambda t: (a_study(t), a_file(t))),
    Case("read-only results: search resume", [*SV[:2], "--trials", "3", "--study", "s"], read_only,
         unprivileged=True),
    Case("read-only results: report", ["report", "--study", "s"], read_only, unprivileged=True),
    Case("read-only results: sweep", ["sweep", "-c", "1", "--study", "sw"], read_only, unprivileged=True),
    Case("read-only results: export", ["export", "--study", "s"], read_only, unprivileged=True),
    Case("study.db half-truncated", [*SV[:2], "--trials", "3", "--study", "s"], truncated_db),
    Case("study.db 0 bytes beside trial records", [*SV[:2], "--trials", "3", "--study", "s"], empty_db),
    # numbers and choices
    Case("--trials 0", [*SV[:2], "--trials", "0"]),
    Case("--parallel 0", [*SV, "--parallel", "0"]),
    Case("--trials abc", [*SV[:2], "--trials", "abc"], parser=True),
    Case("unknown option", ["sweep", "--bogus"], parser=True),
    Case("sweep -c abc", [*DRY, "-c", "abc"]),
    Case("sweep -c 0", ["sweep", "-c", "0"]),
    Case("sweep --request-rate -1", ["sweep", "--request-rate", "-1"]),
    Case("sweep --burstiness 0", ["sweep", "-r", "1", "--burstiness", "0"]),
    Case("sweep --burstiness nan", [*DRY, "-r", "1", "--burstiness", "nan"]),
    Case("sweep --slo nan", [*DRY, "--capacity", "--slo", "p99_ttft_ms=nan"]),
    Case("sweep --slo not KEY=MS", ["sweep", "--capacity", "--slo", "foo"]),
    Case("sweep --slo not a number", ["sweep", "--capacity", "--slo", "p99_ttft_ms=abc"]),
    Case("sweep --launches 0", ["sweep", "-c", "1", "--launches", "0"]),
    Case("sweep --launches -1 (dry run)", [*DRY, "--launches", "-1"]),
    Case("sweep -c and -r together", [*DRY, "-c", "4", "-r", "2"]),
    Case("sweep --set tp-size=eight", [*DRY, "--set", "tp-size=eight"]),
    Case("search --seed -1", [*SV, "--seed", "-1"]),
    Case("sweep --client unknown", [*DRY, "--client", "curl"]),
    Case("best --format xml", ["best", "--format", "xml"], a_study),
    Case("export --format xlsx", ["export", "--format", "xlsx"], a_study),
    Case("diff of unknown studies", ["diff", "nope:1", "other"], a_study),
    Case("--warm-start an unknown study", [*SV, "--study", "new", "--warm-start", "nope"]),
    # versions
    Case("versions move --to an unknown version", ["versions", "move", "--to", "9.9"], results=False),
    Case("versions move of a YAML list", ["versions", "move", "--to", "0.5.23", "-p", "bad.yaml"],
         text("bad.yaml", "- a\n- b\n"), results=False),
]


def _unprivileged() -> list[str] | None:
    if os.geteuid() != 0:
        return []
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"] if shutil.which("setpriv") else None


def run_case(case: Case, keep: bool) -> tuple[str, int | None, int, bool, str]:
    """(verdict, exit code, stderr lines, traceback?, the first line)."""
    tmp = Path(tempfile.mkdtemp(prefix="probe-"))
    try:
        if case.setup:
            try:
                case.setup(tmp)
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
                return f"SETUP FAILED ({type(e).__name__})", None, 0, False, str(e)[:200]
        prefix = _unprivileged() if case.unprivileged else []
        if prefix is None:
            return "skipped (root without setpriv)", None, 0, False, ""
        argv = [*prefix, *TUNECTL, *case.argv]
        if case.results and "--results" not in case.argv:
            argv += ["--results", str(tmp / "results")]
        proc = subprocess.run(argv, cwd=tmp, capture_output=True, text=True, timeout=300, check=False,
                              env={**os.environ, "COLUMNS": "120", **case.extra})
        out = proc.stdout + proc.stderr
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("study: ")]
        tb = "Traceback" in out
        leaked = case.secret is not None and case.secret in out
        if case.parser:                 # click's usage block, or tunectl's one line for the parser's refusal
            ok = proc.returncode == 2 and not tb and ("Error" in proc.stderr or (len(lines) == 1 and
                                                                                lines[0].startswith("error: ")))
        else:
            ok = (proc.returncode in case.codes and not tb and len(lines) == 1 and lines[0].startswith("error: "))
        verdict = "ok" if ok and not leaked else ("secret shown" if leaked else "FAIL")
        first = lines[-1] if case.parser and lines else (lines[0] if lines else proc.stdout.strip()[:200])
        return verdict, proc.returncode, len(lines), tb, first
    finally:
        if keep:
            print(f"  kept {tmp}", file=sys.stderr)
        else:
            for p in [tmp, *tmp.rglob("*")]:
                if p.is_dir() and not p.is_symlink():
                    p.chmod(stat.S_IRWXU)
            shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    global TUNECTL
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-k", default="", help="only the cases whose name holds this")
    ap.add_argument("--tunectl", default=None, help="the command to probe (default: this Python's -m tunectl)")
    ap.add_argument("--keep", action="store_true", help="keep each case's scratch folder")
    args = ap.parse_args()
    if args.tunectl:
        TUNECTL = shlex.split(args.tunectl)
    cases = [c for c in CASES if args.k.lower() in c.name.lower()]
    rows, t0 = [], time.monotonic()
    for case in cases:
        verdict, code, n, tb, first = run_case(case, args.keep)
        rows.append((case.name, verdict, code, n, tb, first))
        print(f"{verdict:<8} exit {code!s:<4} {n} line(s){'  TRACEBACK' if tb else ''}  {case.name}: {first[:150]}",
              flush=True)
    failed = [r for r in rows if r[1] != "ok" and not r[1].startswith("skipped")]
    skipped = sum(r[1].startswith("skipped") for r in rows)
    print(f"\n{len(rows)} cases: {len(rows) - len(failed) - skipped} ok, {len(failed)} failed, {skipped} skipped "
          f"in {time.monotonic() - t0:.0f} s")
    for r in failed:
        print(f"  FAILED: {r[0]} (exit {r[2]}, {r[3]} stderr lines, traceback {r[4]}): {r[5][:300]}")
    return 1 if failed else 0


TUNECTL = [sys.executable, "-m", "tunectl"]

if __name__ == "__main__":
    sys.exit(main())
