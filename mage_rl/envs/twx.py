"""TextWorld-Express (``textworld-express==1.1.0``) as a text environment.

TextWorld-Express (Jansen and Cote, 2022, arXiv 2208.01174) re-implements eight
TextWorld-style games in a fast simulator: ``coin`` (find the coin and take it),
``twc`` (tidy up: put objects where they belong, close to ALFWorld's pick-and-place),
``cookingworld`` (read a recipe, gather and cook its ingredients), ``mapreader``,
``arithmetic``, ``sorting``, ``simonsays`` and ``peckingorder``. Every game has 1,000
seeds in each of its ``train``, ``dev`` and ``test`` folds; a seed fixes the world.

The variant spec is ``textworld_express:GAME:SPLIT[:small]`` (alias ``twx``): the episode
seed picks one of the split's seeds (under ``replay`` every episode of a meta-episode
gets the same world, under ``fresh`` a new one of the same game). Without ``small`` the
game has TextWorld-Express's default size (coin: 11 rooms with doors); ``small`` is a
size a small model can finish in a few turns (:data:`SMALL_PARAMS`).

Each observation ends with the simulator's list of valid actions. An answer is valid
when it is one of them (case, spacing and a final full stop do not matter); anything
else is invalid (SPEC §3, penalty 0.5): the world does not change and the turn counts.
Success (the game's ``tasksuccess``) is a win, +10; a game's explicit failure
(``taskfailure``, e.g. cooking an ingredient the wrong way in cookingworld) a loss, -10; running out
of turns (30 by default) unfinished. The 0-1 score is shown, not rewarded.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from mage_rl.envs.opponents import Opponent
from mage_rl.envs.textworld_registry import make_variant_env, register_variants
from mage_rl.envs.textworlds import (
    Reply,
    Simulator,
    SimulatorEnv,
    TaskVariant,
    import_simulator,
    make_pool,
    short,
    task_text,
)

NAME = "textworld_express"
ALIASES = ("twx",)
GAMES = (
    "cookingworld",
    "coin",
    "twc",
    "mapreader",
    "arithmetic",
    "sorting",
    "simonsays",
    "peckingorder",
)
"""The games of textworld-express 1.1.0 (its ``GAME_NAMES``)."""

SMALL_PARAMS = {
    "coin": "numLocations=3,numDistractorItems=0,includeDoors=0",
    "twc": "numLocations=1,numItemsToPutAway=1,includeDoors=0",
    "cookingworld": "numLocations=1,numIngredients=1,numDistractorItems=0,includeDoors=0",
    "mapreader": "numLocations=4,maxDistanceApart=2,maxDistractorItemsPerLocation=0,includeDoors=0",
    "arithmetic": "",
    "sorting": "hidden_problemsize=2",
    "simonsays": "gameLength=3,numDistractors=2",
    "peckingorder": "",
}
"""The ``small`` size of each game, in TextWorld-Express's ``gameParams`` syntax."""

PRESET_GAMES = ("coin", "twc", "cookingworld")
"""The games of the ``twx_train`` and ``twx_unseen`` presets, each at the small size."""
DEFAULT_MAX_TURNS = 30
_UNKNOWN = "unknown action"


_FILLER = (
    (re.compile(r"You are in the ([^.]+)\.\s*"), r"In the \1: "),
    (
        re.compile(r"(?:In (?:one|another) part of the room you see|There is also|You also see) "),
        "",
    ),
    (re.compile(r",? that has nothing on it"), ""),
    (re.compile(r",? that is (open|closed)"), r" (\1)"),
    (
        re.compile(r"To the (\w+) you see (?:the )?([^.]+)\.\s*"),
        lambda m: f"{m[1].lower()}: {m[2]}; ",
    ),
)


def compact(text: str) -> str:
    """A room description without its filler words (the items, the exits)."""
    for pattern, repl in _FILLER:
        text = pattern.sub(repl, text)
    text = re.sub(r"\.\s+(?=\w)", ", ", " ".join(text.split()))
    return text.strip().rstrip(";").strip()


def _start() -> Any:
    package = import_simulator("textworld_express", "TextWorld-Express")
    # The environment's own step limit would end episodes early; max_turns governs.
    return package.TextWorldExpressEnv(envStepLimit=10**9)


POOL = make_pool(_start, "TextWorld-Express")
_SEEDS: dict[str, list[int]] = {}


