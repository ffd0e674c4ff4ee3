"""What plays a seat from a trained run or a model: a run's play settings
(:mod:`~mage_rl.players.play_settings`), the agent's decisions in a game tree and reading
its policy there (:mod:`~mage_rl.players.tree_decisions`, :mod:`~mage_rl.players.model_reader`),
and the language model in the other seat (:mod:`~mage_rl.players.seat_player`).
Below the runtime, which installs the model half of ``GAME:llm:`` opponents.
"""
