"""Brief views of Kuhn states for the compact prompt template."""

from __future__ import annotations

from mage_rl.envs import make_env


def _play(env, *actions):
    result = None
    for action in actions:
        result = env.step(f"<action>{action}</action>")
    return result


def test_showdown_summary_reveals_the_card_and_a_fold_does_not() -> None:
    env = make_env("kuhn", "kuhn:aggressive", seat=0)
    env.reset(5)  # agent Q, opponent J (see test_environment_kuhn)
    card = env.brief_observation.split(",")[0]
    assert env.brief_observation.endswith("bets: none")
    _play(env, "PASS")
    assert env.brief_observation.endswith("bets: you PASS, opp BET")
    assert env.brief_summary == ""  # not finished yet
    result = _play(env, "BET")
    assert result.done
    assert env.brief_summary.startswith(card + ", you PASS, opp BET, you BET, opp ")
    assert env.brief_summary.endswith(f"{result.info.payoff:+g}")

    env.reset(5)
    result = _play(env, "PASS", "PASS")  # fold to the bet: no card shown
    assert result.info.payoff == -1
    assert env.brief_summary == f"{card}, you PASS, opp BET, you PASS, -1"


def test_brief_description_names_the_seat() -> None:
    assert make_env("kuhn", "kuhn:conservative", seat=1).brief_description == "Kuhn poker as P2"
