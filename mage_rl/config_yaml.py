"""Reading a config file: YAML with duplicate keys refused, ``--set`` overrides, and
validation errors worded for people (the section's valid keys, a close match).

:func:`mage_rl.config.load_config` puts these together; the sections live there.
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel


def set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ValueError(f"--set {dotted}: {key!r} is not a section")
    node[keys[-1]] = value


def parse_overrides(items: list[str]) -> list[tuple[str, Any]]:
    """``["a.b=1", "c=x"]`` -> ``[("a.b", 1), ("c", "x")]``; values are read as YAML."""
    out = []
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects key=value, got {item!r}")
        out.append((key.strip(), yaml.safe_load(raw)))
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key repeated in one mapping (YAML 1.2 forbids
    it; PyYAML would keep the last value silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            line = key_node.start_mark.line + 1
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} appears twice in one section (lines {seen[key]} and "
                    f"{line}); keep one",
                    key_node.start_mark,
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path) -> dict[str, Any]:
    """The top-level mapping of a config file, or a ``ValueError`` naming file and line."""
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        context = getattr(exc, "context", None)
        started = getattr(exc, "context_mark", None)
        if context and started is not None:
            context += f" started at line {started.line + 1}"
        detail = f"{problem} ({context})" if context else problem
        raise ValueError(f"{where}: not valid YAML: {detail}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if data is None:
        raise ValueError(
            f"{path} is empty; a config names at least its model, e.g. 'policy: {{model: "
            "tiny}' (see configs/ for complete examples)"
        )
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level must be a mapping of sections")
    return data


def _section_fields(cls: Any, loc: tuple[Any, ...]) -> list[str] | None:
    """The field names of the section at ``loc`` inside ``cls``, if it is a section."""
    for key in loc:
        if isinstance(cls, type) and issubclass(cls, BaseModel):
            field = cls.model_fields.get(str(key))
            cls = field.annotation if field else None
        elif dataclasses.is_dataclass(cls):
            types = {f.name: f.type for f in dataclasses.fields(cls)}
            cls = types.get(str(key))
        else:
            return None
        if get_origin(cls) is not None:  # Optional[Section] and the like
            cls = next((a for a in get_args(cls) if isinstance(a, type)), None)
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        return list(cls.model_fields)
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    return None


def describe_error(err: Any, cls: type[BaseModel]) -> str:
    loc = tuple(err["loc"])
    where = ".".join(str(p) for p in loc) or "(config)"
    if err["type"] in ("extra_forbidden", "unexpected_keyword_argument") and loc:
        valid = _section_fields(cls, loc[:-1])
        if valid is not None:
            section = ".".join(str(p) for p in loc[:-1]) or "the top level"
            close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            return f"  {where}: unknown key{hint} Valid keys of {section}: {', '.join(valid)}"
    message = err["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    return f"  {where}: {message}"


BASE_DIR_KEY = "_base_dir"


def with_plugins_loaded(data: Any) -> Any:
    """Load the plugins a raw config names, with their file paths made absolute.

    Plugins register the names the rest of the config may use, so they load before any
    section is checked. ``load_config`` passes the config file's folder under
    :data:`BASE_DIR_KEY`; relative plugin files are read from there and stored absolute,
    so a saved copy of the config (a run's ``config.yaml``) still finds them.
    """
    if not isinstance(data, dict):
        return data
    data = dict(data)
    base_dir = data.pop(BASE_DIR_KEY, None)
    plugins = data.get("plugins")
    if plugins:
        from mage_rl.plugins import PluginError, load_plugin, plugin_path

        if isinstance(plugins, str) or not isinstance(plugins, list):
            raise ValueError("plugins must be a list of module names or .py files")
        resolved = [plugin_path(str(p), base_dir) for p in plugins]
        for spec in resolved:
            try:
                load_plugin(spec)
            except PluginError as err:
                raise ValueError(str(err)) from None
        data["plugins"] = resolved
    return data
