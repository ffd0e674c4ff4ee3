"""The agents of ``mage eval``: ``STYLE[=MODEL][@LABEL]`` specs.

An agent is a graph style (``react``, ``reflexion``, ``mage`` or any registered agent)
driving a model: a local one, an OpenAI-compatible endpoint, or a training run (its
folder or a checkpoint in it), which brings the graph and the play settings it was
trained with (:mod:`mage_rl.players.play_settings`). Its label names it in tables, plots and the run
folder's ``records/``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mage_rl.eval.served import served_agent
from mage_rl.graphs import AGENT_GRAPHS
from mage_rl.players.play_settings import run_play
from mage_rl.registry import PLUGIN_HINT
from mage_rl.train_folder import find_run

log = logging.getLogger(__name__)

STYLES = ("react", "reflexion", "mage")
_LABEL = re.compile(r"^[A-Za-z0-9_.+-]+$")


@dataclass(frozen=True)
class AgentSpec:
    """One agent under evaluation.

    Attributes:
        label: Its name in tables, plots and ``records/``.
        style: The graph that drives the model: ``react``, ``reflexion`` or ``mage``.
        model: ``tiny``, ``smollm2``, a local HF directory or ``.gguf`` file (e.g. a
            trained checkpoint), or an OpenAI-compatible endpoint URL.
        endpoint_model: The model name an endpoint serves (endpoints only).
        run: The training run the model comes from, if any.
        served: The agent an endpoint serves (``mage serve RUN --agent``), played as
            it plays there (a :class:`~mage_rl.eval.served.ServedCard`); ``None`` for
            a model.
        play: How it plays (:data:`~mage_rl.players.play_settings.PLAY_KEYS`), filled in by
            :class:`~mage_rl.eval.conditions.EvalConfig`.
        overridden: The play settings in which it departs from its run, with the run's
            values.
    """

    label: str
    style: str
    model: str
    endpoint_model: str | None = None
    run: str | None = None
    served: Any = None
    play: dict[str, Any] = field(default_factory=dict)
    overridden: dict[str, Any] = field(default_factory=dict)

    @property
    def is_endpoint(self) -> bool:
        return self.model.startswith(("http://", "https://"))


def parse_agents(
    texts: Sequence[str],
    default_model: str,
    endpoint: str | None = None,
    endpoint_model: str | None = None,
) -> list[AgentSpec]:
    """Parse ``STYLE[=MODEL][@LABEL]`` agent specs.

    ``MODEL`` defaults to ``default_model``; ``endpoint`` means the ``endpoint`` URL. A
    ``MODEL`` that is a training run (its folder, ``checkpoints/iter_N`` or its ``model``
    folder) plays with the run's graph unless ``STYLE`` names another registered agent;
    with a run, a ``STYLE`` that is no agent's name is the label. An endpoint URL after
    a ``STYLE`` that is no agent's name is a served agent (``mage serve RUN --agent``;
    :mod:`mage_rl.eval.served`), the one named by ``endpoint_model`` or the only one the
    server lists, and that name is the label. The label defaults to the style, or
    ``STYLE:MODEL-NAME`` when two agents share a style.

    Raises:
        ValueError: An unknown style, ``endpoint`` without a URL, two equal labels, or a
            served agent's server that cannot be reached.
    """
    if not texts:
        raise ValueError("no agent to evaluate; pass e.g. --agent react --agent reflexion")
    parsed: list[tuple[str, str, str | None, str | None, Any]] = []
    for text in texts:
        label = None
        head, at, tail = text.rpartition("@")
        if at and head and _LABEL.match(tail):
            text, label = head, tail
        style, _, model = text.partition("=")
        style = style.strip()
        if style.lower() in STYLES:
            style = style.lower()
        model = model.strip() or default_model
        found = find_run(model)
        run = None
        if found is not None:
            run, model_dir = str(found[0]), str(found[1])
            trained = run_play(run)["agent"]  # loads the run's plugins
            if style not in AGENT_GRAPHS:
                if label is None and _LABEL.match(style):
                    label = style
                style = trained
            elif style != trained:
                log.warning(
                    "agent %s: %s was trained as %r; it plays the %r graph here, as asked",
                    label or style,
                    run,
                    trained,
                    style,
                )
            model = model_dir
        if model == "endpoint" and endpoint:
            model = endpoint
        if model.startswith(("http://", "https://")) and style not in AGENT_GRAPHS:
            card = served_agent(model, endpoint_model)
            if card is not None:  # the server runs the agent's own graph
                if label is None and _LABEL.match(style):
                    label = style
                parsed.append(("mage", model, label or card.name, None, card))
                continue
        if style not in AGENT_GRAPHS:
            raise ValueError(
                f"unknown agent style {style!r} in {text!r}; use STYLE[=MODEL][@LABEL] with "
                f"STYLE a registered agent ({', '.join(AGENT_GRAPHS.names())}). To use your "
                f"own, {PLUGIN_HINT}"
            )
        if model == "endpoint":
            if not endpoint:
                raise ValueError(f"agent {text!r} needs --endpoint URL (and --endpoint-model)")
            model = endpoint
        if model.startswith(("http://", "https://")) and not endpoint_model:
            raise ValueError(f"agent {text!r} uses an endpoint; name its model: --endpoint-model")
        parsed.append((style, model, label, run, None))

    def short(model: str, run: str | None) -> str:
        if run is not None:
            return Path(run).name
        if model.startswith(("http://", "https://")):
            return str(endpoint_model)
        return Path(model).name or model

    styles = [style for style, _, _, _, _ in parsed]
    agents = []
    for style, model, label, run, card in parsed:
        if label is None:
            label = style if styles.count(style) == 1 else f"{style}:{short(model, run)}"
        remote = model.startswith(("http://", "https://"))
        served_name = card.name if card is not None else endpoint_model
        agents.append(AgentSpec(label, style, model, served_name if remote else None, run, card))
    labels = [a.label for a in agents]
    for label in labels:
        if labels.count(label) > 1:
            raise ValueError(
                f"two agents are labelled {label!r}; name one with @LABEL, "
                f"e.g. --agent react=tiny@react-tiny"
            )
    for agent in agents:
        if agent.style == "mage" and agent.model in ("tiny", "smollm2"):
            log.warning(
                "agent %s drives the untrained %s with MAGE's graph; pass mage=RUN_DIR "
                "to evaluate a trained model",
                agent.label,
                agent.model,
            )
    return agents
