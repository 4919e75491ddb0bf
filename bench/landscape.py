"""Convert a measured landscape to `landscape.json` (docs/landscapes.md), and print its table.

    python bench/landscape.py docs/real-gpu/landscapes/llama8b-h100        # design.yaml + results/ -> landscape.json
    python bench/landscape.py docs/real-gpu/results/h200-search --out /tmp/h200-search.json   # a results folder
    python bench/landscape.py FOLDER --check      # convert and print; write nothing

A partial landscape converts: its unmeasured configs are listed.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # run as a script from anywhere in the checkout
from tunectl.wiring import landscape  # noqa: E402
from tunectl.errors import TunectlError  # noqa: E402


def table(land: dict[str, Any]) -> str:
    levels = [str(x) for x in land["levels"]]
    clients = land["clients"] or ["builtin"]
    head = f"{'config':7} {'outcome':10} {'launches':>8}  " + "  ".join(
        f"{c[:8]}@{lv:>4} tok/s (spread)" for c in clients for lv in levels)
    rows = [head, "-" * len(head)]
    for c in land["configs"]:
        cells = []
        for client in clients:
            for lv in levels:
                s = c["levels"].get(client, {}).get(lv)
                cells.append(f"{'-':>28}" if s is None else f"{s['mean']:>14,.0f} " + (
                    f"({(s['max'] - s['min']) / s['mean']:>4.0%}, n={s['n']})" if s["n"] > 1 else f"{'':>12}"))
        what = c["outcome"] if c["outcome"] != "crash" else f"crash:{(c['crash'] or {}).get('signature', '?')}"
        rows.append(f"{c['id']:7} {what[:10]:10} {len(c['launches']):>8}  " + "  ".join(cells))
    n = land["counts"]
    rows.append(f"\n{land['name']}: {n['configs']} configs, {n['measured']} measured ({n['configs_ok']} ok, "
                f"{n['configs_crash']} crash, {n['configs_flaky']} flaky), {n['unmeasured']} unmeasured"
                + (f" ({', '.join(land['unmeasured'])})" if land["unmeasured"] else "")
                + f"; {n['launches']} launches ({n['launches_infra']} infra), {n['relaunched']} configs relaunched")
    if land["unknown_studies"]:
        rows.append(f"studies matching no config: {', '.join(land['unknown_studies'])}")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", help="a landscape folder (design.yaml + results/) or a tunectl results folder")
    ap.add_argument("--out", default=None, help="where to write (default: FOLDER/landscape.json)")
    ap.add_argument("--name", default=None, help="the landscape's name (a results folder without a design)")
    ap.add_argument("--check", action="store_true", help="convert and print the table; write nothing")
    args = ap.parse_args()
    try:
        folder = Path(args.folder)
        land = landscape.convert(folder) if args.name is None else landscape.from_results(folder, args.name)
    except TunectlError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table(land))
    if not args.check:
        out = Path(args.out) if args.out else folder / "landscape.json"
        landscape.write(land, out)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
