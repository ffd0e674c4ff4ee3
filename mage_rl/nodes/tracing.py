"""Tracing: every call a meta-episode's graph makes to the run's chat model is a sample.

Nodes do not build training records. :meth:`MetaEpisodeGraph.run` gives each
meta-episode its own :class:`Tracer`, a LangChain callback handler passed in the graph's
run config; LangGraph hands the config to every node and, through the node, to every
chat model the node calls (subgraphs included). The tracer keeps the calls of the run's
chat model, which ``run`` tags with :data:`POLICY_TAG`, and ignores every other model
(a judge, a tool's own model). Because each meta-episode's run has its own handler, many
meta-episodes can share one process, one event loop and one engine without a trace ever
landing in another meta-episode's record.

What a traced call records (a :class:`~mage_rl.records.Turn`): the prompt messages, the
exact prompt and response token ids and sampling log-probs when the chat model reports
them (``PolicyChatModel``; other chat models are traced with their text), the name of
the node that made it, the episode and environment step, and its role (SPEC §4):

1. A call made between two episodes is a ``reflect`` turn of the episode it prepares.
2. Calls made during a step are ``call`` turns until the environment steps. Then the
   *acting* call of the step (the one a node marked acting, else the last one) becomes
   the ``play`` turn and takes the step's invalid flag and reward.

Nodes can mark a call through the message it returned: ``tracer.mark(message,
acting=True)``, ``trained=False`` (credited, not trained), or ``invalid=True`` with a
reason (the invalid-action penalty of a non-acting call, such as a reflection without a
``<remark>`` tag).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from langchain_core.callbacks import AsyncCallbackHandler
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.outputs import LLMResult
from langchain_core.runnables import Runnable

from mage_rl.policy.chat_model import generation_from_message, to_policy_messages
from mage_rl.records import REFLECTION_ANCHOR, Turn

POLICY_TAG = "mage_rl:policy"
"""Tag of the run's chat model: only calls of a model carrying it are traced."""


def tag_policy(llm: Any) -> Any:
    """A copy of ``llm`` tagged with :data:`POLICY_TAG` (the original is left as it is)."""
    if isinstance(llm, BaseChatModel):
        tags = list(llm.tags or [])
        if POLICY_TAG in tags:
            return llm
        return llm.model_copy(update={"tags": [*tags, POLICY_TAG]})
    if isinstance(llm, Runnable):
        return llm.with_config(tags=[POLICY_TAG])
    raise TypeError(
        f"the meta-episode's llm must be a LangChain chat model or runnable, got {type(llm).__name__}"
    )