def _fold_seeds(sim: Simulator, split: str) -> list[int]:
    if split not in _SEEDS:
        handle = sim.handle
        getter = {
            "train": handle.getValidSeedsTrain,
            "dev": handle.getValidSeedsDev,
            "test": handle.getValidSeedsTest,
        }[split]
        _SEEDS[split] = sorted(int(s) for s in getter())
    return _SEEDS[split]


class TextWorldExpressEnv(SimulatorEnv):
    """One TextWorld-Express game and fold as a text environment.

    Args:
        variant: ``textworld_express:GAME:SPLIT[:small]``.
        max_turns: Turns per episode, invalid ones included (default 30).
    """

    pool = POOL
    max_score = 1.0
    default_max_turns = DEFAULT_MAX_TURNS

    def __init__(self, variant: TaskVariant, max_turns: int | None = None) -> None:
        super().__init__(variant, max_turns)
        self.params = SMALL_PARAMS[variant.task] if variant.option == "small" else ""
        self.valid: list[str] = []
        self._gold: list[str] = []

    def _load(self, sim: Simulator, seed: int) -> tuple[str, str]:
        self.variation = self.variant.pick(_fold_seeds(sim, self.variant.split), seed)
        observation, infos = sim.handle.reset(
            seed=self.variation,
            gameFold=self.variant.split,
            gameName=self.variant.task,
            gameParams=self.params,
            generateGoldPath=True,
        )
        sim.loaded = (self.variant.task, self.params, self.variation)
        self._gold = [a for a in sim.handle.getGoldActionSequence() if a]
        self.valid = sorted(infos.get("validActions", []))
        return observation, str(infos.get("taskDescription", "")).strip()

    def _check(self, action: str) -> str:
        if action in self.valid:
            return ""
        close = difflib.get_close_matches(action, self.valid, n=3, cutoff=0.5)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        return f"{action!r} is not one of the valid actions listed{hint}"

    def _act(self, sim: Simulator, action: str) -> Reply:
        observation, _, _, infos = sim.handle.step(action)
        self.valid = sorted(infos.get("validActions", []))
        return Reply(
            text=observation,
            understood=not observation.strip().lower().startswith(_UNKNOWN),
            score=float(infos.get("score", 0.0)),
            success=bool(infos.get("tasksuccess")),
            failure=bool(infos.get("taskfailure")),
        )

    def _view(self, message: str) -> str:
        text = message.strip()
        if self.score:
            text += f"\nScore so far: {self.score:g} of 1."
        return text + "\nValid actions: " + ", ".join(self.valid) + "."

    def _brief_view(self, message: str) -> str:
        return short(compact(message), 400) + " Actions: " + ", ".join(self.valid) + "."

    def legal_actions(self) -> list[str]:
        return [] if self.done else list(self.valid)

    def gold_actions(self) -> list[str]:
        """The simulator's winning sequence from this episode's start."""
        return list(self._gold)

    @property
    def task_description(self) -> str:
        goal = self.goal or "Finish the task the game describes."
        return task_text(
            f"You are playing a text adventure game (TextWorld-Express, {self.variant.task}).\n"
            f"Task: {goal}\n"
            "Each turn, write exactly one of the valid actions listed in the observation, "
            "inside tags, for example <action>look around</action>. Anything else is "
            "invalid and wastes the turn. "
            f"You have {self.max_turns} turns."
        )

    @property
    def brief_description(self) -> str:
        goal = self.goal or "Finish the task."
        return task_text(
            f"{goal} Write one listed action, e.g. <action>look around</action>. "
            f"{self.max_turns} turns."
        )


def register_opponents() -> None:
    """Register every game's variants; called by :mod:`mage_rl.envs.builtins`."""
    register_variants(
        NAME, GAMES, "small", preset_prefix="twx", preset_tasks=PRESET_GAMES, preset_option="small"
    )


def make_twx_env(
    variant: str | Opponent, seat: int = 0, max_turns: int | None = None
) -> TextWorldExpressEnv:
    """Build the environment of a variant spec such as ``twx:coin:train:small``.

    Raises:
        ValueError: A spec of another task, an unknown game or split, or a seat other
            than 0.
    """
    return make_variant_env(
        TextWorldExpressEnv, variant, seat, max_turns,
        env=NAME, title="TextWorld-Express", task_word="GAME",
    )  # fmt: skip
