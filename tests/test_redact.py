"""Redaction, in one place (tunectl.redact): what counts as a secret and how it is hidden."""
from __future__ import annotations

import pytest

from tunectl import redact
from tunectl.profile import Profile


def test_env_hides_values_whose_name_says_secret() -> None:
    got = redact.env({"SGLANG_API_KEY": "k", "HF_TOKEN": "t", "DB_PASSWORD": "p", "MY_SECRET": "s", "TP": "8"})
    assert got == {"SGLANG_API_KEY": "<redacted>", "HF_TOKEN": "<redacted>", "DB_PASSWORD": "<redacted>",
                   "MY_SECRET": "<redacted>", "TP": "8"}


def test_text_hides_the_keys_sglang_prints() -> None:
    log = "server_args=ServerArgs(model_path='m', api_key='s3cret', admin_api_key=\"adm1n\", port=30000)"
    cmd = "python3 -m sglang.launch_server --api-key s3cret --admin-api-key=adm1n --port 30000"
    out = redact.text(log) + redact.text(cmd)
    assert "s3cret" not in out and "adm1n" not in out and "port=30000" in out and "--port 30000" in out


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://tune:pw@db:5432/optuna", "postgresql://tune:***@db:5432/optuna"),
    ("postgresql://tune@db/optuna", "postgresql://tune@db/optuna"),
    ("sqlite:///results/s/study.db", "sqlite:///results/s/study.db")])
def test_url_hides_only_the_password(url: str, shown: str) -> None:
    assert redact.url(url) == shown


def test_a_stored_profile_keeps_everything_but_secret_env_values() -> None:
    prof = Profile.model_validate({"name": "r", "model": {"path": "m"},
                                   "server": {"env": {"SGLANG_API_KEY": "k", "OTHER": "x"}, "flags": {"tp-size": 2}}})
    stored = redact.profile(prof)
    assert stored["server"]["env"] == {"SGLANG_API_KEY": "<redacted>", "OTHER": "x"}
    assert stored["server"]["flags"] == {"tp-size": 2} and prof.server.env["SGLANG_API_KEY"] == "k"


def test_a_profile_cannot_put_a_secret_in_flags() -> None:
    for flag in redact.SECRET_FLAGS:
        with pytest.raises(ValueError, match="put secrets in the environment"):
            Profile.model_validate({"name": "r", "model": {"path": "m"}, "server": {"flags": {flag: "k"}}})
