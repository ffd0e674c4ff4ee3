"""The sections of a training config, one module each, below everything that reads them.

:mod:`mage_rl.config` assembles them into ``TrainConfig``; the learner, the advantage
estimators, the league, the evaluation and the cluster backend read their own section
from here, so a config never imports the code that runs it.
"""
