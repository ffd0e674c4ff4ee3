"""ScienceWorld (``scienceworld==1.2.3``) as a text environment.

ScienceWorld (Wang et al., 2022, arXiv 2203.07540) is an interactive text simulation of
an elementary-school science curriculum: 30 tasks (boil water, find a living thing, grow
a plant, test conductivity...) in a house with a kitchen, a greenhouse, a workshop and
an outside, each task with fixed ``train``, ``dev`` and ``test`` variations (objects,
rooms and goals differ between variations; the same variation is the same world).

The variant spec is ``scienceworld:TASK:SPLIT[:easy]`` (alias ``sciworld``): the episode
seed picks one of the split's variations (under ``replay`` every episode of a
meta-episode restarts the same one, under ``fresh`` each gets a new one of the same
task). ``easy`` turns on ScienceWorld's simplifications (teleporting between rooms,
doors and containers open, self-watering flower pots, no electrical actions).

The agent writes one command per turn, from the action templates the task description
lists (``open OBJ``, ``go to LOC``, ``focus on OBJ``...). ScienceWorld's list of valid
commands is incomplete (its own winning paths hold commands missing from it), so the
simulator itself decides: a command it does not understand is invalid (SPEC §3, penalty
0.5; the world does not change and the turn counts), as are ``reset task`` and a
command with characters other than printable ASCII. When a
command matches several objects the simulator asks which one; the alphabetically first
reading is taken (the simulator lists them in no fixed order), and the transcript says
which.

Rewards: a completed task (score 100) is a win, +10; a failed task (score below 0, e.g.
focusing on the wrong object) a loss, -10; running out of turns (30 by default)
unfinished, 0. The 0-100 score with its partial credit is shown in every observation and
the end-of-episode feedback, never added to the reward.
"""

from __future__ import annotations

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

NAME = "scienceworld"
ALIASES = ("sciworld",)
TASKS = (
    "boil",
    "change-the-state-of-matter-of",
    "chemistry-mix",
    "chemistry-mix-paint-secondary-color",
    "chemistry-mix-paint-tertiary-color",
    "find-animal",
    "find-living-thing",
    "find-non-living-thing",
    "find-plant",
    "freeze",
    "grow-fruit",
    "grow-plant",
    "identify-life-stages-1",
    "identify-life-stages-2",
    "inclined-plane-determine-angle",
    "inclined-plane-friction-named-surfaces",
    "inclined-plane-friction-unnamed-surfaces",
    "lifespan-longest-lived",
    "lifespan-longest-lived-then-shortest-lived",
    "lifespan-shortest-lived",
    "measure-melting-point-known-substance",
    "measure-melting-point-unknown-substance",
    "melt",
    "mendelian-genetics-known-plant",
    "mendelian-genetics-unknown-plant",
    "power-component",
    "power-component-renewable-vs-nonrenewable-energy",
    "test-conductivity",
    "test-conductivity-of-unknown-substances",
    "use-thermometer",
)
"""The 30 tasks of scienceworld 1.2.3 (``ScienceWorldEnv.get_task_names()``)."""

FIND_TASKS = ("find-living-thing", "find-non-living-thing", "find-plant", "find-animal")
"""The preset family: find a kind of thing, focus on it, carry it to a box (5-10 gold
steps)."""
DEFAULT_MAX_TURNS = 30
FORBIDDEN = ("reset task",)
"""Commands the simulator knows but an episode may not use (it would restart the task)."""
MAX_ACTION_CHARS = 200
_TEMPLATE_WORDING = {"go OBJ": "go to LOC", "teleport OBJ": "teleport to LOC"}
"""ScienceWorld lists these templates without the ``to`` its parser expects."""
_NOT_UNDERSTOOD = ("no known action matches", "unknown action")
_AMBIGUOUS = "ambiguous request"
_CHOICE = re.compile(r"^\s*(\d+):\s*(.+?)\s*$", re.MULTILINE)


def _start() -> Any:
    package = import_simulator("scienceworld", "ScienceWorld")
    # The environment's own step limit would end episodes early; max_turns governs.
    return package.ScienceWorldEnv("", envStepLimit=10**9)


