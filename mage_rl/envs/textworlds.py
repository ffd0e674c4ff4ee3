"""What ScienceWorld and TextWorld-Express share: simulators, variants and episodes.

Both are text games whose simulator runs in a Java process (each package ships its JAR
and talks to it through py4j). This module holds what does not depend on which one:

1. **The optional extra.** Neither package is a core dependency; both come with
   ``pip install 'mage-rl[textworlds]'``. The packages are imported when the first
   environment starts a simulator, never at registration, so ``mage --help``, configs and
   the rest of the library work without them. A missing package or a missing ``java``
   gives an error that names the fix.
2. **A pool of simulators per process.** A JVM costs about 0.7 s to start and, for
   ScienceWorld, about 330 MB, while training and evaluation build one environment per
   meta-episode. An environment therefore borrows a simulator at ``reset`` and hands it
   back when its episode ends; at most as many simulators run as episodes are in flight
   at once (``rollout.concurrency``, ``mage eval --concurrency``). A simulator remembers
   which variation it loaded, so a ``replay`` episode that gets the same simulator back
   skips the reload.
3. **The episode.** :class:`SimulatorEnv` parses the ``<action>`` tag, counts turns,
   keeps the transcript and turns the simulator's end states into SPEC §3 outcomes:
   success is a win (+10), an explicit task failure (ScienceWorld's score below zero,
   TextWorld-Express's ``taskfailure``) a loss (-10), running out of turns unfinished
   (0). The simulators' own 0-100 or 0-1 scores are *not* added to the reward (no score
   shaping): they appear in the observation, the end-of-episode feedback and
   ``StepInfo.extra["score"]``.

The "opponent" of these single-agent tasks names the task variant, as Sokoban's room
variants do: a task (or game) and a split of its variations (``train``, ``dev``,
``test``); the episode seed picks the variation inside the split.
"""

from __future__ import annotations

import atexit
import logging
import re
import shutil
import threading
import weakref
from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mage_rl.envs.base import (
    LOSS_REWARD,
    NO_ACTION_TAG,
    WIN_REWARD,
    StepResult,
    TaskText,
    TextEnv,
    Wording,
    derive_seed,
)
from mage_rl.envs.opponents import Opponent

log = logging.getLogger(__name__)

EXTRA_HINT = "pip install 'mage-rl[textworlds]'"
JAVA_HINT = (
    "install a Java runtime, version 11 or newer (Debian/Ubuntu: apt-get install "
    "default-jre-headless), and make sure `java` is on the PATH"
)
SPLITS = ("train", "dev", "test")
"""Variation splits both simulators define; ``train`` for training, the others unseen."""

INVALID_PENALTY = 0.5
LENGTH_PENALTY = 1.0
GAMMA_TRAJ = 0.9
"""SPEC §3/§4 constants of these single-agent exploration tasks, as for Sokoban."""

WORDING = Wording(
    same_task=(
        "You play several episodes in a row of the same task. Each starts again from the "
        "state shown at its start, often the very same one. Use what earlier episodes "
        "taught you (where things are, which actions worked) to finish the task sooner."
    ),
    setting="of this task",
    reflect_focus="which actions found what the task needs and which wasted turns",
)


class MissingDependencyError(RuntimeError):
    """The optional extra or the Java runtime that a text world needs is missing."""


def import_simulator(module: str, what: str) -> Any:
    """Import a simulator package, or say how to install it.

    Raises:
        MissingDependencyError: The package is not installed, or ``java`` is not on the
            PATH; the message names the fix.
    """
    import importlib

    try:
        package = importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"{what} needs the Python package {module!r}, which is not installed "
            f"({exc}); install the optional extra: {EXTRA_HINT}"
        ) from None
    # py4j and the simulators log every gateway start and task load at INFO; keep them
    # to warnings unless the user has set their level.
    for name in ("py4j", module):
        chatty = logging.getLogger(name)
        if chatty.level == logging.NOTSET:
            chatty.setLevel(logging.WARNING)
    if shutil.which("java") is None:
        raise MissingDependencyError(
            f"{what} runs its simulator in Java, and no `java` was found: {JAVA_HINT}"
        )
    return package


# -- the pool of simulator processes ------------------------------------------------------


class Simulator:
    """One running simulator and what it has loaded (so a reload can be skipped).

    Attributes:
        handle: The package's environment object (``ScienceWorldEnv``,
            ``TextWorldExpressEnv``).
        loaded: A key of what it holds now (task, variation, ...), or ``None``.
    """

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.loaded: Any = None

    def close(self) -> None:
        try:
            self.handle.close()
        except Exception:  # closing at exit; the JVM dies with this process anyway
            log.debug("closing a simulator failed", exc_info=True)
        # The package's __del__ closes again, into a closed gateway, and logs a traceback.
        self.handle.close = lambda: None


