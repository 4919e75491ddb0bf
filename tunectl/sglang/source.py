"""Which options SGLang's `--config` file refuses, read from the version's own parser source.

SGLang's `ConfigArgumentMerger` (server_args_config_parser.py) refuses, by destination, every option whose argparse
action is neither `store` nor `store_true` (deprecated aliases, `BooleanOptionalAction`, `LoRAPathAction`, ...):
"Unsupported config option 'cuda_graph_backend_prefill' with action 'DeprecatedStoreConstAction'". Such options must
go on the command line. `refused(sources)` finds them in the parser's source without importing SGLang (which needs a
GPU stack): every `add_argument(...)` or dataclass field `Arg(...)` with an `action=` other than store/store_true,
keyed by its destination (`dest=`, else the first long option, else the field's name).

The result for each bundled version is `tunectl/sglang/help/launch_server-<version>.config.json`, written by
`tunectl versions add` from an unpacked wheel (`--source DIR`) or a host's installed SGLang (`-p PROFILE`).
"""
from __future__ import annotations

import ast
from typing import Any

PARSER_FILES = ("srt/server_args.py", "srt/arg_groups/")     # relative to the sglang package directory
_PLAIN = ("store", "store_true", "_StoreAction", "_StoreTrueAction")


def _action(node: ast.Call) -> str | None:
    act = next((k.value for k in node.keywords if k.arg == "action"), None)
    if isinstance(act, ast.Constant) and isinstance(act.value, str):
        name = act.value
    elif isinstance(act, ast.Name):
        name = act.id
    elif isinstance(act, ast.Attribute):
        name = act.attr
    else:
        return None
    return None if name in _PLAIN else name


def _dest(node: ast.Call, field: str | None) -> str | None:
    dest = next((k.value for k in node.keywords if k.arg == "dest"), None)
    if isinstance(dest, ast.Constant) and isinstance(dest.value, str):
        return dest.value
    opts = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    if opts:
        if {"--config", "--help", "-h"} & set(opts):
            return None
        return next((o for o in opts if o.startswith("--")), opts[0]).lstrip("-").replace("-", "_")
    return field


def _calls(tree: ast.AST) -> list[tuple[ast.Call, str | None]]:
    """Each call with the dataclass field (annotated assignment) it sits in, if any."""
    out: list[tuple[ast.Call, str | None]] = []

    def walk(node: ast.AST, field: str | None) -> None:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            field = node.target.id
        if isinstance(node, ast.Call):
            out.append((node, field))
        for child in ast.iter_child_nodes(node):
            walk(child, field)

    walk(tree, None)
    return out


def refused(sources: dict[str, str]) -> dict[str, str]:
    """{destination: action class} for the options `--config` refuses; `sources`: file name -> Python text."""
    out: dict[str, str] = {}
    for text in sources.values():
        for call, field in _calls(ast.parse(text)):
            func = call.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            action = _action(call) if name in ("add_argument", "Arg") else None
            if action is None or (name == "Arg" and field is None):
                continue
            dest = _dest(call, field if name == "Arg" else None)
            if dest:
                out[dest] = action
    return dict(sorted(out.items()))


def record(version: str, dests: dict[str, str]) -> dict[str, Any]:
    return {"schema": 1, "sglang_version": version, "rule": "ConfigArgumentMerger: actions other than store and "
            "store_true are refused by destination", "refused": dests}
