"""Fit a sim card's speed parameters to part of a measured landscape and check it on the configs held out.

The landscape's configs (landscape.json, docs/landscapes.md) are split: every `--hold`-th measured config (c02,
c05, ... for 3) is held out, the rest train. The card's decode and prefill timings and its graph capture memory
per batch size (FIT below) are scaled, in log space, by coordinate descent to minimise the squared log error of the
stand-in's noise-free virtual ladder (the trial engine's `tunectl.wiring.virtual.VirtualEvaluator` on the landscape's own
profile, flags and workload) against the measured level means of the chosen client, on the training configs. Reported: the fitted factors; per level the
mean absolute error on the training and the held-out configs; crash agreement (a measured crash the card serves, or
the reverse); and each knob's main effect, measured vs the card's (the mean ratio of throughput between the knob's
values at each level): where the card's physics cannot reach the measurements, the effects disagree in sign or size
and are named, and the fix belongs in the physics (sim/), not in these factors.

    python bench/fit_card.py docs/real-gpu/landscapes/llama8b-h100/landscape.json --card llama31-8b-h200 \
        --gpu "NVIDIA H100 80GB HBM3" --gpu-gib 79.19 [--hold 3] [--client builtin] [--out card.yaml]
        [--physics decode.launch_overlap_p=4]      # switch a physics term on in the starting card (then fitted)
        [--noise]                                  # the card's noise set to what the relaunched configs measured
        [--passengers chunked-prefill-size,kv-cache-dtype]   # configs differing only in these count as relaunches

The landscape's relaunched configs (two or more launches) also give the noise a real server plays (the card's
`noise`, sim/noise.py): per config and client, each launch's log values less the config's mean per level split
into the launch's shift (its mean over the levels: `noise.launch`) and what is left per level (`noise.level`),
pooled over the configs as standard deviations, for all configs and apart for the graphed and the eager ones
(graphs off: eager decoding is CPU-bound and moves between launches more). Printed always; `--noise` writes them
into the fitted card (`noise.launch` and `noise.level` from the graphed configs, `noise.launch_eager` from the eager
ones where both were relaunched; the eager configs' larger drift within a launch is not played). `--passengers`:
knobs the table shows act on nothing; configs that differ only in them are twins, read as launches of one config.
A config (or twins) read on two machines gives the machine's sd, on graphed and on eager levels apart (`noise.machine`,
`noise.machine_eager`: `machine_noise`); printed always, written by `--noise`.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from collections.abc import Callable
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # run as a script from anywhere in the checkout
from tunectl.wiring import landscape  # noqa: E402
from tunectl.profile import Profile  # noqa: E402
from tunectl.wiring.replay import replay_profile  # noqa: E402
from tunectl.sim.card import Card, load_card  # noqa: E402
from tunectl.sim.setup import normalize  # noqa: E402
from tunectl.wiring.virtual import VirtualEvaluator  # noqa: E402

FIT = ("decode.base_ms", "decode.per_req_ms", "decode.per_kv_ktoken_ms", "decode.launch_ms",
       "decode.launch_overlap_p", "prefill.base_ms", "prefill.per_token_ms",
       "memory.graph_per_bs_gb")     # the last moves where graph capture runs out of memory; a zero stays zero
CRASH_PENALTY = 1.0          # a crash disagreement costs as much as a level off by a factor e


def _get(d: dict[str, Any], dotted: str) -> float:
    for part in dotted.split("."):
        d = d[part]
    return float(d)  # type: ignore[arg-type]


def scaled(base: Card, factors: dict[str, float], values: dict[str, float] | None = None) -> Card:
    """`base` with each field of `factors` multiplied by its factor and each of `values` set."""
    data = base.model_dump(mode="json")
    for dotted, f in [*factors.items(), *(values or {}).items()]:
        *path, last = dotted.split(".")
        node = data
        for part in path:
            node = node[part]
        if last not in node:
            raise KeyError(dotted)
        node[last] = float(node[last]) * f if dotted in factors else f
    return Card.model_validate(data)


class Fit:
    def __init__(self, land: dict[str, Any], card: Card, client: str | None):
        self.land = land
        prof = replay_profile(land)
        data = prof.model_dump(mode="json")
        data["server"]["engine"], data["server"]["sim"]["card"] = "sim", card.name or "fit"
        self.prof = Profile.model_validate(data)
        self.client = client or ("builtin" if "builtin" in land["clients"] else land["clients"][0])
        self.configs = [c for c in land["configs"] if c["outcome"] in ("ok", "crash")]
        self.base = card

    def measured(self, cfg: dict[str, Any]) -> dict[int, float]:
        return {int(lv): s["mean"] for lv, s in cfg["levels"].get(self.client, {}).items()}

    def simulate(self, card: Card, cfg: dict[str, Any]) -> tuple[bool, dict[int, float]]:
        ev = VirtualEvaluator(self.prof, 0, noise=0.0)
        ev.card = card
        res = ev(0, dict(cfg["set"]), "sweep")
        return res.status == "crashed", {lv.concurrency: lv.output_throughput for lv in res.stable_levels}

    def loss(self, card: Card, configs: list[dict[str, Any]]) -> float:
        total, n = 0.0, 0
        for cfg in configs:
            crashed, sim = self.simulate(card, cfg)
            if crashed != (cfg["outcome"] == "crash"):
                total, n = total + CRASH_PENALTY, n + 1
                continue
            for lv, want in self.measured(cfg).items():
                if want > 0:
                    total += math.log(max(sim.get(lv, 1.0), 1.0) / want) ** 2
                    n += 1
        return total / max(1, n)

    def fit(self, train: list[dict[str, Any]], rounds: int = 6) -> dict[str, float]:
        """Coordinate descent on log factors, steps halving each round."""
        logf = {k: 0.0 for k in FIT if _get(self.base.model_dump(), k) > 0}
        best = self.loss(self.base, train)
        step = 1.0
        for _ in range(rounds):
            for k in logf:
                for sign in (1, -1):
                    trial = {**logf, k: logf[k] + sign * step}
                    val = self.loss(scaled(self.base, {n: math.exp(v) for n, v in trial.items()}), train)
                    if val < best - 1e-9:
                        best, logf = val, trial
                        break
            step /= 2
        return {k: math.exp(v) for k, v in logf.items()}


def errors(fit: Fit, card: Card, configs: list[dict[str, Any]]) -> tuple[dict[int, list[float]], list[str]]:
    """Per level the relative errors of the card against the measured means; crash disagreements by config."""
    per: dict[int, list[float]] = {}
    crash_off = []
    for cfg in configs:
        crashed, sim = fit.simulate(card, cfg)
        if crashed != (cfg["outcome"] == "crash"):
            crash_off.append(f"{cfg['id']} measured {cfg['outcome']}, card {'crash' if crashed else 'serves'}")
            continue
        for lv, want in fit.measured(cfg).items():
            if want > 0 and lv in sim:
                per.setdefault(lv, []).append(sim[lv] / want - 1)
    return per, crash_off


def main_effects(fit: Fit, card: Card) -> list[tuple[str, str, int, float, float]]:
    """(knob, 'a -> b', level, measured ratio, card ratio): the geometric mean ratio over the pairs of configs that
    differ only in this knob (a knob active in one of them only, as graph sizes with graphs off, is not compared),
    served in both."""
    ok = [c for c in fit.configs if c["outcome"] == "ok"]
    sims = {c["id"]: fit.simulate(card, c)[1] for c in ok}
    out = []
    for knob, values in fit.land["knobs"].items():
        for a, b in zip(values, values[1:]):
            for lv in fit.land["levels"]:
                meas, model = [], []
                for ca in ok:
                    if ca["set"].get(knob) != a:
                        continue
                    for cb in (c for c in ok if _twin(ca["set"], c["set"], knob, b)):
                        ma, mb = fit.measured(ca).get(int(lv)), fit.measured(cb).get(int(lv))
                        sa, sb = sims[ca["id"]].get(int(lv)), sims[cb["id"]].get(int(lv))
                        if ma and mb and sa and sb:
                            meas.append(math.log(mb / ma))
                            model.append(math.log(sb / sa))
                if meas:
                    out.append((knob, f"{a} -> {b}", int(lv), math.exp(statistics.fmean(meas)),
                                math.exp(statistics.fmean(model))))
    return out


def eager(flags: dict[str, Any]) -> bool:
    """A config whose decode steps run without CUDA graphs, as the stand-in reads its flags (either version's)."""
    return bool(normalize(flags)["disable_cuda_graph"])


def _twins_key(flags: dict[str, Any], passengers: tuple[str, ...]) -> str:
    """Configs that differ only in `passengers` share this key (twins)."""
    return repr(sorted((k, str(v)) for k, v in flags.items() if k not in passengers))


def noise(land: dict[str, Any], client: str, passengers: tuple[str, ...] = (),
          keep: Callable[[dict[str, Any]], bool] | None = None) -> dict[str, float] | None:
    """The launch-to-launch and level-to-level log-normal sds the relaunched configs measured with `client`:
    {"launch", "level", "configs", "launches"}, None without a config launched twice. For launches l of a config at
    levels k, r_lk = log v_lk less the level's mean over the launches; the launch's shift a_l = mean_k r_lk; the
    rest e_lk = r_lk - a_l. level^2 = sum e^2 / sum (n-1)(K-1); launch^2 = sum a^2 / sum (n-1) less level^2 / K
    (a shift read from K noisy levels carries level^2 / K of their noise), at least 0.
    `passengers`: knobs measured to act on nothing here; configs that differ only in them count as launches of one
    config (twins). `keep`: only the configs whose flags it accepts (e.g. `eager`). Launches count as relaunches
    only on one machine (`launches[].machine`; "" for a table that did not record it): two H100s read one config up
    to 20% apart (docs/real-gpu.md, "The fourth lease"), which is the machine's difference, not a launch's."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for cfg in land["configs"]:
        if keep is not None and not keep(cfg.get("set", {})):
            continue
        key = _twins_key(cfg["set"], passengers) if passengers and "set" in cfg else cfg["id"]
        for ln in cfg["launches"]:
            if ln["outcome"] == "ok":
                groups.setdefault((key, ln.get("machine") or ""), []).append(ln["levels"].get(client, {}))
    a2 = e2 = 0.0
    df_a = df_e = configs = launches = 0
    for runs in groups.values():
        levels = sorted(set.intersection(*(
            {lv for lv, m in r.items() if m.get("status") == "ok" and (m.get("value") or 0) > 0} for r in runs)),
            key=int) if len(runs) > 1 else []
        if len(runs) < 2 or not levels:
            continue
        y = [[math.log(r[lv]["value"]) for lv in levels] for r in runs]
        means = [statistics.fmean(col) for col in zip(*y)]
        for row in y:
            r = [v - m for v, m in zip(row, means)]
            shift = statistics.fmean(r)
            a2 += shift ** 2
            e2 += sum((x - shift) ** 2 for x in r)
        n, k = len(runs), len(levels)
        df_a, df_e = df_a + n - 1, df_e + (n - 1) * (k - 1)
        configs, launches = configs + 1, launches + n
    if not configs:
        return None
    level = math.sqrt(e2 / df_e) if df_e else 0.0
    k_mean = (df_e / df_a + 1) if df_a else 1.0
    launch = math.sqrt(max(0.0, a2 / df_a - level ** 2 / k_mean))
    return {"launch": launch, "level": level, "configs": configs, "launches": launches}


def eager_at(flags: dict[str, Any], streams: int) -> bool:
    """Whether a level of `streams` decodes eager on this config: graphs off, or its batch (the streams, at most
    max-running) above the graphs' max bs."""
    f = normalize(flags)
    return bool(f["disable_cuda_graph"]) or min(streams, int(f["max_running_requests"])) > int(f["cuda_graph_max_bs"])


def machine_noise(land: dict[str, Any], client: str, passengers: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """The machine's sd on graphed and on eager decode steps (the card's `noise.machine`, `noise.machine_eager`),
    from one config (or twins differing only in `passengers`) read on two machines (`launches[].machine`; a table
    that did not record it counts as one machine, ""): per such pair of machines and level, d = the difference of
    the two machines' mean log readings, sorted by whether the level decodes eager (`eager_at`); each sd is
    sqrt(mean d^2 / 2). None where no config was read on two machines. The levels of one pair share its machines,
    so they are not independent draws: a rough estimate, as the pairs say."""
    groups: dict[str, dict[str, list[tuple[dict[str, Any], dict[str, Any]]]]] = {}
    for cfg in land["configs"]:
        if "set" not in cfg:
            continue
        for ln in cfg["launches"]:
            if ln["outcome"] == "ok":
                groups.setdefault(_twins_key(cfg["set"], passengers), {}).setdefault(
                    ln.get("machine") or "", []).append((cfg["set"], ln["levels"].get(client, {})))
    diffs: dict[bool, list[float]] = {False: [], True: []}
    pairs, machines = 0, set()
    for by_machine in groups.values():
        names = sorted(by_machine)
        for i, m1 in enumerate(names):
            for m2 in names[i + 1:]:
                pairs += 1
                machines |= {m1, m2}
                for lv in sorted({lv for _, r in by_machine[m1] + by_machine[m2] for lv in r}, key=int):
                    sides = []
                    for m in (m1, m2):
                        logs = [math.log(r[lv]["value"]) for _, r in by_machine[m]
                                if r.get(lv, {}).get("status") == "ok" and (r[lv].get("value") or 0) > 0]
                        sides.append(statistics.fmean(logs) if logs else None)
                    eager_lv = all(eager_at(f, int(lv)) for f, _ in by_machine[m1] + by_machine[m2])
                    graphed_lv = not any(eager_at(f, int(lv)) for f, _ in by_machine[m1] + by_machine[m2])
                    if None not in sides and (eager_lv or graphed_lv):
                        diffs[eager_lv].append(sides[0] - sides[1])
    if not pairs:
        return None

    def sd(ds: list[float]) -> float | None:
        return math.sqrt(statistics.fmean(d * d for d in ds) / 2) if ds else None

    return {"machine": sd(diffs[False]), "machine_eager": sd(diffs[True]), "pairs": pairs,
            "machines": len(machines), "levels": {"graphed": len(diffs[False]), "eager": len(diffs[True])}}


def _twin(a: dict[str, Any], b: dict[str, Any], knob: str, value: Any) -> bool:
    """b is a with `knob` at `value` (knobs only one of them has, inactive in the other, are not compared)."""
    return b.get(knob) == value and all(a[k] == b[k] for k in set(a) & set(b) if k != knob)


def report(fit: Fit, card: Card, factors: dict[str, float], train: list[dict[str, Any]],
           held: list[dict[str, Any]]) -> None:
    ids = ", ".join(c["id"] for c in held)
    print(f"\n{fit.land['name']}: {len(train)} configs train, {len(held)} held out ({ids});"
          f" client {fit.client}; card {fit.base.name} on {card.gpu.name} ({card.gpu.total_gib} GiB)")
    print("  fitted: " + ", ".join(f"{k} x{f:.2f} = {_get(card.model_dump(), k):.4g}" for k, f in factors.items()))
    for name, part in (("train", train), ("held out", held)):
        per, crash_off = errors(fit, card, part)
        cells = ", ".join(f"c={lv}: {statistics.fmean(abs(e) for e in es):.0%} (n={len(es)}, "
                          f"signed {statistics.fmean(es):+.0%})" for lv, es in sorted(per.items()))
        print(f"  {name:9} mean |error| per level: {cells or '-'}; crash disagreements: "
              f"{'; '.join(crash_off) or 'none'}")
    print("  main effects, measured vs card (throughput ratio when the knob moves, other knobs equal):")
    for knob, move, lv, meas, model in main_effects(fit, card):
        off = (meas - 1) * (model - 1) < 0 and abs(meas - 1) > 0.05 or max(meas, model) / min(meas, model) > 1.25
        print(f"    {knob:28} {move:18} c={lv:<5} measured x{meas:.2f}  card x{model:.2f}"
              + ("   <- the card's physics does not reach this" if off else ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("landscape", help="landscape.json (bench/landscape.py)")
    ap.add_argument("--card", required=True, help="the sim card to start from (name or path)")
    ap.add_argument("--gpu", default=None, help="the GPU's name, when the card's is another")
    ap.add_argument("--gpu-gib", type=float, default=None, help="the GPU's memory as torch reports it (GiB)")
    ap.add_argument("--hold", type=int, default=3, help="hold out every N-th measured config")
    ap.add_argument("--client", default=None)
    ap.add_argument("--out", default=None, help="write the fitted card here")
    ap.add_argument("--name", default=None, help="the fitted card's name (default: the starting card's)")
    ap.add_argument("--noise", action="store_true",
                    help="set the fitted card's noise.launch and noise.level to what the relaunched configs measured")
    ap.add_argument("--passengers", default="", metavar="K1,K2",
                    help="knobs measured to act on nothing in this table: configs that differ only in them count as "
                    "launches of one config in the noise (twins)")
    ap.add_argument("--physics", action="append", default=[], metavar="FIELD=VALUE",
                    help="set a card field of the starting card, e.g. decode.launch_overlap_p=4 (repeatable)")
    args = ap.parse_args()
    land = landscape.load(args.landscape)
    card = load_card(args.card)
    for item in args.physics:
        field, _, value = item.partition("=")
        try:
            card = scaled(card, {}, {field: float(value)})
        except (KeyError, ValueError) as e:
            ap.error(f"--physics {item}: not a numeric card field ({e})")
    if args.gpu or args.gpu_gib:
        gpu = card.gpu.model_copy(update={k: v for k, v in (("name", args.gpu), ("total_gib", args.gpu_gib),
                                  ("memory_gb", args.gpu_gib and args.gpu_gib * 1.073741824)) if v})
        card = card.model_copy(update={"gpu": gpu, "landscape": None})
    fit = Fit(land, card, args.client)
    held = fit.configs[args.hold - 1::args.hold]
    train = [c for c in fit.configs if c not in held]
    factors = fit.fit(train)
    fitted = scaled(card, factors)
    report(fit, fitted, factors, train, held)
    passengers = tuple(k for k in args.passengers.split(",") if k)
    measured = noise(land, fit.client, passengers)
    if measured is None:
        print("  noise: no config launched twice (the card's is kept: "
              f"launch {card.noise.launch:.3f}, level {card.noise.level:.3f})")
    else:
        graphed = noise(land, fit.client, passengers, lambda f: not eager(f))
        eagerly = noise(land, fit.client, passengers, eager)
        twins = f", configs differing only in {', '.join(passengers)} as twins" if passengers else ""
        print(f"  noise ({fit.client}, {measured['launches']} launches of {measured['configs']} configs{twins}): "
              f"launch {measured['launch']:.3f}, level {measured['level']:.3f} (log-normal sds; the card's: "
              f"launch {card.noise.launch:.3f}, level {card.noise.level:.3f})")
        for name, m in (("graphed", graphed), ("eager", eagerly)):
            print(f"    {name}: " + ("no config launched twice" if m is None else
                  f"launch {m['launch']:.3f}, level {m['level']:.3f} ({m['launches']} launches of {m['configs']})"))
        if args.noise:
            values = {"noise.launch": (graphed or measured)["launch"], "noise.level": (graphed or measured)["level"]}
            if graphed is not None and eagerly is not None:
                values["noise.launch_eager"] = eagerly["launch"]
            fitted = scaled(fitted, {}, values)
    across = machine_noise(land, fit.client, passengers)
    if across is None:
        print("  machines: no config read on two machines (the card's machine noise is kept)")
    else:
        fmt = lambda v: "-" if v is None else f"{v:.3f}"      # noqa: E731
        print(f"  machines ({fit.client}, {across['pairs']} configs on two of {across['machines']} machines): "
              f"machine {fmt(across['machine'])} on {across['levels']['graphed']} graphed levels, machine_eager "
              f"{fmt(across['machine_eager'])} on {across['levels']['eager']} eager ones (log-normal sds; the card's: "
              f"{card.noise.machine:.3f}, {fmt(card.noise.machine_eager)})")
        if args.noise:
            fitted = scaled(fitted, {}, {f"noise.{k}": across[k] for k in ("machine", "machine_eager")
                                         if across[k] is not None})
    if args.name:
        fitted = fitted.model_copy(update={"name": args.name})
    if args.out:
        Path(args.out).write_text(yaml.safe_dump(fitted.model_dump(mode="json", exclude_none=True), sort_keys=False))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