class SimulatorPool:
    """Simulators of one kind shared by every environment of the process.

    Args:
        start: Starts a new simulator (imports the package, launches the JVM).
        what: The simulator's name, for messages.
    """

    def __init__(self, start: Callable[[], Any], what: str) -> None:
        self._start = start
        self.what = what
        self._free: list[Simulator] = []
        self._all: list[Simulator] = []
        self._lock = threading.Lock()

    def acquire(self, prefer: Simulator | None = None) -> Simulator:
        """A free simulator (``prefer`` if it is free), or a newly started one.

        An environment asks for the simulator it had last: it may still hold the
        variation, which saves a reload under the ``replay`` protocol.
        """
        with self._lock:
            if prefer is not None and prefer in self._free:
                self._free.remove(prefer)
                return prefer
            if self._free:
                return self._free.pop()
        try:
            sim = Simulator(self._start())
        except MissingDependencyError:
            raise
        except Exception as exc:
            raise RuntimeError(
                f"could not start the {self.what} simulator ({type(exc).__name__}: {exc}); "
                f"it needs a working Java runtime: {JAVA_HINT}"
            ) from exc
        with self._lock:
            self._all.append(sim)
        log.debug("started %s simulator %d", self.what, len(self._all))
        return sim

    def release(self, sim: Simulator) -> None:
        """Hand a simulator back for the next episode."""
        with self._lock:
            if sim in self._all and sim not in self._free:
                self._free.append(sim)

    @property
    def size(self) -> int:
        """Simulators started so far (busy and free)."""
        return len(self._all)

    def close(self) -> None:
        """Stop every simulator of the pool."""
        with self._lock:
            sims, self._all, self._free = self._all, [], []
        for sim in sims:
            sim.close()


_POOLS: list[SimulatorPool] = []


def make_pool(start: Callable[[], Any], what: str) -> SimulatorPool:
    """A pool whose simulators stop when the process exits."""
    pool = SimulatorPool(start, what)
    _POOLS.append(pool)
    return pool


@atexit.register
def _close_pools() -> None:
    for pool in _POOLS:
        pool.close()


# -- variants and actions -----------------------------------------------------------------


class TaskVariant(Opponent):
    """The task variant an episode plays, standing where the games have an opponent.

    It never plays a move; its ``spec`` groups rollouts, keys anchors and splits the
    metrics, as opponent ids do for the games.

    Attributes:
        env: The environment's registered name.
        task: The task or game name.
        split: ``train``, ``dev`` or ``test``: where the variations come from.
        option: A variant option (ScienceWorld's ``easy``, TextWorld-Express's ``small``),
            or ``""``.
    """

    def __init__(self, env: str, task: str, split: str, option: str = "") -> None:
        self.env, self.task, self.split, self.option = env, task, split, option
        self.spec = ":".join(p for p in (env, task, split, option) if p)

    def act(self, state: object, player: int) -> int:
        raise RuntimeError(f"{self.spec} names a task variant; it plays no moves")

    def pick(self, choices: Sequence[int], seed: int) -> int:
        """The variation (or game seed) of an episode: drawn from ``choices`` by the seed."""
        return choices[
            derive_seed(self.env, self.task, self.split, "variation", seed) % len(choices)
        ]


def parse_variant(
    env: str, task: str, args: Sequence[str], options: Sequence[str], usage: str
) -> TaskVariant:
    """Read ``SPLIT[:OPTION]`` after ``ENV:TASK``.

    Raises:
        ValueError: A missing or unknown split or option; the message shows the usage.
    """
    if (
        not 1 <= len(args) <= 2
        or args[0] not in SPLITS
        or (len(args) == 2 and args[1] not in options)
    ):
        got = ":".join([env, task, *args])
        raise ValueError(f"write {usage}, got {got!r}")
    return TaskVariant(env, task, args[0], args[1] if len(args) == 2 else "")


_SPACES = re.compile(r"\s+")


def normalize_action(text: str) -> str:
    """Lower case, single spaces, no surrounding quotes or final full stop."""
    text = _SPACES.sub(" ", text).strip().strip("'\"`").strip()
    return text.rstrip(".!").strip().lower()


