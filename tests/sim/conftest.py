from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sim._server import Server, start


@pytest.fixture
def launch(tmp_path: Path) -> Iterator:
    servers: list[Server] = []

    def _launch(*args: str, **kw) -> Server:
        srv = start(tmp_path, *args, **kw)
        servers.append(srv)
        return srv

    yield _launch
    for s in servers:
        s.stop()
