"""`host.slurm`: a Slurm cluster as the place trials run (`host.kind: slurm`, docs/slurm.md).

Every value here reaches Slurm as one element of an argv list (`sbatch --partition=<value>`), never inside a
shell string. `shared_dir` is the filesystem both this machine and the compute nodes see at the same path: trial
jobs write their files there and the coordinator reads them back.
"""
from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from tunectl.yamlmodel import Strict

_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$|^UNLIMITED$|^INFINITE$")


class SlurmSpec(Strict):
    shared_dir: str                        # seen at this path by the coordinator and every node
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit: str = "1:00:00"            # one trial job's limit, Slurm's format (MM, MM:SS, HH:MM:SS, D-HH)
    gpus_per_trial: int | None = Field(None, ge=0)   # None: server.gpus_per_trial, else tp x pp x dp
    cpus_per_trial: int | None = Field(None, ge=1)
    mem: str | None = None                 # sbatch --mem, e.g. 64G
    constraint: str | None = None          # sbatch --constraint (node features, e.g. h100)
    venv: str | None = None                # a virtual environment on the nodes (server.python = <venv>/bin/python)
    container: str | None = None           # sbatch --container: an OCI bundle on the nodes (Slurm's own)
    sbatch_options: list[str] = Field(default_factory=list)   # extra sbatch options, one per element
    poll_s: float = Field(2.0, gt=0)       # how often the coordinator asks squeue about its jobs
    on_resume: Literal["cancel", "wait"] = "cancel"   # a dead coordinator's jobs still running, at the rerun

    @field_validator("time_limit")
    @classmethod
    def _time(cls, v: str) -> str:
        if not _TIME.match(v):
            raise ValueError(f"time_limit {v!r} is not a Slurm time (MM, MM:SS, HH:MM:SS, D-HH:MM:SS)")
        return v

    @field_validator("shared_dir")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"shared_dir {v!r} must be an absolute path the nodes see too")
        return v.rstrip("/") or "/"

    @field_validator("sbatch_options")
    @classmethod
    def _options(cls, v: list[str]) -> list[str]:
        bad = [o for o in v if not o.startswith("-")]
        if bad:
            raise ValueError(f"sbatch_options {bad[0]!r}: each element is one sbatch option (--name=value)")
        return v