POOL = make_pool(_start, "ScienceWorld")
_SPLITS: dict[tuple[str, str], list[int]] = {}


def _variations(sim: Simulator, task: str, split: str) -> list[int]:
    """The variation indices of a task's split (read from the simulator once)."""
    if (task, split) not in _SPLITS:
        handle = sim.handle
        if sim.loaded is None or sim.loaded[0] != task:
            handle.load(task, 0, "")
            sim.loaded = None  # loaded, but not reset: the next episode must reset
        getter = {
            "train": handle.get_variations_train,
            "dev": handle.get_variations_dev,
            "test": handle.get_variations_test,
        }[split]
        _SPLITS[(task, split)] = sorted(int(v) for v in getter())
    return _SPLITS[(task, split)]


_FILLER = (
    (
        re.compile(r"This (?:room|\w+ location) is called the ([^.]+)\. (?:In it,|Here) you see:"),
        r"In the \1:",
    ),
    (re.compile(r"\s*\n\t(?:the agent|a substance called air)\b"), ""),
    (re.compile(r"\s*You also see:"), "; also:"),
    (re.compile(r"A door to the ([^(\n]+) \(that is (open|closed)\)"), r"door to \1 (\2)"),
)


def _step(handle: Any, action: str) -> tuple[str, float, bool]:
    """One command through the simulator's own interface: (message, score, completed).

    ``ScienceWorldEnv.step`` also lists every valid command after each step, which
    costs about 0.3 s, ten times the step itself; nothing here uses that list.
    """
    server = handle.server
    message = str(server.step(action))
    score = float(round(100 * server.getScore()))
    return message, score, bool(server.getCompleted()) or score < 0


def _look(handle: Any) -> tuple[str, str]:
    """The room and the inventory, as free actions (they take no time in the world)."""
    return str(handle.look()), str(handle.inventory())


def _compact(text: str) -> str:
    """A room description on one line, without the lines every room has."""
    text = text.strip()
    for pattern, repl in _FILLER:
        text = pattern.sub(repl, text)
    text = re.sub(r"\s*\n\t+", ", ", text)
    return " ".join(text.replace(":,", ":").replace(".,", ",").split())


