"""The adaptation study: does training on the last hand teach opponent identification?

* :mod:`studies.adaptation.study`: train MAGE and five baselines and ablations on Kuhn
  Poker and evaluate each exactly (``python -m studies.adaptation``), with the exact
  evaluation in :mod:`~studies.adaptation.exact` and the results file in
  :mod:`~studies.adaptation.results`;
* :mod:`studies.adaptation.identification`: the supervised upper bound, can the model
  learn to read the opponent at all? (``python -m studies.adaptation.identification``);
* :mod:`studies.adaptation.cli`: the two commands.

Both start from :data:`CONFIG`. ``README.md`` beside this file says how to run them and
where the recorded results are.
"""

from __future__ import annotations

from pathlib import Path

CONFIG = Path(__file__).resolve().with_name("kuhn_adaptation_tiny.yaml")
"""The default config of both studies: Kuhn Poker, fresh deals, history, a tiny Qwen3
(``configs/kuhn_adaptation_tiny.yaml`` in the checkout links to it)."""