class Tracer(AsyncCallbackHandler):
    """The calls of one meta-episode, in the order they were made.

    The meta-episode's own nodes move the tracer through the episodes
    (:meth:`start_episode`, :meth:`end_step`); a user's node only calls the model and,
    if it wants to, :meth:`mark` s a call.

    Args:
        opponent: Opponent id of the meta-episode (copied into every turn).
    """

    raise_error = True  # a broken trace must fail the rollout, not vanish into a log line
    run_inline = True

    def __init__(self, opponent: str = "") -> None:
        self.opponent = opponent
        self.episode = 0
        self.step = 0
        self.observation = ""
        self.between_episodes = False
        self._slots: list[Turn | None] = []
        self._open: dict[UUID, int] = {}
        self._by_message: dict[str, int] = {}
        self._step_start = 0
        self._marked_acting: set[int] = set()
        self._finished: set[int] = set()

    # -- callbacks ----------------------------------------------------------------------

    async def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if POLICY_TAG not in (tags or []):
            return
        params = kwargs.get("invocation_params") or {}
        limit = params.get("max_tokens") or params.get("max_completion_tokens") or 0
        reflect = self.between_episodes
        turn = Turn(
            kind="reflect" if reflect else "call",
            episode=self.episode,
            step=0 if reflect else self.step,
            anchor=REFLECTION_ANCHOR if reflect else self.observation,
            opponent=self.opponent,
            max_response_length=int(limit),
            prompt_text=to_policy_messages(messages[0]) if messages else [],
            node=str((metadata or {}).get("langgraph_node", "")),
        )
        self._open[run_id] = len(self._slots)
        self._slots.append(turn)

    async def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        index = self._open.pop(run_id, None)
        if index is None:
            return
        turn = self._slots[index]
        assert turn is not None
        message = response.generations[0][0].message  # type: ignore[attr-defined]
        generation = generation_from_message(message)
        length = len(generation.response_ids)
        if not length:
            usage = getattr(message, "usage_metadata", None) or {}
            length = int(usage.get("output_tokens", 0)) or len(generation.text.split())
        turn.prompt_ids = generation.prompt_ids
        turn.response_ids = generation.response_ids
        turn.logprobs = generation.logprobs
        turn.text = generation.text
        turn.response_length = length
        turn.finish_reason = generation.finish_reason
        turn.allowed = generation.allowed
        self._finished.add(index)
        if message.id:
            self._by_message[message.id] = index

    async def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        index = self._open.pop(run_id, None)
        if index is not None:
            self._slots[index] = None  # a failed call is no sample

    # -- what nodes call ----------------------------------------------------------------

    def mark(
        self,
        message: BaseMessage,
        *,
        acting: bool | None = None,
        trained: bool | None = None,
        invalid: bool | None = None,
        invalid_reason: str | None = None,
    ) -> Turn:
        """Annotate the traced call that returned ``message``.

        Args:
            message: The message a call of the run's chat model returned.
            acting: Mark this call as the acting call of its step (SPEC §4); by default
                the last call before the environment steps is.
            trained: ``False`` keeps the call out of the learner (it is still credited).
            invalid: Give a non-acting call the invalid-output penalty (an acting call's
                flag comes from the environment).
            invalid_reason: Why it is invalid.

        Raises:
            KeyError: ``message`` did not come from a traced call of this meta-episode.
        """
        index = self._by_message.get(message.id or "")
        turn = self._slots[index] if index is not None else None
        if turn is None:
            raise KeyError(
                "this message was not returned by a traced call of this meta-episode: mark "
                "messages of runtime.context.llm, the run's chat model"
            )
        if acting is not None:
            assert index is not None
            (self._marked_acting.add if acting else self._marked_acting.discard)(index)
        if trained is not None:
            turn.trained = bool(trained)
        if invalid is not None:
            turn.invalid = bool(invalid)
        if invalid_reason is not None:
            turn.invalid_reason = invalid_reason
        return turn

    def start_episode(self, episode: int, observation: str) -> None:
        """An episode starts (``reset_episode``): later calls belong to its step 0."""
        self.episode = episode
        self.step = 0
        self.observation = observation
        self.between_episodes = False
        self._step_start = len(self._slots)

    def pending_acting(self) -> Turn | None:
        """The call that is the acting call of the current step if the environment steps
        now (the last one marked acting, else the last call), or ``None``."""
        calls = [
            i
            for i in range(self._step_start, len(self._slots))
            if (t := self._slots[i]) is not None and t.kind == "call" and i in self._finished
        ]
        marked = [i for i in calls if i in self._marked_acting]
        chosen = (marked or calls or [None])[-1]
        return None if chosen is None else self._slots[chosen]

    def end_step(
        self,
        *,
        observation: str,
        invalid: bool,
        invalid_reason: str,
        reward: float,
        episode_done: bool,
    ) -> Turn | None:
        """The environment stepped (``env_step``): pick the step's acting call.

        Returns:
            The acting call's turn, or ``None`` when the step made no traced call.
        """
        acting = self.pending_acting()
        if acting is not None:
            acting.kind = "play"
            acting.invalid = invalid
            acting.invalid_reason = invalid_reason
            acting.reward = reward
        self._step_start = len(self._slots)
        self.step += 1
        self.observation = observation
        if episode_done:
            self.episode += 1
            self.step = 0
            self.between_episodes = True
        return acting

    @property
    def turns(self) -> list[Turn]:
        """Every finished call, in the order the calls were made."""
        return [t for i, t in enumerate(self._slots) if t is not None and i in self._finished]

    def episode_turns(self, episode: int) -> list[Turn]:
        """The acting calls of one episode."""
        return [t for t in self._slots if t is not None and t.acting and t.episode == episode]
