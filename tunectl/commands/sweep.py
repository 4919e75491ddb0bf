"""`tunectl sweep`: one launch of one configuration, a concurrency ladder on it, a table per level.

A crash is a finding (exit 0, shown with its class and evidence); usage errors exit 2 and infra faults 1, each
with one line. `--set NAME=VALUE` takes a search-space knob or an SGLang flag name (no dashes), checked against
the knob's type/choices or the profile's SGLang version's --help before anything starts.
"""
from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import typer
import yaml

from tunectl import redact
from tunectl.cli import app
from tunectl.commands._common import console, err_console, get_profile, one_line_errors, show_table
from tunectl.commands._levels import (launches_table, level_line, level_table, print_capacity, print_crash,
                                      progress_text)
from tunectl.errors import UsageError
from tunectl.models import LevelResult, TrialResult
from tunectl.profile import ParamSpec, Profile
from tunectl.store import DEFAULT_ROOT, StudyStore, check_name, running

_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}

CLIENTS = ("builtin", "bench_serving")


def parse_levels(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        levels = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"--concurrency: {text!r}: expected comma-separated positive integers, e.g. 64,256,512")
    if not levels or levels[0] < 1:
        raise UsageError(f"--concurrency: {text!r}: expected comma-separated positive integers, e.g. 64,256,512")
    return levels


def parse_rates(text: str | None) -> list[float] | None:
    if text is None:
        return None
    try:
        rates = sorted({float(x) for x in text.split(",") if x.strip()})
    except ValueError:
        rates = []
    if not rates or rates[0] <= 0 or any(r != r or r == float("inf") for r in rates):
        raise UsageError(f"--request-rate: {text!r}: expected comma-separated positive rates (req/s), e.g. 2,4,8,16")
    return rates


def parse_slo(items: list[str]) -> dict[str, float]:
    """`["p99_ttft_ms=2000", ...]` -> objective.slo limits."""
    from tunectl.profile import Objective

    valid = sorted(Objective.model_fields["slo"].annotation.__args__[0].__args__)  # type: ignore[union-attr]
    out: dict[str, float] = {}
    for item in items:
        key, _, raw = item.partition("=")
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if key.strip() not in valid or not 0 < value < float("inf"):          # nan and inf are no limit
            raise UsageError(f"--slo {item!r}: expected KEY=MS with KEY one of {', '.join(valid)}, e.g. "
                             "p99_ttft_ms=2000")
        out[key.strip()] = value
    return out


def with_load(prof: Profile, burstiness: float | None, max_concurrency: int | None, slo: dict[str, float],
              capacity: bool) -> Profile:
    """The profile with the command line's open-loop and SLO settings."""
    bench, obj = prof.bench.model_copy(), prof.objective.model_copy()
    if burstiness is not None:
        if not 0 < burstiness < float("inf"):                                # nan: a traceback in pydantic
            raise UsageError(f"--burstiness: {burstiness}: expected a positive number (1 = Poisson)")
        bench.burstiness = burstiness
    if max_concurrency is not None:
        if max_concurrency < 1:
            raise UsageError(f"--max-concurrency: {max_concurrency}: expected a positive integer")
        bench.max_concurrency = max_concurrency
    obj.slo = {**obj.slo, **slo}
    if capacity and not obj.slo:
        raise UsageError(f"--capacity: {prof.source or 'the profile'} has no objective.slo limits; give them "
                         "there or as --slo p99_ttft_ms=2000")
    return prof.model_copy(update={"bench": bench, "objective": obj})


def _bool(name: str, raw: str) -> bool:
    if raw.lower() in _TRUE | _FALSE:
        return raw.lower() in _TRUE
    raise UsageError(f"--set {name}: {raw!r}: expected a boolean (true or false)")


def _knob_value(prof: Profile, name: str, spec: ParamSpec, raw: str) -> Any:
    if spec.type == "bool":
        return _bool(name, raw)
    if spec.choices is not None:
        for choice in spec.choices:
            if str(choice).lower() == raw.lower():
                return choice
        value = _off_grid(prof, name, spec, raw)
        if value is not None:
            return value
        raise UsageError(f"--set {name}: {raw!r}: must be one of {', '.join(map(str, spec.choices))}"
                         + ("" if spec.patch or spec.env else " (the search grid) or another value SGLang takes"))
    kind = int if spec.type == "int" else float
    try:
        return kind(raw)
    except ValueError:
        raise UsageError(f"--set {name}: {raw!r}: expected {'an integer' if kind is int else 'a number'}")


