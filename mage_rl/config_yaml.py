"""Reading a config file: YAML with duplicate keys refused, ``--set`` overrides, and
validation errors worded for people (the section's valid keys, a close match, and where
the value came from: the file and line, or the ``--set`` that gave it).

Numbers are read as YAML 1.2 reads them: ``1e-4`` is a float (YAML 1.1, PyYAML's default,
reads it as a string, which strict validation would then refuse).

:func:`mage_rl.config.load_config` puts these together; the sections live there.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel

from mage_rl.plugins import PluginError, load_plugin, plugin_path


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
        try:
            value = yaml.load(raw, Loader=_UniqueKeyLoader)  # noqa: S506
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or str(exc)
            raise ValueError(f"--set {item}: the value is not valid YAML: {problem}") from None
        out.append((key.strip(), value))
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key repeated in one mapping (YAML 1.2 forbids
    it; PyYAML would keep the last value silently) and reads ``1e-4`` as a float."""

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


# YAML 1.2's floats: PyYAML (YAML 1.1) wants a dot in 1.0e-4, so it reads 1e-4 as text.
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def key_lines(path: Path) -> dict[tuple[str, ...], int]:
    """The line of every key in a YAML file, by its path of keys: ``("policy", "model")``."""
    try:
        root = yaml.compose(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except (yaml.YAMLError, UnicodeDecodeError):
        return {}
    lines: dict[tuple[str, ...], int] = {}

    def walk(node: Any, prefix: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key = prefix + (str(key_node.value),)
                lines[key] = key_node.start_mark.line + 1
                walk(value_node, key)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                lines[prefix + (str(i),)] = item.start_mark.line + 1
                walk(item, prefix + (str(i),))

    walk(root, ())
    return lines


@dataclasses.dataclass
class Sources:
    """Where each value of a config came from, to say so in its error.

    Attributes:
        path: The config file (``None``: no file).
        lines: The file's line of each key path (:func:`key_lines`).
        overrides: The ``--set KEY=VALUE`` item of each key path it set.
    """

    path: Path | None = None
    lines: dict[tuple[str, ...], int] = dataclasses.field(default_factory=dict)
    overrides: dict[tuple[str, ...], str] = dataclasses.field(default_factory=dict)

    def of(self, key: tuple[Any, ...] | str) -> str | None:
        """``FILE:LINE`` or ``--set KEY=VALUE`` for a key path, ``None`` for a default.

        An override of the key or of a section holding it wins over the file."""
        parts = tuple(key.split(".")) if isinstance(key, str) else tuple(str(k) for k in key)
        for n in range(len(parts), 0, -1):
            if parts[:n] in self.overrides:
                return f"--set {self.overrides[parts[:n]]}"
        if parts in self.lines:
            return f"{self.path}:{self.lines[parts]}"
        return None

    def locate(self, keys: list[tuple[Any, ...]], line: str) -> str:
        """``line`` with where its keys came from: ``FILE:LINE: `` before it (as
        compilers write it), ``(from --set KEY=VALUE)`` after it."""
        found = list(dict.fromkeys(s for s in (self.of(k) for k in keys) if s))
        files = [s for s in found if not s.startswith("--set ")]
        sets = [s for s in found if s.startswith("--set ")]
        if files:
            line = f"{', '.join(files)}: {line}"
        if sets:
            line = f"{line} (from {' and '.join(sets)})"
        return line


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
        else:
            return None
        if get_origin(cls) is not None:  # Optional[Section] and the like
            cls = next((a for a in get_args(cls) if isinstance(a, type)), None)
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        return list(cls.model_fields)
    return None


# Errors of a value's type or form: the message says what was wanted, "got" adds what
# was given (pydantic leaves it out).
_SHOW_INPUT = re.compile(r"_type$|_parsing$|^int_from_float$|^literal_error$|^finite_number$")
_DOTTED = re.compile(r"\b([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+)")


def describe_error(err: Any, cls: type[BaseModel], sources: Sources | None = None) -> str:
    """One line of an ``invalid config`` message: where the value came from (file and
    line, or ``--set``), its dotted key, and what is wrong."""
    loc = tuple(err["loc"])
    where = ".".join(str(p) for p in loc) or "(config)"
    message = err["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if err["type"] in ("extra_forbidden", "unexpected_keyword_argument") and loc:
        valid = _section_fields(cls, loc[:-1])
        if valid is not None:
            section = ".".join(str(p) for p in loc[:-1]) or "the top level"
            close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else "."
            message = f"unknown key{hint} Valid keys of {section}: {', '.join(valid)}"
    elif _SHOW_INPUT.search(err["type"]) and isinstance(
        err.get("input"), str | int | float | bool | type(None)
    ):
        message += f", got {json.dumps(err['input'])}"
    named: list[tuple[str, ...]] = []
    if len(loc) <= 1:  # a rule of a section or of the whole config: the keys it names
        sections = set(cls.model_fields)
        named = [
            tuple(k.split(".")) for k in _DOTTED.findall(message) if k.split(".")[0] in sections
        ]
    if not loc or (named and message.startswith(".".join(named[0]))):
        line = message  # the message names its keys
    else:
        line = f"{where}: {message}"
    if sources is not None:
        line = sources.locate(named or ([loc] if loc else []), line)
    return f"  {line}"


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
