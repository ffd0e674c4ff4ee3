"""Plugins: user code that registers environments, opponents and agents.

A plugin is a Python module or file; importing it runs its ``register_env``,
``register_opponent`` and ``register_agent`` calls. Three ways load one:

1. the command line, before the subcommand: ``mage --plugin my_pkg.agents --plugin
   ./my_env.py train config.yaml`` (repeatable);
2. a config's top-level list: ``plugins: [my_pkg.agents, ./my_env.py]`` (a relative
   file path is read from the config file's folder);
3. an installed package's entry point in the group ``mage_rl.plugins``, loaded by every
   ``mage`` command: ``[project.entry-points."mage_rl.plugins"] my_env = "my_pkg.env"``.
   An entry point may name a module or a function, which is called with no arguments.

Each plugin loads once per process, however many ways name it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import os
import sys
import traceback
from collections.abc import Iterable
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "mage_rl.plugins"
ENV_VAR = "MAGE_RL_PLUGINS"
"""Plugins a command loaded, for the processes it starts (rollout workers): module names
and absolute file paths, separated by ``os.pathsep``."""

_LOADED: dict[str, ModuleType | None] = {}


class PluginError(RuntimeError):
    """A plugin could not be found or raised while loading; the message says which."""


def _is_path(spec: str) -> bool:
    return spec.endswith(".py") or "/" in spec or "\\" in spec


def plugin_path(spec: str, base_dir: str | Path | None = None) -> str:
    """``spec`` with a relative file path made absolute against ``base_dir`` (module names
    are returned as they are)."""
    if not _is_path(spec):
        return spec
    path = Path(spec).expanduser()
    if not path.is_absolute():
        path = Path(base_dir or ".") / path
    return str(path.resolve())


def load_plugin(spec: str, base_dir: str | Path | None = None) -> ModuleType:
    """Import a plugin by module name (``my_pkg.env``) or file path (``./my_env.py``).

    Args:
        spec: A module name, or a path to a ``.py`` file.
        base_dir: Folder that a relative file path is read from (default: the current
            directory).

    Returns:
        The imported module (the same object on a second call).

    Raises:
        PluginError: The module or file does not exist, or importing it raised; the
            message names the plugin and holds the traceback.
    """
    if _is_path(spec):
        path = Path(spec).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = Path(base_dir) / path
        path = path.resolve()
        key = str(path)
        if key in _LOADED and _LOADED[key] is not None:
            return _LOADED[key]  # type: ignore[return-value]
        if not path.is_file():
            raise PluginError(f"plugin {spec!r}: no such file {path}")
        # A stable module name per file, so that pickling (Ray workers) and a second
        # load find the same module.
        name = f"mage_rl_plugin_{path.stem}_{hashlib.sha1(key.encode()).hexdigest()[:8]}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise PluginError(f"plugin {spec!r}: {path} cannot be imported as a Python module")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except BaseException as err:
            sys.modules.pop(name, None)
            where = spec if spec == str(path) else f"{spec} ({path})"
            raise PluginError(f"plugin {where} failed to load:\n{traceback.format_exc()}") from err
        _LOADED[key] = module
        return module
    if spec in _LOADED and _LOADED[spec] is not None:
        return _LOADED[spec]  # type: ignore[return-value]
    try:
        module = importlib.import_module(spec)
    except ModuleNotFoundError as err:
        if err.name and spec.startswith(err.name):
            raise PluginError(
                f"plugin {spec!r}: no module named {err.name!r} (install it, add its folder "
                "to PYTHONPATH, or give the path of a .py file)"
            ) from err
        raise PluginError(f"plugin {spec!r} failed to load:\n{traceback.format_exc()}") from err
    except BaseException as err:
        raise PluginError(f"plugin {spec!r} failed to load:\n{traceback.format_exc()}") from err
    _LOADED[spec] = module
    return module


def load_plugins(specs: Iterable[str], base_dir: str | Path | None = None) -> list[ModuleType]:
    """Load several plugins in order (see :func:`load_plugin`)."""
    return [load_plugin(spec, base_dir) for spec in specs]


def export_plugins(specs: Iterable[str]) -> None:
    """Add plugins to :data:`ENV_VAR`, so that child processes load them too."""
    current = [p for p in os.environ.get(ENV_VAR, "").split(os.pathsep) if p]
    for spec in specs:
        path = plugin_path(spec)
        if path not in current:
            current.append(path)
    if current:
        os.environ[ENV_VAR] = os.pathsep.join(current)


def load_process_plugins() -> None:
    """Load what this process should know: entry points and the plugins in :data:`ENV_VAR`
    (set by the command that started it)."""
    load_entry_point_plugins()
    load_plugins(p for p in os.environ.get(ENV_VAR, "").split(os.pathsep) if p)


def load_entry_point_plugins() -> list[str]:
    """Load every plugin installed under the ``mage_rl.plugins`` entry-point group (once).

    Returns:
        Names of the entry points loaded by this call.

    Raises:
        PluginError: An entry point failed to load or its function raised.
    """
    loaded = []
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        key = f"entry-point:{entry.name}={entry.value}"
        if key in _LOADED:
            continue
        try:
            target = entry.load()
            if callable(target) and not isinstance(target, ModuleType):
                target()
        except BaseException as err:
            raise PluginError(
                f"plugin entry point {entry.name!r} ({entry.value}) failed to load:\n"
                f"{traceback.format_exc()}"
            ) from err
        _LOADED[key] = None
        loaded.append(entry.name)
        logger.debug("loaded plugin entry point %s", entry.name)
    return loaded