def _off_grid(prof: Profile, name: str, spec: ParamSpec, raw: str) -> Any:
    """A flag knob's value that is not on its search grid but SGLang takes (a number where the grid has numbers,
    one of SGLang's own choices where it has words); None when it is not."""
    if spec.patch is not None or spec.env is not None:
        return None
    if all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in spec.choices or []):
        kind = int if all(isinstance(c, int) for c in spec.choices or []) else float
        try:
            raw = str(kind(raw))
        except ValueError:
            return None
    try:
        return _flag_value(prof, spec.flag or name, raw)[1]
    except UsageError:
        return None


def _flag_value(prof: Profile, name: str, raw: str) -> tuple[str, Any]:
    """(the flag's key in the config, the typed value): SGLang's aliases (tp-size, tensor-parallel-size) are one
    flag, spelled as the profile's base flags spell it, else as SGLang lists it first."""
    from tunectl.sglang.flags import bundled_flags, did_you_mean, flag_index
    from tunectl.redact import SECRET_FLAGS

    version = prof.server.sglang_version
    try:
        index = flag_index(bundled_flags(version))
    except FileNotFoundError as e:
        raise UsageError(f"--set {name}: {e}")
    spec = index.get(name.replace("_", "-"))
    if spec is None:
        from tunectl.sglang.versions import gone_hint

        gone = gone_hint(name, version)
        hint = did_you_mean(name, [*prof.search.space, *index])
        knobs = ", ".join(prof.search.space) or "none"
        raise UsageError(f"--set {name}: not a search knob ({knobs}) nor an SGLang {version} flag"
                         + (f"; {gone}" if gone else f"; did you mean {hint!r}?" if hint else ""))
    if any(index.get(secret.replace("_", "-")) is spec for secret in SECRET_FLAGS):
        raise UsageError(f"--set {name}: a secret is never given on the command line (it would be stored in "
                         "results/ and shown by --dry-run); put it in the environment: server.env: "
                         "{SGLANG_API_KEY: ${SGLANG_API_KEY}} in the profile, then export SGLANG_API_KEY")
    if spec is index.get("config"):
        raise UsageError(f"--set {name}: tunectl writes the server's --config file itself (the profile's flags and "
                         "every --set go into it); give the flags one by one: --set NAME=VALUE")
    key = next((k for k in prof.server.flags if index.get(k.replace("_", "-")) is spec), spec.name)
    if not spec.takes_value:
        return key, _bool(name, raw)
    if spec.choices and raw not in spec.choices:
        raise UsageError(f"--set {name}: {raw!r}: must be one of {', '.join(spec.choices)}")
    try:
        value = yaml.safe_load(raw) if raw else raw
    except yaml.YAMLError as e:                    # `[1,`, `: :`, `!!python/object x`: one line, not a traceback
        why = str(getattr(e, "problem", None) or getattr(e, "context", None) or "not valid YAML").strip()
        raise UsageError(f"--set {name}: {raw!r}: not a valid value ({why}); a value with YAML's special "
                         f"characters is quoted: --set '{name}=\"...\"'") from None
    from tunectl.sglang.flags import type_problem

    typed = type_problem(spec, raw)
    if typed:
        raise UsageError(f"--set {name}: {typed}")
    return key, value if isinstance(value, (int, float, str, bool)) else raw


def parse_sets(prof: Profile, sets: list[str]) -> dict[str, Any]:
    """`["NAME=VALUE", ...]` -> trial params, each value checked and typed; one entry per flag whatever alias
    names it (the last --set wins)."""
    params: dict[str, Any] = {}
    for item in sets:
        name, sep, raw = item.partition("=")
        name = name.strip().lstrip("-")
        if not sep or not name:
            raise UsageError(f"--set {item!r}: expected NAME=VALUE, e.g. --set max-running-requests=2048")
        spec = prof.search.space.get(name)
        if spec is not None:
            params[name] = _knob_value(prof, name, spec, raw.strip())
        else:
            key, value = _flag_value(prof, name, raw.strip())
            params[key] = value
    return params