class ScienceWorldEnv(SimulatorEnv):
    """One ScienceWorld task and split as a text environment.

    Args:
        variant: ``scienceworld:TASK:SPLIT[:easy]``.
        max_turns: Turns per episode, invalid ones included (default 30).
    """

    pool = POOL
    max_score = 100.0
    default_max_turns = DEFAULT_MAX_TURNS

    def __init__(self, variant: TaskVariant, max_turns: int | None = None) -> None:
        super().__init__(variant, max_turns)
        self.simplification = "easy" if variant.option == "easy" else ""
        self.templates: list[str] = []
        self.look = ""
        self.inventory = ""

    def _load(self, sim: Simulator, seed: int) -> tuple[str, str]:
        task = self.variant.task
        self.variation = self.variant.pick(_variations(sim, task, self.variant.split), seed)
        key = (task, self.variation, self.simplification)
        if sim.loaded != key:
            sim.handle.load(task, self.variation, self.simplification)
            sim.loaded = key
        sim.handle.server.reset()
        observation, _, _ = _step(sim.handle, "look around")
        self.templates = [
            _TEMPLATE_WORDING.get(t, t)
            for t in sim.handle.get_possible_actions()
            if t not in FORBIDDEN
        ]
        self.look, self.inventory = _look(sim.handle)
        goal = str(sim.handle.get_task_description()).replace("Task Description:", "").strip()
        return observation, goal

    def _check(self, action: str) -> str:
        if action in FORBIDDEN:
            return f"{action!r} is not allowed; the episode restarts by itself"
        if len(action) > MAX_ACTION_CHARS:
            return f"the action is {len(action)} characters long; write one short command"
        if not (action.isascii() and action.isprintable()):
            # The simulator's commands are plain ASCII; other characters (a lone surrogate
            # would even break the connection to the JVM) cannot make a valid one.
            return "the action has characters other than plain letters, digits and punctuation"
        return ""

    def _act(self, sim: Simulator, action: str) -> Reply:
        handle = sim.handle
        observation, score, completed = _step(handle, action)
        taken = ""
        if observation.strip().lower().startswith(_AMBIGUOUS):
            # The simulator lists the readings in no fixed order; the alphabetically
            # first keeps the same answer doing the same thing in every run.
            readings = sorted((text, number) for number, text in _CHOICE.findall(observation))
            taken, number = readings[0] if readings else ("", "0")
            observation, score, completed = _step(handle, number)
        self.look, self.inventory = _look(handle)
        understood = not observation.strip().lower().startswith(_NOT_UNDERSTOOD)
        return Reply(
            text=observation,
            understood=understood,
            score=score,
            success=bool(completed) and score >= 100,
            failure=score < 0,
            taken=taken,
        )

    def _view(self, message: str) -> str:
        parts = [message.strip()]
        if message.strip() != self.look.strip():
            parts.append(self.look.strip())
        parts.append(self.inventory.strip())
        parts.append(f"Score so far: {self.score:g} of 100.")
        return "\n".join(p for p in parts if p)

    def _brief_view(self, message: str) -> str:
        text = "" if message.strip() == self.look.strip() else short(message, 120) + " "
        return text + short(_compact(self.look), 360) + f" Score {self.score:g}/100."

    def legal_actions(self) -> list[str]:
        """The action templates (``OBJ`` and ``LOC`` stand for names in the world).

        ScienceWorld's full list of valid commands holds hundreds of entries and misses
        some that work, so the templates are what a prompt can show.
        """
        return [] if self.done else list(self.templates)

    def gold_actions(self) -> list[str]:
        """ScienceWorld's winning sequence from the current episode's start.

        Generating it reloads the variation, so call it right after :meth:`reset`.

        Raises:
            RuntimeError: The episode has already begun.
        """
        if self._sim is None or self.turns:
            raise RuntimeError("gold_actions() needs a fresh episode: call it right after reset()")
        handle = self._sim.handle
        handle.load(self.variant.task, self.variation, self.simplification, generateGoldPath=True)
        handle.server.reset()
        _step(handle, "look around")
        self._sim.loaded = (self.variant.task, self.variation, self.simplification)
        return [a for a in handle.get_gold_action_sequence() if a]

    @property
    def task_description(self) -> str:
        goal = self.goal or "Do the science task the game describes."
        commands = (
            ", ".join(self.templates)
            if self.templates
            else "look around, go to LOC, open OBJ, focus on OBJ"
        )
        return task_text(
            "You are an agent in ScienceWorld, a text simulation of science experiments "
            "in a house with several rooms.\n"
            f"Task: {goal}\n"
            f"Commands (OBJ and LOC stand for things and places you see): {commands}.\n"
            "Each turn, write one command inside tags, for example "
            "<action>go to kitchen</action>. Focus only on the object the task asks for: "
            "focusing on a wrong one fails the task. A command the game does not "
            f"understand is invalid and wastes the turn. You have {self.max_turns} turns."
        )

    @property
    def brief_description(self) -> str:
        goal = self.goal or "Do the science task."
        return task_text(
            f"ScienceWorld. {goal} One command per turn, e.g. <action>go to kitchen</action>"
            f" or <action>focus on OBJ</action>. {self.max_turns} turns."
        )


def register_opponents() -> None:
    """Register every task's variants; called by :mod:`mage_rl.envs.builtins`."""
    register_variants(NAME, TASKS, "easy", preset_prefix=NAME, preset_tasks=FIND_TASKS)


def make_scienceworld_env(
    variant: str | Opponent, seat: int = 0, max_turns: int | None = None
) -> ScienceWorldEnv:
    """Build the environment of a variant spec such as ``scienceworld:find-plant:train``.

    Raises:
        ValueError: A spec of another task, an unknown task or split, or a seat other
            than 0.
    """
    return make_variant_env(
        ScienceWorldEnv, variant, seat, max_turns, env=NAME, title="ScienceWorld", task_word="TASK"
    )
