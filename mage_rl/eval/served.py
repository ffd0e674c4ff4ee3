"""Playing a served agent (``mage serve RUN --agent``) from the client's side.

``mage eval --agent NAME=http://HOST:PORT/v1`` plays the agent such a server serves on the
library's own environments: the game runs here, each of its states goes to the server as
an environment message (:mod:`mage_rl.envs.remote`) through the ``openai`` client, and
the agent's graph runs there, on the trained weights. A session is one meta-episode
(every request after the first sends the handle and ``seq`` the server gave); its
first request carries the sampling seed ``mage eval`` gives every meta-episode (derived
from the task seed and the rollout), so a served agent meets the same random numbers as
the same run played locally.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from mage_rl.envs import make_env
from mage_rl.envs.base import derive_seed, episode_seed
from mage_rl.envs.remote import result_message, start_message
from mage_rl.graphs.rollouts import TaskInstance
from mage_rl.records import EpisodeResult, MetaEpisodeRecord, Turn, group_id


@dataclass(frozen=True)
class ServedCard:
    """A served agent as ``GET /v1/models`` lists it."""

    url: str
    name: str
    episodes: int


def served_agent(
    url: str, name: str | None = None, api_key: str | None = None
) -> ServedCard | None:
    """The agent served at ``url`` (the one named ``name``, or the only one), or ``None``
    when ``name`` is a plain model there.

    Raises:
        ValueError: The server cannot be reached, serves no agent when none is named,
            or serves several and none is named.
    """
    import httpx

    key = api_key or os.environ.get("MAGE_API_KEY") or os.environ.get("OPENAI_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        response = httpx.get(f"{url.rstrip('/')}/models", headers=headers, timeout=30)
        response.raise_for_status()
        cards = response.json()["data"]
    except (httpx.HTTPError, KeyError, ValueError) as error:
        raise ValueError(f"cannot list the models of {url}: {error}") from None
    agents = [c for c in cards if (c.get("mage") or {}).get("agent")]
    if name is not None:
        chosen = [c for c in agents if c["id"] == name]
        if not chosen:
            return None
    elif len(agents) == 1:
        chosen = agents
    else:
        names = ", ".join(repr(c["id"]) for c in cards)
        raise ValueError(
            f"{url} serves {names}; name the model with --endpoint-model (a served agent "
            "is played as an agent, a plain model by the agent style you give)"
        )
    card = chosen[0]
    return ServedCard(url, card["id"], int(card["mage"]["episodes"]))


async def play_served(
    client: Any,
    card: ServedCard,
    *,
    env_name: str,
    task: TaskInstance,
    rollout: int,
    protocol: str,
    max_turns: int | None,
    sampling: dict[str, Any],
    label: str,
) -> MetaEpisodeRecord:
    """One meta-episode of the served agent against ``task``'s opponent, the game played
    here; the record holds the episodes' results and every call the server reports.

    Args:
        client: An ``openai.AsyncOpenAI`` client for the server.
        card: The served agent.
        env_name, task, rollout, protocol, max_turns: What to play, as ``mage eval``
            plays it.
        sampling: ``temperature``, ``top_p`` and ``top_k`` of the agent's calls.
        label: The agent's name in the records.
    """
    env = make_env(env_name, task.opponent, seat=task.seat, max_turns=max_turns)
    label_of_session = f"eval-{label}-{task.seed}-{rollout}"
    session: dict[str, Any] = {}  # the handle and seq of the next message, once known
    seed = derive_seed("eval-sample", task.seed, rollout)
    turns: list[Turn] = []
    episodes: list[EpisodeResult] = []
    reflections: list[str] = []

    async def ask(message: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        response = await client.chat.completions.create(
            model=card.name,
            messages=[{"role": "user", "content": message.get("observation") or "(result)"}],
            user=label_of_session,
            seed=seed,
            temperature=sampling["temperature"],
            top_p=sampling["top_p"],
            extra_body={"env": message, "top_k": sampling["top_k"], **session},
        )
        extra = (response.model_extra or {})["mage"]
        session.update(session=extra["session"], seq=extra["seq"] + 1)
        turns.extend(
            Turn(
                kind=c["kind"],
                episode=c["episode"],
                step=c["step"],
                text=c["text"],
                node=c["node"],
                prompt_text=c["messages"],
                invalid=c["invalid"],
            )  # fmt: skip
            for c in extra["calls"]
        )
        reflections[:] = extra["reflections"]
        return response.choices[0].message.content or "", extra

    for k in range(card.episodes):
        observation = env.reset(episode_seed(task.seed, k, protocol))
        action, extra = await ask(start_message(env, observation, first=k == 0))
        invalid = 0
        while True:
            result = env.step(action)
            invalid += int(result.info.invalid)
            acting = [t for t in turns if t.kind == "play"]
            if acting and result.info.invalid:
                acting[-1].invalid = True
                acting[-1].invalid_reason = result.info.invalid_reason
            action, extra = await ask(result_message(env, result))
            if result.done:
                episodes.append(EpisodeResult(
                    index=k, outcome=result.info.outcome or "unfinished", reward=result.reward,
                    payoff=result.info.payoff, turns=env.turns, invalid_actions=invalid,
                ))  # fmt: skip
                break
        if extra["meta_done"]:
            break
    return MetaEpisodeRecord(
        uid=group_id(env_name, task.seed, task.opponent, task.seat),
        rollout=rollout, env=env_name, seed=task.seed, opponent=task.opponent,
        seat=task.seat, episodes=episodes, turns=turns, reflections=reflections, agent=label,
    )  # fmt: skip
