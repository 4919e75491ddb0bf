"""Strict YAML files validated by a pydantic model: one readable line per mistake (file:line, field, value, problem).

Profiles and sim cards both load through `load_model`. The error names the file and the line of the offending key
(walking the composed YAML node tree along the pydantic error location), the dotted field, the value found and
what is expected (for an unknown key: the valid keys at that place).
"""
from __future__ import annotations

import os
import re
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from tunectl.errors import ProfileError

M = TypeVar("M", bound=BaseModel)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _line_of(node: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """Walk a composed YAML node tree along a pydantic error location; return a 1-based line."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            nxt = next((v for k, v in node.value if k.value == str(part)), None)
            if nxt is None:
                key = next((k for k, _ in node.value if k.value == str(part)), None)
                return key.start_mark.line + 1 if key is not None else line
            node = nxt
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            break
        line = node.start_mark.line + 1
    return line


def _value_at(data: Any, loc: tuple[Any, ...]) -> Any:
    for part in loc:
        found = part in data if isinstance(data, dict) else (
            isinstance(data, list) and isinstance(part, int) and part < len(data))
        if not found:
            return None
        data = data[part]
    return data


def _problem(err: dict[str, Any]) -> str:
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        return "unknown key"
    if err["type"] == "missing":
        return "missing key"
    if err["type"] == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        return f"must be one of {expected}"
    return str(msg).removeprefix("Value error, ")


def _clean_loc(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    # pydantic appends the literal/union member name to some locations; keep the data path only
    return tuple(p for p in loc if not (isinstance(p, str) and (p.startswith("literal[") or p in ("str", "int"))))


def _models_in(ann: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds: itself, an Optional member, a dict's value, a list's item."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [ann]
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(ann):
        out += _models_in(arg)
    return out


def model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that validates the mapping at `loc` (through nested models, dicts and lists of them)."""
    model: type[BaseModel] | None = root
    pending: list[type[BaseModel]] = []          # a dict/list of models: the next part is a key or an index
    for part in loc:
        if pending:
            model, pending = pending[0], []
            continue
        fld = model.model_fields.get(part) if model is not None and isinstance(part, str) else None
        if fld is None:
            return None
        ann = fld.annotation
        direct = isinstance(ann, type) and issubclass(ann, BaseModel)
        cands = _models_in(ann)
        if not cands:
            return None
        origin = typing.get_origin(ann)
        nested = [a for a in typing.get_args(ann) if typing.get_origin(a) in (dict, list)]
        if direct or (origin not in (dict, list) and not nested):
            model = cands[0]
        else:
            model, pending = None, cands
    return model


def validation_error(file: str, exc: ValidationError, data: Any, root: yaml.Node | None,
                     model: type[BaseModel]) -> ProfileError:
    err = exc.errors()[0]
    loc = _clean_loc(tuple(err["loc"]))
    field = ".".join(str(p) for p in loc) or "(top level)"
    value = _value_at(data, loc)
    problem = _problem(err)
    inner = re.match(r"([\w.-]+(?:\[\d+\])?(?:\.[\w-]+)*): (.*)", problem, re.S)
    if inner and (not loc or inner.group(1).startswith(f"{field}.")):   # a section's check names the field: there
        loc = tuple(int(p) if p.isdigit() else p for p in re.split(r"[.\[\]]+", inner.group(1)) if p)
        field, problem, value = inner.group(1), inner.group(2), None      # the check's message says the value
    if err["type"] in ("extra_forbidden", "missing"):
        parent = _value_at(data, loc[:-1])
        at = model_at(model, loc[:-1])
        if at is not None and isinstance(parent, dict):
            if err["type"] == "missing":
                fld = at.model_fields.get(str(loc[-1]))
                problem += f" (expected: {fld.description})" if fld is not None and fld.description else ""
            else:
                problem += f"; valid keys: {', '.join(sorted(at.model_fields))}"
    line = _line_of(root, loc if err["type"] != "missing" else loc[:-1])
    return ProfileError(file, field, value, problem, line)


def _key_twice(node: yaml.Node | None, path: str = "", walked: set[int] | None = None) -> tuple[str, int] | None:
    """(the dotted key, its 1-based line) of the first key a mapping gives twice, else None. A node an alias
    repeats is walked once (a "billion laughs" file stays linear)."""
    walked = set() if walked is None else walked
    if id(node) in walked:
        return None
    walked.add(id(node))
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for k, v in node.value:
            name = str(k.value)
            here = f"{path}.{name}" if path else name
            if name in seen:
                return here, k.start_mark.line + 1
            seen.add(name)
            found = _key_twice(v, here, walked)
            if found:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            found = _key_twice(v, f"{path}[{i}]", walked)
            if found:
                return found
    return None


def read_yaml(file: str, what: str) -> tuple[Any, yaml.Node | None]:
    try:
        text = Path(file).read_text(encoding="utf-8")
    except OSError as e:
        raise ProfileError(file, "(file)", file, f"cannot read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ProfileError(file, "(file)", None, f"not UTF-8 text (byte {e.object[e.start]:#04x} at offset "
                           f"{e.start}): a {what} is a YAML file in UTF-8") from None
    try:
        data, root = yaml.safe_load(text), yaml.compose(text)
        twice = _key_twice(root)
        if twice is not None:
            key, line = twice
            raise ProfileError(file, key, None, "given twice in one mapping (the second would silently win): keep "
                               "one", line)
        return data, root
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        why = " ".join(str(getattr(e, "problem", None) or e).split())    # one line, whatever the parser wrote
        raise ProfileError(file, "(yaml)", None, f"not valid YAML: {why}", mark.line + 1 if mark else None) from None


def load_model(path: str | os.PathLike[str], model: type[M], what: str,
               edit: typing.Callable[[dict[str, Any]], None] | None = None) -> M:
    """Read and validate one YAML file; `edit` may change the parsed data first (CLI overrides)."""
    file = str(path)
    data, root = read_yaml(file, what)
    if not isinstance(data, dict):
        raise ProfileError(file, "(top level)", data, f"a {what} is a YAML mapping")
    if edit is not None:
        edit(data)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise validation_error(file, e, data, root, model) from None
