"""Profiles for tests that launch the stand-in."""
from __future__ import annotations

from pathlib import Path

import yaml

from tests.helpers.ports import free_port
from tunectl.profile import default_profile_path


def fast_default(tmp_path: Path, time_scale: float | None = 0.05) -> tuple[Path, int]:
    """The embedded default with a free port, a private host workdir and a slower stand-in clock: at 0.02 wall s per
    modeled s a 50 ms scheduling hiccup on a busy 2-core test machine reads as 2.5 modeled seconds (None: the
    profile's own clock). -> (path, port)"""
    data = yaml.safe_load(default_profile_path().read_text())
    data["server"]["port"] = free_port()
    if time_scale is not None:
        data["server"]["sim"]["time_scale"] = time_scale
    data.setdefault("host", {})["workdir"] = str(tmp_path / "host")
    prof = tmp_path / "sim-glm5.yaml"
    prof.write_text(yaml.safe_dump(data, sort_keys=False))
    return prof, data["server"]["port"]
