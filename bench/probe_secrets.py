"""Secrets grep: run tunectl as a user would with secrets in play, then search every place it writes or prints.

Three secrets, each a distinct string:
    env     the profile's `server.env: {SGLANG_API_KEY: ${PROBE_API_KEY}}`, taken from the environment
    --set   `sweep --set api-key=SECRET` (refused: a secret is never given on the command line)
    URL     the password of `--storage postgresql://probe:SECRET@127.0.0.1:9/db` (unreachable: one line)

What runs (on the SGLang stand-in): a dry run, a sweep, a search, the refused `--set`, the storage URL, `trials`,
`best` (command, yaml, json), `report`, `export`, `diff`; a sweep and a search killed with -9 mid-ladder (their host
trial directories hold `env` until a rerun or `check --stop-leftovers` cleans them), then that rerun and that
check. Then a byte grep of results/ (study.db, report.html included), the host workdir and every line printed.

Usage: python bench/probe_secrets.py        (prints a table of places x secrets: hits, 0 expected everywhere)
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_kill import make_profile, our_processes  # noqa: E402

SECRETS = {"env": "pRoBe-EnV-sEcReT-4b1d", "--set": "pRoBe-SeT-sEcReT-9c2e", "URL": "pRoBe-UrL-sEcReT-7a5f"}


def commands(profile: Path, results: Path) -> list[list[str]]:
    p, r = ["-p", str(profile)], ["--results", str(results)]
    url = f"postgresql://probe:{SECRETS['URL']}@127.0.0.1:9/db"
    return [
        ["sweep", *p, *r, "-c", "1,4", "--dry-run"],
        ["sweep", *p, *r, "-c", "1,4", "--study", "sw"],
        ["sweep", *p, *r, "-c", "1", "--set", f"api-key={SECRETS['--set']}", "--study", "sw-set"],
        ["sweep", *p, *r, "-c", "1", "--set", f"admin-api-key={SECRETS['--set']}", "--dry-run"],
        ["search", *p, *r, "--trials", "2", "--study", "se"],
        ["search", *p, *r, "--trials", "1", "--study", "pg", "--storage", url],
        ["trials", *r, "--study", "se"],
        ["best", *r, "--study", "se", "--format", "command"],
        ["best", *r, "--study", "se", "--format", "yaml"],
        ["best", *r, "--study", "se", "--format", "json"],
        ["report", *r, "--study", "se", "--out", str(results / "se" / "report.html")],
        ["export", *r, "--study", "se"],
        ["diff", *r, "se:0", "se:1"],
    ]


def killed(profile: Path, results: Path) -> list[list[str]]:
    """Runs kill -9'd mid-ladder (bench/probe_kill.py's child), then what cleans up after them."""
    p, r = ["-p", str(profile)], ["--results", str(results)]
    kill = [sys.executable, str(Path(__file__).with_name("probe_kill.py")), "--child", "mid-ladder", "0", "--"]
    return [[*kill, "sweep", *p, *r, "-c", "1,4", "--study", "sw-killed"],
            ["check", *p, *r, "--stop-leftovers", "--yes"],
            [*kill, "search", *p, *r, "--trials", "2", "--study", "se-killed"],
            ["search", *p, *r, "--trials", "2", "--study", "se-killed"]]


def hits(data: bytes) -> dict[str, int]:
    return {name: data.count(s.encode()) for name, s in SECRETS.items()}


def tree_hits(root: Path) -> dict[str, int]:
    total = dict.fromkeys(SECRETS, 0)
    for p in root.rglob("*") if root.is_dir() else []:
        if p.is_file():
            for k, v in hits(p.read_bytes()).items():
                total[k] += v
    return total


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="probe-secrets-") as tmp:
        work = Path(tmp)
        profile, results = make_profile(work), work / "results"
        env = {**os.environ, "PROBE_API_KEY": SECRETS["env"], "COLUMNS": "200"}
        printed, codes = b"", []
        runs = commands(profile, results) + killed(profile, results)
        for i, argv in enumerate(runs):
            full = argv if argv[0] == sys.executable else [sys.executable, "-m", "tunectl", *argv]
            res = subprocess.run(full, cwd=work, env=env, capture_output=True, timeout=900)
            printed += res.stdout + res.stderr
            codes.append(f"{argv[0] if argv[0] != sys.executable else 'kill -9 ' + argv[6]}={res.returncode}")
            if i == len(commands(profile, results)):       # the killed sweep's server and `env` are still there
                control = tree_hits(work / "host")
        rows = {"results/ (study.db, trial files, report, export)": tree_hits(results),
                "host trial directories": tree_hits(work / "host"),
                "terminal (stdout + stderr of every command)": hits(printed)}
        left = our_processes(work)
        for pid in left:                        # never leave a probe's server behind, whatever happened
            os.kill(pid, signal.SIGKILL)
    print("commands (exit codes): " + ", ".join(codes))
    print("| where | " + " | ".join(f"{k} secret" for k in SECRETS) + " |")
    print("|---|" + "---|" * len(SECRETS))
    for where, h in rows.items():
        print(f"| {where} | " + " | ".join(str(h[k]) for k in SECRETS) + " |")
    print("| control: host trial directory of the sweep killed mid-ladder, before `check --stop-leftovers` | "
          + " | ".join(str(control[k]) for k in SECRETS) + " |")
    bad = sum(sum(h.values()) for h in rows.values())
    found = control["env"] > 0                             # the grep does find a secret where one is
    print(f"\n{len(rows) * len(SECRETS)} places x secrets, {bad} hits; {len(left)} processes left running; control "
          + ("found the env secret (the grep works)" if found else "FOUND NOTHING: the probe is blind"))
    sys.exit(1 if bad or left or not found else 0)


if __name__ == "__main__":
    main()