# ---------------------------------------------------------------------------------------------- rendering
def with_clients(prof: Profile, text: str) -> Profile:
    """The profile with each workload measured by each named client, on the same launch; a workload that
    sglang.bench_serving cannot send (jsonl, multi-turn, scenarios) by the others only."""
    from tunectl.workloads import bench_serving_reads

    clients = list(dict.fromkeys(c.strip() for c in text.split(",") if c.strip()))  # twice: one level file
    bad = [c for c in clients if c not in CLIENTS]
    if bad or not clients:
        raise UsageError(f"--client: {text!r}: valid clients: {', '.join(CLIENTS)} (comma-separated)")
    workloads = [w.model_copy(update={"client": c}) for w in prof.bench.workloads for c in clients
                 if c != "bench_serving" or bench_serving_reads(w)]
    if not workloads:
        raise UsageError(f"--client: {text!r}: sglang.bench_serving sends none of this profile's workloads "
                         "(it reads random, shared_prefix, long_prompt, single-turn sharegpt and trace); add builtin")
    return prof.model_copy(update={"bench": prof.bench.model_copy(update={"workloads": workloads})})


def _json_doc(store: StudyStore, results: list[TrialResult]) -> str:
    """One launch: its trial document; several: `launches` (one document each) and `summary` (pooled levels)."""
    from tunectl.launches import summarize
    from tunectl.store import _finite

    docs = []
    for result in results:
        d = result.to_dict()
        if d.get("launch"):
            redact.launch(d["launch"])
        docs.append({"study": store.name, "results_dir": str(store.trial_dir(result.trial)), **d})
    doc = docs[0] if len(docs) == 1 else {"study": store.name, "launches": docs,
                                          "summary": [row.to_dict() for row in summarize(results)]}
    return json.dumps(_finite(doc), indent=2, default=str)


def _dry_run(prof: Profile, params: dict[str, Any], as_json: bool) -> None:
    from tunectl.runners.server import plan as plan_mod

    run_id = plan_mod.make_run_id("dry-run", 0)
    plan = plan_mod.build_plan(prof, params, run_id, f"{prof.host.workdir}/{run_id}")
    plan.env = redact.env(plan.env, plan.env_refs)
    if as_json:
        print(json.dumps(plan.to_dict(), indent=2, default=str))
        return
    console.print("[bold]command line equivalent[/]")
    print(shlex.join(plan.argv))
    console.print("[bold]what runs[/]")
    print(shlex.join(plan.exec_argv))
    console.print(f"[bold]{plan.trial_dir}/config.yaml[/]")
    print(plan_mod.config_yaml(plan), end="")
    console.print("[bold]environment[/]")
    for k, v in plan.env.items():
        print(f"{k}={v}")
    console.print(f"[bold]patches[/]: {', '.join(plan.patches) or 'none'}")


