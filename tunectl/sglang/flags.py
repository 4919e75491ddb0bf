"""SGLang's flag table, read from a real `launch_server --help` text.

`parse_help` turns the "options:" section of an argparse help text into FlagSpecs keyed by the flag name
without leading dashes (the first long option string, as argparse uses it for `dest`).
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HELP_DIR = Path(__file__).parent / "help"
_OPT_LINE = re.compile(r"^  (-\S.*)$")


# SGLang's argparse types of the flags that take numbers (srt/server_args.py): `--tp-size eight` exits 2 there. The
# --help text does not say; the stand-in's parser and the profile check both use this table.
TYPES: dict[str, Any] = {
    "tensor-parallel-size": int, "port": int, "max-running-requests": int, "cuda-graph-max-bs": int,
    "chunked-prefill-size": int, "stream-interval": int, "random-seed": int, "max-prefill-tokens": int,
    "max-total-tokens": int, "mem-fraction-static": float, "watchdog-timeout": float, "cuda-graph-bs": int,
    "data-parallel-size": int, "pipeline-parallel-size": int, "expert-parallel-size": int,
    "cuda-graph-max-bs-decode": int, "cuda-graph-max-bs-prefill": int,     # 0.5.17 names
    "tp-size": int, "dp-size": int, "pp-size": int, "ep-size": int, "context-length": int,
}

# Values a number flag's type takes but SGLang cannot run with: each launch with one is a crash at startup (or a
# server that serves nothing). (low, high, low inclusive); a flag absent here is bounded by its type alone.
AT_LEAST_ONE = (1, None, True)
RANGES: dict[str, tuple[float | None, float | None, bool]] = {
    "tensor-parallel-size": AT_LEAST_ONE, "tp-size": AT_LEAST_ONE, "data-parallel-size": AT_LEAST_ONE,
    "dp-size": AT_LEAST_ONE, "pipeline-parallel-size": AT_LEAST_ONE, "pp-size": AT_LEAST_ONE,
    "expert-parallel-size": AT_LEAST_ONE, "ep-size": AT_LEAST_ONE, "max-running-requests": AT_LEAST_ONE,
    "cuda-graph-max-bs": AT_LEAST_ONE, "cuda-graph-max-bs-decode": AT_LEAST_ONE,
    "cuda-graph-max-bs-prefill": AT_LEAST_ONE, "stream-interval": AT_LEAST_ONE, "context-length": AT_LEAST_ONE,
    "max-prefill-tokens": AT_LEAST_ONE, "max-total-tokens": AT_LEAST_ONE, "port": (1, 65535, True),
    "mem-fraction-static": (0, 1, False), "watchdog-timeout": (0, None, False),
}


@dataclass
class FlagSpec:
    name: str                          # e.g. "cuda-graph-max-bs"
    takes_value: bool
    choices: list[str] | None = None
    metavar: str | None = None
    help: str = ""
    aliases: list[str] = field(default_factory=list)   # other option strings, with dashes
    nargs: str | None = None           # None (one value), "?", "*", "+"
    text: str = ""                     # the whole help text, wrapped lines joined

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")


def _split_header(text: str) -> tuple[str, str]:
    m = re.match(r"^(.*?\S)(?: {2,}(.*))?$", text)
    assert m
    return m.group(1), (m.group(2) or "")


def _parse_opt(header: str) -> tuple[list[str], str]:
    """'--a A, --b A' -> (['--a', '--b'], 'A'); values may contain commas inside braces."""
    parts = re.split(r", (?=-)", header)
    names, value = [], ""
    for p in parts:
        name, _, rest = p.partition(" ")
        names.append(name)
        value = rest or value
    return names, value


def _value_spec(value: str) -> tuple[bool, list[str] | None, str | None, str | None]:
    if not value:
        return False, None, None, None
    nargs = None
    if value.endswith("...]"):
        nargs = "*" if value.startswith("[") else "+"
        value = value[1:].split(" ", 1)[0] if nargs == "*" else value.split(" ", 1)[0]
    elif value.startswith("[") and value.endswith("]"):
        nargs, value = "?", value[1:-1]
    choices = value[1:-1].split(",") if value.startswith("{") and value.endswith("}") else None
    return True, choices, None if choices else value, nargs


def _join(text: str, line: str) -> str:
    """Wrapped help lines joined; argparse breaks `--cuda-graph-` / `backend-...` at the hyphen."""
    if not text:
        return line
    return text + line if text.endswith("-") and text[-2:-1].isalpha() else f"{text} {line}"


def parse_help(text: str) -> dict[str, FlagSpec]:
    out: dict[str, FlagSpec] = {}
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.strip() in ("options:", "optional arguments:")), 0)
    current: FlagSpec | None = None
    for ln in lines[start + 1:]:
        m = _OPT_LINE.match(ln)
        if m:
            header, help_text = _split_header(m.group(1))
            names, value = _parse_opt(header)
            longs = [n for n in names if n.startswith("--")]
            if not longs or longs[0] == "--help":
                current = None
                continue
            takes, choices, metavar, nargs = _value_spec(value)
            current = FlagSpec(longs[0][2:], takes, choices, metavar, help_text.strip(),
                               [n for n in names if n != longs[0]], nargs, help_text.strip())
            out[current.name] = current
        elif current is not None and ln.startswith(" " * 24) and ln.strip():
            if not current.help:
                current.help = ln.strip()
            current.text = _join(current.text, ln.strip())
        elif ln and not ln.startswith(" "):
            current = None
    return out


def type_problem(spec: FlagSpec, value: Any) -> str | None:
    """Why SGLang's parser would refuse `value` for this flag's number type (TYPES, by any of its names), as it
    reads the value's text (`int("8")`, `float("0.88")`), or why SGLang could not run with the number (RANGES: a
    tp-size of 0, a port past 65,535, nan); None where it takes it or the flag is not typed."""
    kind = next((TYPES[n] for n in (spec.name, *(a.lstrip("-") for a in spec.aliases)) if n in TYPES), None)
    if kind is None:
        return None
    try:
        if not isinstance(value, bool):
            number = kind(str(value))
            return _out_of_range(spec, number)
    except ValueError:
        pass
    return f"{value!r} is not {'a whole number' if kind is int else 'a number'}: --{spec.name} takes one"


def _out_of_range(spec: FlagSpec, number: float) -> str | None:
    """Why SGLang could not run with this number (RANGES, by any of the flag's names; nan and inf never)."""
    if number != number or number in (float("inf"), float("-inf")):
        return f"{number!r} is not a finite number: --{spec.name} takes one"
    low, high, low_in = next((RANGES[n] for n in (spec.name, *(a.lstrip("-") for a in spec.aliases))
                              if n in RANGES), (None, None, True))
    if (low is not None and (number < low or (number == low and not low_in))) or (high is not None and number > high):
        lo = "" if low is None else f"{'>=' if low_in else '>'} {low:g}"
        hi = "" if high is None else f"<= {high:g}"
        return f"{number:g} is out of range: --{spec.name} takes a number {' and '.join(x for x in (lo, hi) if x)}"
    return None


def bundled_flags(version: str) -> dict[str, FlagSpec]:
    path = HELP_DIR / f"launch_server-{version}.txt"
    if not path.is_file():
        known = sorted(p.stem.removeprefix("launch_server-") for p in HELP_DIR.glob("launch_server-*.txt"))
        raise FileNotFoundError(f"no bundled --help text for SGLang {version}; bundled: {known}")
    return parse_help(path.read_text())


def config_refused(version: str) -> dict[str, str]:
    """{destination: action} of the options SGLang `version`'s --config merger refuses, derived from its parser
    (tunectl/sglang/source.py; `launch_server-<version>.config.json`); empty when not bundled."""
    import json

    path = HELP_DIR / f"launch_server-{version}.config.json"
    return dict(json.loads(path.read_text())["refused"]) if path.is_file() else {}


def flag_index(flags: dict[str, FlagSpec]) -> dict[str, FlagSpec]:
    """Every long spelling SGLang accepts, without dashes: `tp-size` and `tensor-parallel-size` -> one FlagSpec."""
    return {a[2:]: f for f in flags.values() for a in [f"--{f.name}", *f.aliases] if a.startswith("--")}


def _distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions)."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def did_you_mean(name: str, known: dict[str, Any] | list[str] | set[str]) -> str | None:
    """The closest known name: a typo of a letter or two first (fewest edits), else difflib's best match."""
    bare = name.lstrip("-").replace("_", "-")
    names = list(known)
    if not names:
        return None
    best = min(names, key=lambda k: (_distance(bare, k), -difflib.SequenceMatcher(None, bare, k).ratio()))
    if _distance(bare, best) <= max(1, len(bare) // 6):
        return best
    match = difflib.get_close_matches(bare, names, n=1, cutoff=0.6)
    return match[0] if match else None


def config_to_argv(config: dict[str, Any], switches: set[str] | None = None) -> list[str]:
    """SGLang's ConfigArgumentMerger rule for turning a --config mapping into arguments: a store_true flag appears
    only when true, other booleans become `--key true|false`, lists repeat their values, empty lists vanish.
    `switches`: the store_true flags (dashes or underscores); None = every boolean is a switch."""
    norm = None if switches is None else {s.replace("-", "_") for s in switches}
    args: list[str] = []
    for key, value in config.items():
        if isinstance(value, bool):
            if norm is None or key.replace("-", "_") in norm:
                args += [f"--{key}"] if value else []
            else:
                args += [f"--{key}", str(value).lower()]
        elif isinstance(value, list):
            args += [f"--{key}", *map(str, value)] if value else []
        else:
            args += [f"--{key}", str(value)]
    return args
