from __future__ import annotations

from pathlib import Path

import pytest

from tests.reports.fixtures import build_running, build_search_study, build_sweep


@pytest.fixture(scope="session")
def results_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("results")
    build_running(root)
    build_sweep(root)
    build_search_study(root)   # written last: the most recent study
    return root
