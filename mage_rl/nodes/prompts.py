"""Prompt templates for play and reflect turns (SPEC §2).

A play prompt shows the rules and seat, what earlier episodes left behind (reflections,
past episodes, or nothing, by context mode), the episode's initial state, the moves so
far and the latest observation, and asks for the answer inside ``<action>`` tags. A
reflect prompt shows the whole finished episode and its result and asks for a diagnosis
and a plan inside ``<remark>`` tags.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

from mage_rl.envs.base import wording_of

Message = dict[str, str]

STYLE_DIRECT = (
    "Think briefly if you need to, then give your answer inside the tags. Only the last tag counts."
)
STYLE_REACT = (
    "First write one line that starts with 'Thought:' and reasons about the state, then "
    "give your answer inside the tags."
)


@dataclass
class PastEpisode:
    """What the history context shows of a finished episode."""

    index: int
    initial_observation: str
    moves: list[str]
    feedback: str
    outcome: str
    brief: str = ""


def _episode_block(ep: PastEpisode) -> str:
    moves = "; ".join(ep.moves) if ep.moves else "no moves"
    text = f"Episode {ep.index + 1}: {ep.initial_observation.splitlines()[0]} Moves: {moves}."
    if ep.feedback:
        text += f" {ep.feedback}"
    return text + f" Result: {ep.outcome}."


def play_messages(
    *,
    task_description: str,
    episode: int,
    num_episodes: int,
    context: str,
    memory: Sequence[str],
    history: Sequence[PastEpisode],
    initial_observation: str,
    moves: Sequence[str],
    observation: str,
    invalid_reason: str = "",
    react: bool = False,
) -> list[Message]:
    """The chat for one play turn.

    Args:
        task_description: Rules, seat and answer format from the environment.
        episode: Index k of the current episode.
        num_episodes: K.
        context: ``reflection``, ``history``, ``history+reflection`` or ``none``.
        memory: Reflections written so far.
        history: Finished episodes of this meta-episode.
        initial_observation: The state at the start of this episode.
        moves: Moves of this episode so far (the agent's and the opponent's).
        observation: The latest observation (what the agent acts on).
        invalid_reason: Why the previous answer was invalid, if it was.
        react: Ask for a Thought line before the action.
    """
    wording = wording_of(task_description)
    system = str(task_description)
    if num_episodes > 1 and context != "none":
        system += "\n" + wording.same_task
    parts: list[str] = []
    if "history" in context and history:
        parts.append(f"Earlier episodes {wording.setting}:")
        parts.extend(_episode_block(ep) for ep in history)
    if "reflection" in context and memory:
        parts.append("Your reflections on earlier episodes:")
        parts.extend(f"- {m}" for m in memory)
    if num_episodes > 1:
        parts.append(f"This is episode {episode + 1} of {num_episodes}.")
    if moves:
        parts.append("Start of this episode:\n" + initial_observation)
        parts.append("Moves so far: " + "; ".join(moves) + ".")
    parts.append("Current state:\n" + observation)
    if invalid_reason:
        parts.append(f"Your previous answer was invalid: {invalid_reason}. Try again.")
    parts.append((STYLE_REACT if react else STYLE_DIRECT) + " Answer with <action>...</action>.")
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n".join(parts)}]


def reflect_messages(
    *,
    task_description: str,
    finished: PastEpisode,
    num_episodes: int,
    memory: Sequence[str],
) -> list[Message]:
    """The chat for the reflect turn after episode ``finished.index``."""
    wording = wording_of(task_description)
    parts = [
        f"Episode {finished.index + 1} of {num_episodes} {wording.setting} is over.",
        "Start of the episode:\n" + finished.initial_observation,
        "Moves: " + ("; ".join(finished.moves) if finished.moves else "none") + ".",
    ]
    if finished.feedback:
        parts.append(finished.feedback)
    parts.append(f"Result: you {finished.outcome}.")
    if memory:
        parts.append("Your earlier reflections:")
        parts.extend(f"- {m}" for m in memory)
    parts.append(
        f"Diagnose what happened and {wording.reflect_focus}, then "
        "plan how you will play the next episode. Write the reflection inside "
        "<remark>...</remark>."
    )
    return [
        {"role": "system", "content": str(task_description) + "\n" + wording.same_task},
        {"role": "user", "content": "\n".join(parts)},
    ]


def _compact_episode(ep: PastEpisode) -> str:
    if ep.brief:
        return f"E{ep.index + 1}: {ep.brief}"
    moves = ", ".join(ep.moves) if ep.moves else "no moves"
    line = f"E{ep.index + 1}: {ep.initial_observation.splitlines()[0]} {moves}."
    if ep.feedback:
        line += f" {ep.feedback}"
    return line + f" {ep.outcome}"


def compact_play_messages(
    *,
    brief_description: str,
    episode: int,
    num_episodes: int,
    context: str,
    memory: Sequence[str],
    history: Sequence[PastEpisode],
    moves: Sequence[str],
    observation: str,
    invalid_reason: str = "",
) -> list[Message]:
    """A short play prompt for small models (the ``compact`` template).

    The same information as :func:`play_messages` with fewer words: the environment's
    brief description, one line per earlier episode (the environment's
    :attr:`~mage_rl.envs.base.TextEnv.brief_summary` when it has one, else first
    observation line, moves, feedback and outcome), reflections, and the current state
    (pass the environment's ``brief_observation``). It suits models trained from
    scratch or with constrained decoding, whose only job is to map state and history to
    an action; instruction-tuned models do better with the full template.
    """
    parts: list[str] = []
    if "history" in context:
        parts.extend(_compact_episode(ep) for ep in history)
    if "reflection" in context:
        parts.extend(f"Note: {m}" for m in memory)
    if moves:
        parts.append("Moves: " + ", ".join(moves) + ".")
    parts.append(f"Now E{episode + 1}/{num_episodes}: " + " ".join(observation.splitlines()))
    if invalid_reason:
        parts.append(f"Invalid: {invalid_reason}.")
    return [
        {"role": "system", "content": brief_description},
        {"role": "user", "content": "\n".join(parts)},
    ]


def to_langchain(messages: Sequence[Message]) -> list[BaseMessage]:
    """Role/content dicts -> LangChain messages."""
    kinds = {"system": SystemMessage, "user": HumanMessage, "assistant": AIMessage}
    return [kinds[m["role"]](content=m["content"]) for m in messages]
