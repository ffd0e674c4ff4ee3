"""Test-only stand-in for the two flash-attn modules ``openrlhf.models`` imports.

flash-attn is a CUDA build. OpenRLHF 0.11 imports ``flash_attn.bert_padding`` and
``flash_attn.utils.distributed`` at module import time, although only sample packing
(ring attention) calls them; these plain-torch versions let OpenRLHF's ``Actor``,
losses and KL run on a CPU in tests. ``tests/cluster/conftest.py`` puts this folder on
``sys.path`` only when the real flash-attn is missing. ``flash_attn.ops`` is absent on
purpose: OpenRLHF then takes its own torch path for log-probs.
"""
