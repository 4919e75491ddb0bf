"""Every load client passes the Client conformance suite (tests/runners/client_conformance.py)."""
from __future__ import annotations

import importlib.util
import typing

import pytest

from tests.runners.client_conformance import *  # noqa: F403
from tunectl.profile import BenchSpec, WorkloadSpec
from tunectl.runners import clients
from tunectl.runners.clients.base import Client

REAL_CLIENT_DEPS = ("sglang", "transformers", "datasets", "pybase64")


def _missing(name: str) -> str | None:
    if name != "bench_serving":
        return None
    gone = [m for m in REAL_CLIENT_DEPS if importlib.util.find_spec(m) is None]
    return f"the real client needs {', '.join(gone)}" if gone else None


def _literals(annotation: object) -> set[str]:
    if typing.get_origin(annotation) is typing.Literal:
        return set(typing.get_args(annotation))
    return set().union(*(_literals(a) for a in typing.get_args(annotation)))


@pytest.fixture(params=clients.CLIENTS)
def client(request: pytest.FixtureRequest) -> Client:
    if why := _missing(request.param):
        pytest.skip(why)
    return clients.get(request.param)


def test_each_name_is_a_client_of_that_name_and_a_profile_choice() -> None:
    for name in clients.CLIENTS:
        impl = clients.get(name)
        assert impl.name == name and isinstance(impl.streams_progress, bool)
    for model in (BenchSpec, WorkloadSpec):
        assert _literals(model.model_fields["client"].annotation) == set(clients.CLIENTS)
    with pytest.raises(ValueError, match="valid: builtin, bench_serving"):
        clients.get("guidellm")
