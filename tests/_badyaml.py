"""Write an edited copy of a YAML file and return the one-line error its loader raises (profiles, sim cards)."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tunectl.errors import ProfileError


def bad_yaml_error(tmp_path: Path, source: Path, edit: Callable[[Any], Any], load: Callable[[Path], Any]) -> str:
    data = yaml.safe_load(source.read_text())
    edit(data)
    path = tmp_path / f"bad-{source.name}"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ProfileError) as info:
        load(path)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"{path}:")
    return msg
