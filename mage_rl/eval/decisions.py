"""What an agent plays at each decision state, read from its evaluation records.

A mean return says how well a policy does, not what it does. In a game with few
information states (Kuhn Poker has 12: a card, a seat and the betting so far) the
answers an agent gave at each state show it directly: whether it reads its card, or
plays one action everywhere. The state is a play turn's anchor (the observation the
model acted on); the action is the last ``<action>`` tag of its answer, or ``invalid``
when the environment took none.

Used by the training report (``report.md``) and the evaluation report (``table.md`` of
``mage eval``); games with more states than :data:`MAX_STATES` get no table, since one
row per state would not be read.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from mage_rl.envs.parsing import extract_action

MAX_STATES = 16
INVALID = "invalid"


def _field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def _play_answers(records: Iterable[Any]) -> Iterator[tuple[Any, str]]:
    """Every play turn with an anchor, and the action it answered (``invalid`` when the
    environment took none)."""
    for record in records:
        for turn in _field(record, "turns") or []:
            if _field(turn, "kind") != "play" or not _field(turn, "anchor"):
                continue
            action = extract_action(_field(turn, "text") or "")
            if _field(turn, "invalid") or action is None:
                action = INVALID
            yield turn, action


def action_counts(records: Iterable[Any]) -> dict[str, Counter[str]]:
    """Per decision state, how often each action was answered, over every play turn.

    Args:
        records: Meta-episode records: :class:`~mage_rl.records.MetaEpisodeRecord` or
            their dicts, as stored in evaluation JSONL files.

    Returns:
        ``{state: Counter({action: count})}``, the state being the turn's anchor on one
        line; turns without an anchor (reflections, calls of other nodes) are left out.
    """
    counts: dict[str, Counter[str]] = {}
    for turn, action in _play_answers(records):
        lines = _field(turn, "anchor").splitlines()
        state = " ".join(line.strip() for line in lines if line.strip())
        counts.setdefault(state, Counter())[action] += 1
    return counts


def counts_by_episode(records: Iterable[Any]) -> dict[int, dict[str, int]]:
    """Per episode of the meta-episode (0-based), how often each action was answered,
    over every state: whether the agent plays its last episode as it plays its first.

    Counts the same play turns as :func:`action_counts`.
    """
    counts: dict[int, Counter[str]] = {}
    for turn, action in _play_answers(records):
        counts.setdefault(int(_field(turn, "episode") or 0), Counter())[action] += 1
    return {episode: dict(counts[episode]) for episode in sorted(counts)}


def episodes_table(
    agents: Sequence[tuple[str, Mapping[int, Mapping[str, int]]]],
) -> list[str] | None:
    """A markdown table: one row per agent, one column per episode (:func:`counts_by_episode`).

    Each cell gives the share of each action in that episode and, in brackets, the
    number of answers. Returns ``None`` when no agent has an answer.
    """
    episodes = sorted({e for _, counts in agents for e in counts})
    if not episodes:
        return None
    lines = [
        "| agent | " + " | ".join(f"episode {e + 1}" for e in episodes) + " |",
        "| --- |" + " --- |" * len(episodes),
    ]
    for name, counts in agents:
        lines.append(f"| {name} | " + " | ".join(_cell(counts.get(e)) for e in episodes) + " |")
    return lines


def _cell(counts: Mapping[str, int] | None) -> str:
    if not counts:
        return ""
    total = sum(counts.values())
    shares = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return " · ".join(f"{a} {n / total:.2f}" for a, n in shares) + f" ({total})"


def decisions_table(
    agents: Sequence[tuple[str, Mapping[str, Mapping[str, int]]]],
) -> list[str] | None:
    """A markdown table: one row per decision state, one column per agent.

    ``agents`` pairs each column's name with its counts (:func:`action_counts`, or
    :func:`small_game_counts` as read back from a results file).

    Each cell gives the share of each action at that state and, in brackets, the number
    of answers. Returns ``None`` when no agent has a state or when there are more than
    :data:`MAX_STATES` states.
    """
    states = sorted({s for _, counts in agents for s in counts})
    if not states or len(states) > MAX_STATES:
        return None
    lines = [
        "| state | " + " | ".join(name for name, _ in agents) + " |",
        "| --- |" + " --- |" * len(agents),
    ]
    for state in states:
        cells = [_cell(counts.get(state)) for _, counts in agents]
        escaped = state.replace("|", r"\|")  # a '|' in an observation would split the row
        lines.append(f"| {escaped} | " + " | ".join(cells) + " |")
    return lines


def small_game_counts(records: Iterable[Any]) -> dict[str, dict[str, int]] | None:
    """:func:`action_counts` as plain dicts for a results file, or ``None`` when the
    records hold more than :data:`MAX_STATES` states (no table would show them)."""
    counts = action_counts(records)
    if len(counts) > MAX_STATES:
        return None
    return {state: dict(c) for state, c in counts.items()}
