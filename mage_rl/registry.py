"""Named registries: environments, opponents and agents all have this one shape.

A :class:`Registry` maps names (and aliases) to entries. Every command and config reads
the same registries, so a name a plugin registers works everywhere a built-in name does.
An unknown name fails with the registered names and how to load the code that would
register it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

PLUGIN_HINT = (
    "load the code that registers it with `mage --plugin MODULE_OR_FILE ...`, a "
    "`plugins:` list in the config, or the `mage_rl.plugins` entry-point group"
)


class UnknownNameError(ValueError):
    """A name that no registry entry has (a ``ValueError``, as every bad input)."""


class Registry(Generic[T]):
    """Entries by name, with aliases.

    Args:
        kind: What the entries are, for messages (``"environment"``, ``"agent"``).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._aliases: dict[str, str] = {}

    def register(
        self, name: str, entry: T, *, aliases: tuple[str, ...] = (), replace: bool = False
    ) -> T:
        """Add ``entry`` under ``name`` (and its aliases); returns the entry.

        Raises:
            ValueError: An empty name, a name with ``:`` or ``=`` (they separate the parts
                of spec strings), or a name already taken by another entry unless
                ``replace`` is true.
        """
        for key in (name, *aliases):
            if not key or any(c in key for c in ":=, "):
                raise ValueError(
                    f"{self.kind} name {key!r} must be non-empty and hold no ':', '=', ',' "
                    "or space (they separate the parts of spec strings)"
                )
            taken = self._aliases.get(key)
            if taken is not None and taken != name and not replace:
                raise ValueError(
                    f"{self.kind} name {key!r} is already registered (for {taken!r}); "
                    "choose another name or pass replace=True"
                )
        if name in self._entries and not replace:
            raise ValueError(
                f"{self.kind} {name!r} is already registered; pass replace=True to replace it"
            )
        self._entries[name] = entry
        for key in (name, *aliases):
            self._aliases[key] = name
        return entry

    def canonical(self, name: str) -> str:
        """The registered name behind ``name`` or one of its aliases.

        Raises:
            UnknownNameError: Nothing is registered under ``name``.
        """
        try:
            return self._aliases[name]
        except KeyError:
            raise UnknownNameError(self.unknown_message(name)) from None

    def get(self, name: str) -> T:
        """The entry of ``name`` (or of an alias)."""
        return self._entries[self.canonical(name)]

    def unknown_message(self, name: str) -> str:
        """What to say about a name nothing is registered under."""
        known = ", ".join(self.names()) or "none"
        return f"unknown {self.kind} {name!r}; registered: {known}. To use your own, {PLUGIN_HINT}"

    def names(self) -> list[str]:
        """Registered names (aliases excluded), in registration order."""
        return list(self._entries)

    def aliases(self) -> dict[str, str]:
        """Every accepted name (aliases included) and the name it stands for."""
        return dict(self._aliases)

    def unregister(self, name: str) -> None:
        """Remove an entry and its aliases (tests and interactive sessions)."""
        canonical = self.canonical(name)
        del self._entries[canonical]
        self._aliases = {k: v for k, v in self._aliases.items() if v != canonical}

    def __contains__(self, name: object) -> bool:
        return name in self._aliases

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