def short(text: str, limit: int = 100) -> str:
    """The first line of a simulator message, cut to ``limit`` characters."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3].rstrip() + "..."


# -- the episode ----------------------------------------------------------------------------


@dataclass
class Reply:
    """What the simulator said to one action.

    Attributes:
        text: The simulator's message.
        understood: ``False`` when the simulator did not recognise the action (the state
            is unchanged and the turn is invalid).
        score: The task score now (the simulator's scale).
        success: The task is done.
        failure: The task failed for good.
        taken: The action actually performed when it differs from the one written (a
            resolved ambiguity), else ``""``.
    """

    text: str
    understood: bool
    score: float
    success: bool = False
    failure: bool = False
    taken: str = ""


class SimulatorEnv(TextEnv):
    """One task variant of a Java text world as a :class:`TextEnv` (shared by both).

    Subclasses say how to load a variation, step and describe the simulator; this class
    runs the episode.

    Args:
        variant: The task variant.
        max_turns: Turns per episode, invalid ones included.
    """

    pool: SimulatorPool
    max_score: float = 100.0
    default_max_turns: int = 30

    def __init__(self, variant: TaskVariant, max_turns: int | None = None) -> None:
        self.variant = variant
        self.name = variant.env
        self.seat = 0
        self.max_turns = max_turns or self.default_max_turns
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        self.invalid_penalty = INVALID_PENALTY
        self.length_penalty = LENGTH_PENALTY
        self.variation: int | None = None
        self.goal = ""
        self.turns = 0
        self.score = 0.0
        self.done = True
        self.observation = ""
        self._last_message = ""
        self._initial_observation = ""
        self._transcript: list[str] = []
        self._sim: Simulator | None = None
        self._last_sim: Simulator | None = None
        self._give_back: weakref.finalize | None = None

    # -- what a subclass provides ---------------------------------------------------------

    @abstractmethod
    def _load(self, sim: Simulator, seed: int) -> tuple[str, str]:
        """Load the episode's variation into ``sim``; returns (first message, goal)."""

    @abstractmethod
    def _act(self, sim: Simulator, action: str) -> Reply:
        """Perform one (already checked) action."""

    @abstractmethod
    def _check(self, action: str) -> str:
        """Why ``action`` may not be sent to the simulator, or ``""``."""

    @abstractmethod
    def _view(self, message: str) -> str:
        """The full observation after the simulator said ``message``."""

    @abstractmethod
    def _brief_view(self, message: str) -> str:
        """The observation in few words, for the ``compact`` prompt."""

    @abstractmethod
    def gold_actions(self) -> list[str]:
        """A winning action sequence from the current episode's start (tests, benchmarks)."""

    # -- the episode --------------------------------------------------------------------

    def _borrow(self) -> Simulator:
        if self._sim is None:
            self._sim = self.pool.acquire(prefer=self._last_sim)
            self._last_sim = self._sim
            # Hand the simulator back even if the episode is abandoned mid-way.
            self._give_back = weakref.finalize(self, self.pool.release, self._sim)
        return self._sim

    def _hand_back(self) -> None:
        if self._give_back is not None:
            self._give_back()
        self._sim, self._give_back = None, None

    def reset(self, seed: int) -> str:
        sim = self._borrow()
        message, self.goal = self._load(sim, seed)
        self.turns = 0
        self.score = 0.0
        self.done = False
        self._transcript = []
        self._last_message = message
        self.observation = self._view(message)
        self._initial_observation = self.observation
        return self.observation

    def step(self, response: str) -> StepResult:
        info, content = self._start_step(response, started=self._sim is not None)
        action = normalize_action(content) if content is not None else ""
        if content is None:
            reason = NO_ACTION_TAG
        elif not action:
            reason = "the action is empty; write one command such as <action>look around</action>"
        else:
            reason = self._check(action)
        reply: Reply | None = None
        if not reason:
            reply = self._act(self._sim, action)
            if not reply.understood:
                reason = f"the game did not understand {action!r}: {short(reply.text, 80)}"
        if reason:
            info.invalid, info.invalid_reason = True, reason
        else:
            assert reply is not None
            self.score = reply.score
            self._last_message = reply.text
            info.action = reply.taken or action
            shown = action if not reply.taken else f"{action} (taken as: {reply.taken})"
            line = f"{shown} -> {short(reply.text)}"
            self._transcript.append(line)
            info.events.append(line)
            self.observation = self._view(reply.text)
        reward = 0.0
        if reply is not None and reply.success:
            reward, info.outcome = WIN_REWARD, "won"
            info.feedback = f"Task done in {self.turns} turns (score {self._score_text()})."
        elif reply is not None and reply.failure:
            reward, info.outcome = LOSS_REWARD, "lost"
            info.feedback = (
                f"Task failed after {self.turns} turns: {short(reply.text, 120)} "
                f"(score {self._score_text()})."
            )
        elif self.turns >= self.max_turns:
            info.outcome = "unfinished"
            info.feedback = f"Out of turns ({self.max_turns}); score {self._score_text()}."
        if info.outcome is not None:
            self.done = True
            info.extra = {
                "task": self.variant.task,
                "variation": self.variation,
                "score": self.score,
                "turns": self.turns,
            }
            self._hand_back()
        return StepResult(self.observation, reward, self.done, info)

    def _score_text(self) -> str:
        return f"{self.score:g} of {self.max_score:g}"

    @property
    def brief_observation(self) -> str:
        return self._brief_view(self._last_message) if self.observation else ""

    @property
    def brief_summary(self) -> str:
        return (
            f"{self.variant.task} #{self.variation}: {len(self._transcript)} actions, "
            f"score {self._score_text()}"
        )

    def close(self) -> None:
        """Hand the simulator back now (an unfinished episode is abandoned)."""
        self.done = True
        self._hand_back()


def task_text(text: str) -> TaskText:
    """A task description worded for a single-agent task."""
    return TaskText(text, WORDING)