@app.command()
@one_line_errors
def sweep(concurrency: str | None = typer.Option(None, "--concurrency", "-c",
                                                    help="levels, e.g. 64,256,512 (default: the profile's)"),
          profile: Path | None = typer.Option(None, "--profile", "-p", help="profile YAML (default: embedded)"),
          set_: list[str] = typer.Option([], "--set", help="NAME=VALUE: a search knob or SGLang flag (no dashes)"),
          as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
          dry_run: bool = typer.Option(False, "--dry-run", help="print the launch plan, start nothing"),
          study: str | None = typer.Option(None, "--study", "-s", help="results/<study> (default: sweep-<time>)"),
          client: str | None = typer.Option(None, "--client", help="builtin, bench_serving, or both "
                                               "(builtin,bench_serving: each level measured by each client)"),
          launches: int = typer.Option(1, "--launches", help="fresh launches of the configuration; with 2 or more, "
                                       "each level's launches are pooled into one 95% interval and their spread"),
          request_rate: str | None = typer.Option(None, "--request-rate", "-r", help="open-loop levels: request "
                                                  "rates (req/s), e.g. 2,4,8,16 (default: the profile's bench.rates)"),
          burstiness: float | None = typer.Option(None, "--burstiness", help="1 = Poisson arrivals; below 1 "
                                                  "burstier, above 1 more regular (gamma)"),
          max_concurrency: int | None = typer.Option(None, "--max-concurrency", help="cap on requests in flight "
                                                     "at a rate level"),
          capacity: bool = typer.Option(False, "--capacity", help="find the highest load meeting the SLO "
                                        "(objective.slo, slo_attainment) by a bracketing search on one launch"),
          slo: list[str] = typer.Option([], "--slo", help="KEY=MS: an SLO limit, e.g. p99_ttft_ms=2000"),
          root: Path = typer.Option(DEFAULT_ROOT, "--results", help="results folder", hidden=True)) -> None:
    """Launch one configuration and benchmark it at each concurrency level on that one launch."""
    prof = get_profile(profile)
    if prof.host.kind == "slurm":
        raise UsageError(f"{prof.source or prof.name}: host.kind: slurm: tunectl search runs there (a job per trial, "
                         "docs/slurm.md); tunectl sweep needs host.kind local or ssh")
    levels, rates = parse_levels(concurrency), parse_rates(request_rate)
    if levels is not None and rates is not None:
        raise UsageError(f"--concurrency {concurrency} and --request-rate {request_rate}: a sweep runs closed-loop "
                         "levels or open-loop rates (which replace the levels), not both (docs/load.md)")
    if levels is not None and rates is None:
        rates = []                                   # --concurrency: closed-loop levels, whatever bench.rates
    prof = with_load(prof, burstiness, max_concurrency, parse_slo(slo), capacity)
    params = parse_sets(prof, set_)
    if client is not None:
        prof = with_clients(prof, client)
    if launches < 1:
        raise UsageError(f"--launches: {launches}: expected 1 or more fresh launches")
    if study is not None:
        check_name(study)                 # one rule for every command, a dry run's too
    if dry_run:
        _dry_run(prof, params, as_json)
        return
    name = study or time.strftime("sweep-%Y%m%d-%H%M%S")
    results: list[TrialResult] = []
    for i in range(launches):
        if launches > 1 and not as_json:
            console.print(f"[bold]launch {i + 1} of {launches}[/]")
        result, store = _run(prof, params, (levels, rates, capacity), name, root, as_json)
        results.append(result)
        if not as_json:
            show_table(level_table(result), keep=("workload", "status"))
            print_capacity(result)
            print_crash(result)
            console.print(f"results: {store.trial_dir(result.trial)} (trial.json, launch.json, config.yaml, "
                          f"levels/, server.log); wall {result.wall_s:.1f} s", highlight=False, markup=False,
                          soft_wrap=True)
        if result.status == "infra":
            break
    if as_json:
        print(_json_doc(store, results))
    elif launches > 1:
        show_table(launches_table(results), keep=("workload",))
    if result.status == "infra":
        c = result.crash
        why = (c.exception_line or c.message) if c else "infra fault"
        err_console.print(f"[red]error:[/red] not the configuration's fault: {why}",
                          highlight=False, soft_wrap=True)
        sys.exit(1)


def _run(prof: Profile, params: dict[str, Any], load: tuple[list[int] | None, list[float] | None, bool], name: str,
         root: Path, quiet: bool, role: str = "sweep", info: dict[str, Any] | None = None
         ) -> tuple[TrialResult, StudyStore]:
    """One fresh launch of `params` as the next trial of results/<name> (`role` on its record; `info` added to
    study.json, whose kind is a sweep unless `info` says otherwise)."""
    from tunectl.runners.checks.readiness import CONFIG_CHECKS
    from tunectl.wiring.study import make_runner, preflight
    from tunectl.wiring.trial import TrialContext, run_trial

    runner = make_runner(prof)
    try:
        if quiet:
            preflight(prof, runner, None, CONFIG_CHECKS)
        else:
            with console.status("checking the engine, flags and patches on the host"):
                preflight(prof, runner, None, CONFIG_CHECKS)
    except BaseException:
        runner.close()
        raise
    store = StudyStore(name, root)
    levels, rates, capacity = load
    store.write_study({"kind": "sweep", "profile": redact.profile(prof), "params": params,
                       "levels": levels or prof.bench.levels, "rates": prof.bench.rates if rates is None else rates,
                       "capacity": capacity, "started_at": time.time(), **(info or {})})
    n = len(store.trial_numbers())
    ctx = TrialContext(prof, runner, store, levels=levels, rates=rates, capacity=capacity)
    try:
        with running(store):          # `tunectl check` asks it: this sweep's server is no leftover
            if quiet:
                return run_trial(ctx, n, params, role), store
            with console.status("planning") as status:
                def on_event(kind: str, data: dict[str, Any]) -> None:
                    text = progress_text(kind, data)
                    if text:
                        status.update(text)
                    if kind == "level":
                        console.print(level_line(LevelResult.from_dict(data["level"])), highlight=False)
                return run_trial(ctx, n, params, role, on_event), store
    finally:
        runner.close()
