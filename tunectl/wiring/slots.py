"""GPU slots: each host's GPUs split into groups of one trial's size; one trial per slot at a time.

A slot is a host, its GPU group and a port. Its trials see the profile through `Slot.profile`: `host.gpus` is the
group (CUDA_VISIBLE_DEVICES, and the GPU hygiene before and after a launch looks at those GPUs only), and
`server.port` is the host's base port + slot index x PORT_STRIDE, moved up to a free one if that is taken. Every
trial has its own trial dir under the host's workdir (its run id), so slots never share files; a slot's trial is
torn down by its own process group only.

One host with one slot and no `host.gpus` is the plain case: the profile unchanged (no CUDA_VISIBLE_DEVICES).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tunectl.errors import UsageError
from tunectl.profile import HostSpec, Profile

PORT_STRIDE = 10
PARALLEL_FLAGS = {"tp": ("tp-size", "tensor-parallel-size"), "pp": ("pp-size", "pipeline-parallel-size"),
                  "dp": ("dp-size", "data-parallel-size")}


@dataclass
class Slot:
    host: int                    # index in the study's hosts
    index: int                   # slot number on its host
    gpus: list[int] | None       # None: whatever the host shows (the plain case)
    port: int
    profile: Profile             # the profile as this slot's trials see it
    runner: Any                  # tunectl.runners.hosts.base.Runner of its host

    @property
    def key(self) -> str:
        return host_key(self.profile, self.runner.name)

    @property
    def label(self) -> str:
        return f"{self.runner.name}#{self.index}"

    def record(self) -> dict[str, Any]:
        return {"host": self.runner.name, "slot": self.index, "gpus": self.gpus, "port": self.port}


def host_key(prof: Profile, runner_name: str) -> str:
    """Who holds a trial in the study (locks, recovery): the host and its GPUs."""
    gpus = ",".join(str(g) for g in prof.host.gpus) if prof.host.gpus is not None else "all"
    return f"{runner_name}:gpus={gpus}"


def hosts_of(prof: Profile) -> list[HostSpec]:
    return list(prof.hosts) or [prof.host]


def _largest(prof: Profile, names: tuple[str, ...]) -> int:
    """The flag's value among the base flags, or the largest its search-space knob can take."""
    values = [prof.server.flags[n] for n in names if n in prof.server.flags]
    for knob, spec in prof.search.space.items():
        if (spec.flag or knob) in names:
            values += list(spec.choices or []) + ([spec.high] if spec.high is not None else [])
    return max([int(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)] or [1])


def gpus_per_trial(prof: Profile) -> int:
    """`server.gpus_per_trial`, else tp x pp (x dp without DP attention), the largest the search may pick."""
    if prof.server.gpus_per_trial is not None:
        return prof.server.gpus_per_trial
    tp, pp, dp = (_largest(prof, PARALLEL_FLAGS[k]) for k in ("tp", "pp", "dp"))
    return tp * pp * (1 if prof.server.flags.get("enable-dp-attention") else dp)


def box_gpus(prof: Profile, spec: HostSpec, runner: Any) -> list[int] | None:
    """The GPUs a host offers: `host.gpus`, else the stand-in's card (the box it plays), else nvidia-smi's list;
    None where the host cannot say."""
    if spec.gpus is not None:
        return list(spec.gpus)
    from tunectl.engines import engine

    if not engine(prof).uses_gpus:
        from tunectl.sim.card import load_card

        return list(range(load_card(prof.server.sim.card).gpu.count))
    from tunectl.runners.checks import hostcheck

    try:
        return [g.index for g in hostcheck.query(runner)[0]] or None
    except hostcheck.NvidiaSmiError:
        return None


def slot_profile(prof: Profile, spec: HostSpec, gpus: list[int] | None, port: int) -> Profile:
    return prof.model_copy(update={"host": spec.model_copy(update={"gpus": gpus}), "hosts": [],
                                   "server": prof.server.model_copy(update={"port": port})})


def _free_port(runner: Any, want: int, taken: set[int]) -> int:
    for port in range(want, min(want + PORT_STRIDE, 65536)):
        if port not in taken and runner.port_owner(port) is None:
            return port
    raise UsageError(f"server.port: ports {want}-{want + PORT_STRIDE - 1} on {runner.name} are all in use; "
                     "stop what holds them or set another server.port")


def host_slots(prof: Profile, host: int, spec: HostSpec, runner: Any, offset: int = 0) -> list[Slot]:
    """The host's slots; their ports start `offset` strides above the base (slots of earlier hosts: hosts that
    share a network, such as containers or workers of one machine, never collide on a port)."""
    size, ids = gpus_per_trial(prof), box_gpus(prof, spec, runner)
    if ids is not None and len(ids) < size:
        raise UsageError(f"{prof.source or prof.name}: host.gpus: {runner.name} offers {len(ids)} GPUs "
                         f"({ids}) but a trial needs {size} (server.gpus_per_trial, or tp-size x pp-size x dp-size)")
    groups: list[list[int] | None] = [ids[i:i + size] for i in range(0, len(ids) - size + 1, size)] if ids else [None]
    if len(groups) == 1 and spec.gpus is None and offset == 0:
        return [Slot(host, 0, None, prof.server.port, slot_profile(prof, spec, None, prof.server.port), runner)]
    out: list[Slot] = []
    for i, group in enumerate(groups):
        port = _free_port(runner, prof.server.port + (offset + i) * PORT_STRIDE, {s.port for s in out})
        out.append(Slot(host, i, group, port, slot_profile(prof, spec, group, port), runner))
    return out


def make_slots(prof: Profile, runners: list[Any], limit: int | None = None) -> list[Slot]:
    """Every host's slots, interleaved across hosts (slot 0 of each host first), at most `limit` of them."""
    per_host: list[list[Slot]] = []
    for i, (spec, r) in enumerate(zip(hosts_of(prof), runners, strict=True)):
        per_host.append(host_slots(prof, i, spec, r, offset=sum(map(len, per_host))))
    out = [s for rank in range(max(map(len, per_host))) for slots in per_host for s in slots[rank:rank + 1]]
    return out[:limit] if limit else out
