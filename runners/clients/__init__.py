"""Load clients: each measures one concurrency level against a running server and returns the metrics under
`sglang.bench_serving`'s result keys (the `Client` protocol in `base`). `builtin` is tunectl's own asyncio
client; `bench_serving` runs the real `sglang.bench_serving` on the server's host."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tunectl.runners.clients.base import Client

CLIENTS = ("builtin", "bench_serving")       # each is a module here with a `CLIENT`


def get(name: str) -> Client:
    """The client called `name` (one of CLIENTS; the profile validates the name)."""
    if name not in CLIENTS:
        raise ValueError(f"unknown client {name!r}; valid: {', '.join(CLIENTS)}")
    return importlib.import_module(f"{__name__}.{name}").CLIENT
