"""Scale-out backends for ``mage train``.

- ``backend: ray`` (:mod:`mage_rl.cluster.ray_backend`): rollout workers as Ray actors,
  each with its own local engine, the learner on the driver. Runs on CPUs.
- ``backend: openrlhf`` (:mod:`mage_rl.cluster.openrlhf_backend`): OpenRLHF's Ray PPO
  machinery (DeepSpeed actor and reference groups, vLLM engines, weight sync) with MAGE's
  rollout and MAGE advantages. Needs GPUs and the ``cluster`` extra.

Nothing here is imported by ``mage_rl`` itself, and no module of this package imports
ray, vllm, deepspeed or openrlhf at import time: each backend imports them when it starts,
through :func:`mage_rl.cluster.deps.require`, which says what to install when one is
missing.
"""
