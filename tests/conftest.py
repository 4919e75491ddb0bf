"""Suite-wide: with pytest-xdist (`tests/run.sh` runs two workers), the tests of one real service that must be
started once per machine (Slurm: one slurmctld/slurmd) run in one worker, together."""
from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.xdist_group("slurm"))
