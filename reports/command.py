"""What a user pastes to launch a recorded config again (`tunectl best`, the report's summary, `tunectl diff`'s
environment): the environment a config needs without tunectl's per-run bookkeeping, and for a stand-in result the
SGLang command it stands for."""
from __future__ import annotations

import shlex
from typing import Any

from tunectl import redact

_RUN_ENV = ("TUNECTL_RUN_ID", "TMPDIR", "no_proxy", "NO_PROXY", "SGLANG_KILLPG_ON_SCHEDULER_EXCEPTION")
STAND_IN_MODULE = "tunectl.sim.launch_server"
STAND_IN_ENV = ("TUNECTL_SIM_PATCHES", "TUNECTL_SIM_GPU_DIR")     # the stand-in's own: patches, its GPU claims


def user_env(launch: dict[str, Any]) -> dict[str, str]:
    """A launch's environment without tunectl's per-run bookkeeping (run id, temp dir, proxy bypass): what a
    config needs, the same from run to run."""
    return {k: str(v) for k, v in (launch.get("env") or {}).items() if k not in _RUN_ENV and str(v) != ""}


def _template(text: str) -> str:
    """A profile's `${NAME}` text as one shell word that expands the references and nothing else: the literal parts
    single-quoted, each reference double-quoted (`${HOME}/hf` -> `"${HOME}"/hf`)."""
    parts, at = [], 0
    for m in redact.ENV_REF.finditer(text):
        parts += [shlex.quote(text[at:m.start()])] if m.start() > at else []
        parts.append(f'"${{{m.group(1)}}}"')
        at = m.end()
    return "".join(parts + ([shlex.quote(text[at:])] if at < len(text) else [])) or "''"


def _words(env: dict[str, str], refs: dict[str, str] | None = None) -> list[str]:
    """NAME=value words; a value the profile read from the caller's environment as the profile wrote it (its
    references expanded where the command is pasted), a redacted one as a reference to the same name."""
    refs = refs or {}
    return [f"{k}={_template(refs[k])}" if k in refs else f"{k}=\"${{{k}}}\"" if v == redact.MARK
            else f"{k}={shlex.quote(v)}" for k, v in env.items()]


def _comment(text: str) -> str:
    """A `#` line that stays one: a value's newline (quoted, it spans lines) starts the next line with `# ` too, so
    pasting the block never runs what followed it."""
    return text.replace("\n", "\n# ")


def sglang_argv(argv: list[str]) -> list[str]:
    """A stand-in launch as the SGLang command it models, for a GPU host: `python3 -m sglang.launch_server` and the
    same flags, the stand-in's own `--sim-*` options left out (each takes a value)."""
    i = argv.index(STAND_IN_MODULE) + 1 if STAND_IN_MODULE in argv else len(argv)
    flags = argv[i:]
    # The stand-in's options close the argv, each `--sim-NAME VALUE` (tunectl.engines): taken off the end, so a
    # flag's value that reads `--sim-...` stays (no SGLang flag is named --sim-*, no stand-in value starts with --).
    while len(flags) >= 2 and flags[-2].startswith("--sim-") and not flags[-1].startswith("--"):
        flags = flags[:-2]
    return ["python3", "-m", "sglang.launch_server", *flags]


def reproduce(launch: dict[str, Any]) -> dict[str, Any]:
    """What a user pastes on the GPU host to launch a recorded config again: the environment it needs (the
    profile's, the knobs', the GPUs; not tunectl's per-run bookkeeping), the argv, and the SGLang patches (real
    SGLang needs them applied first). A stand-in result is given as the SGLang command it models (no `--sim-*`
    options, no interpreter of this machine), with the stand-in's own command as a `#` line. A secret stays a
    reference to the caller's environment."""
    argv = list(launch.get("argv") or [])
    env = user_env(launch)
    refs = launch.get("env_refs") if isinstance(launch.get("env_refs"), dict) else {}
    patches = list(launch.get("patches") or [])
    lines = []
    if patches:
        lines.append(f"# needs the SGLang patches {', '.join(patches)}: tunectl applies them on the host "
                     "(patch -p1 inside the installed sglang/ package; files in tunectl's sglang_patches/)")
    if argv and STAND_IN_MODULE in argv:
        lines.append(_comment("# measured on the SGLang stand-in (tunectl.sim); the stand-in itself, on this machine: "
                              + " ".join([*_words(env, refs), shlex.join(argv)])))
        host_env = {k: v for k, v in env.items() if k not in STAND_IN_ENV}
        lines.append(" ".join([*_words(host_env, refs), shlex.join(sglang_argv(argv))]))
    elif argv:
        lines.append(" ".join([*_words(env, refs), shlex.join(argv)]))
    return {"argv": argv, "env": env, "patches": patches, "command": "\n".join(lines)}
