"""The package's layers, bottom first: a module imports only its own layer and those below.

``tests/test_imports.py`` checks every import (at module level or inside a function)
against this order, and ``scripts/house_figures.py`` counts the ones that point up.
"""

from __future__ import annotations

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("mage_rl.registry", "mage_rl.fileio", "mage_rl.cache", "mage_rl.net",
              "mage_rl.console", "mage_rl.records", "mage_rl.provenance", "mage_rl.plugins",
              "mage_rl.config_yaml", "mage_rl.train_folder", "mage_rl.layers",
              "mage_rl.defaults", "mage_rl.memory")),
    ("games and opponents", ("mage_rl.envs",)),
    ("engines and models", ("mage_rl.policy",)),
    ("agents and the play loop", ("mage_rl.nodes", "mage_rl.graphs")),
    ("config", ("mage_rl.sections", "mage_rl.config")),
    ("players", ("mage_rl.players",)),
    ("runtime", ("mage_rl.runtime",)),
    ("measurement", ("mage_rl.eval",)),
    ("training", ("mage_rl.rl",)),
    ("cluster", ("mage_rl.cluster",)),
    ("surfaces", ("mage_rl.serve", "mage_rl.view", "mage_rl.bench", "mage_rl.api",
                  "mage_rl.cli", "mage_rl")),
)  # fmt: skip


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of ``module``'s layer (the longest prefix naming it).

    Raises:
        ValueError: A module no layer names.
    """
    best, found = -1, None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), index
    if found is None:
        raise ValueError(f"{module} is in no layer of mage_rl.layers.LAYERS")
    return found


def upward(edges: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Every (importer, imported) pair of ``edges`` whose imported module is higher up."""
    return {(a, b) for a, targets in edges.items() for b in targets if layer_of(b) > layer_of(a)}
