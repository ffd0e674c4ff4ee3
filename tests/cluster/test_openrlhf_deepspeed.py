"""DeepSpeed ZeRO on a CPU (gloo) trains OpenRLHF's Actor on MAGE experiences.

OpenRLHF's ``DeepspeedStrategy`` itself calls CUDA, so this drives DeepSpeed directly with
the pieces OpenRLHF's ``training_step`` uses: its ``Actor`` for log-probs, its
``PolicyLoss`` on MAGE advantages and its k3 KL as a loss, one ZeRO step per stage.
"""

from __future__ import annotations

import importlib
import socket

import pytest
import torch

from mage_rl.cluster.experience import experiences_from_records, keep_mage_advantages
from mage_rl.policy.models import load_model

pytest.importorskip("openrlhf", reason="the dev set-up installs openrlhf (scripts/setup.sh dev)")
deepspeed = pytest.importorskip("deepspeed", reason="the dev set-up installs deepspeed")
from openrlhf.models import Actor, PolicyLoss  # noqa: E402
from openrlhf.models.loss import aggregate_loss  # noqa: E402
from openrlhf.models.utils import compute_approx_kl  # noqa: E402
from openrlhf.trainer.ppo_utils.experience import Experience  # noqa: E402


@pytest.fixture(scope="module")
def batch(standin_rollout):
    """A padded batch of MAGE experiences from a real tiny-model rollout."""
    cfg, _model, tokenizer, _standins, records = standin_rollout
    exps = experiences_from_records(records, cfg.returns, cfg.advantages)[:6]
    (merged,) = keep_mage_advantages([Experience.concat_experiences(exps, tokenizer.pad_token_id)])
    return merged


@pytest.fixture(scope="module")
def gloo(tmp_path_factory):
    """A one-rank gloo process group, as DeepSpeed's launcher would set it up."""
    mp = pytest.MonkeyPatch()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():  # fmt: skip
        mp.setenv(key, value)
    # DeepSpeed's CPU accelerator compiles a shared-memory all-reduce op on first use
    # (~90 s of C++ build on 2 cores); a one-rank group never reduces across processes.
    mp.setattr(importlib.import_module("deepspeed.comm.torch"), "build_shm_op", lambda: None)
    deepspeed.init_distributed(dist_backend="gloo")
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    mp.undo()


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_step_on_mage_experiences(batch, gloo, stage: int) -> None:
    model, _ = load_model("tiny", dtype="fp32")
    reference, _ = load_model("tiny", dtype="fp32")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    actor = Actor(model, temperature=1.0)
    actor.packing_samples = False  # set only by Actor's from-pretrained branch
    optimizer = torch.optim.AdamW(actor.parameters(), lr=1e-3)
    config = {
        "train_micro_batch_size_per_gpu": len(batch.sequences),
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
    }
    engine, *_ = deepspeed.initialize(model=actor, optimizer=optimizer, config=config)
    with torch.no_grad():
        ref_actor = Actor(reference, temperature=1.0)
        ref_actor.packing_samples = False
        ref_logp = ref_actor(
            batch.sequences, batch.action_mask, attention_mask=batch.attention_mask
        )
        old_logp = engine(batch.sequences, batch.action_mask, attention_mask=batch.attention_mask)
    logp = engine(batch.sequences, batch.action_mask, attention_mask=batch.attention_mask)
    # On-policy: the old log-probs are this actor's, so the PPO ratio starts at 1.
    assert torch.allclose(logp.detach(), old_logp, atol=1e-5)
    pg, clip_ratio, *_ = PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.2)(
        logp, old_logp, batch.advantages, action_mask=batch.action_mask
    )
    assert float(clip_ratio) == 0.0
    kl = compute_approx_kl(logp, ref_logp, kl_estimator="k3")
    loss = pg + 0.1 * aggregate_loss(kl, batch.action_mask)
    engine.backward(loss)
    engine.step()
    if stage == 3:
        with deepspeed.zero.GatheredParameters(list(model.parameters())):
            after = {k: v.clone() for k, v in model.state_dict().items()}
    else:
        after = model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before if k in after)
