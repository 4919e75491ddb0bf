"""Energy and cost per token: a level's GPU power and the profile's `cost:` block as per-token figures.

One home for the arithmetic, used by the live ladder (runners/server/ladder.py, power sampled on the host) and the
stand-in's virtual clock (tunectl/wiring/virtual.py). All figures are per level, in the level's metrics, beside
`output_throughput` (the steady window's when measured):

- `gpu_power_w`: the mean board power per GPU over the level (nvidia-smi `power.draw` / NVML), `power_gpus` GPUs
- `output_throughput_per_gpu`: tok/s / GPUs
- `joules_per_output_token` = gpu_power_w x GPUs / tok/s, and its inverse `output_tokens_per_joule`
- `usd_per_million_output_tokens` = gpu_hour_usd x GPUs / 3600 / tok/s x 1e6, and `output_tokens_per_dollar`
"""
from __future__ import annotations

from pydantic import Field

from tunectl.yamlmodel import Strict

ENERGY_KEYS = ("gpu_power_w", "joules_per_output_token", "output_tokens_per_joule", "output_throughput_per_gpu")
COST_KEYS = ("usd_per_million_output_tokens", "output_tokens_per_dollar")


class Cost(Strict):
    """`cost:` in a profile: what one GPU costs per hour (on-demand, reserved, or amortized: your number)."""

    gpu_hour_usd: float = Field(gt=0, description="price of one GPU for one hour, in US dollars")
    note: str = ""


def energy_metrics(throughput: float, gpus: int, watts: float | None = None,
                   gpu_hour_usd: float | None = None) -> dict[str, float]:
    """The level's per-GPU, energy and cost figures; {} without throughput or GPUs."""
    if throughput <= 0 or gpus <= 0:
        return {}
    out = {"output_throughput_per_gpu": round(throughput / gpus, 3), "power_gpus": float(gpus)}
    if watts is not None and watts > 0:
        out["gpu_power_w"] = round(watts, 2)
        out["joules_per_output_token"] = round(watts * gpus / throughput, 6)
        out["output_tokens_per_joule"] = round(throughput / (watts * gpus), 6)
    if gpu_hour_usd:
        usd_per_s = gpu_hour_usd * gpus / 3600.0
        out["usd_per_million_output_tokens"] = round(usd_per_s / throughput * 1e6, 6)
        out["output_tokens_per_dollar"] = round(throughput / usd_per_s, 3)
    return out


def level_energy(lv: object) -> dict[str, float]:
    """A level's energy and cost figures (the keys above that it has); {} for None."""
    metrics = getattr(lv, "metrics", None) or {}
    return {k: float(metrics[k]) for k in (*ENERGY_KEYS, *COST_KEYS) if k in metrics}
