"""The ``openrlhf:`` config section: GPU placement and DeepSpeed/vLLM settings.

The maths (returns, advantages, PPO clip, KL, entropy, learning rate, mini-batch) comes
from the usual sections; this one only says where the models live and how they are
sharded. Every field maps to one OpenRLHF 0.11 flag (``mage_rl.cluster.openrlhf_args``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class OpenRLHFSection(BaseModel):
    """Placement of the actor, reference and vLLM engines (``train.backend: openrlhf``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True)

    actor_nodes: int = Field(1, ge=1, description="Nodes of the DeepSpeed actor group.")
    actor_gpus_per_node: int = Field(
        8, ge=1, description="GPUs per node of the actor group (one DeepSpeed rank each)."
    )
    ref_nodes: int = Field(1, ge=1, description="Nodes of the reference group (KL to the start).")
    ref_gpus_per_node: int = Field(8, ge=1, description="GPUs per node of the reference group.")
    vllm_engines: int = Field(
        8, ge=1, description="vLLM engines that sample the rollouts (each a Ray actor)."
    )
    vllm_tensor_parallel: int = Field(
        1, ge=1, description="GPUs per vLLM engine; 1 fits a 4B model in bf16 on one GPU."
    )
    vllm_gpu_memory_utilization: float = Field(
        0.6,
        gt=0.0,
        le=1.0,
        description="Share of a GPU vLLM may take (weights + KV cache); lower it when "
        "colocated with DeepSpeed.",
    )
    colocate_all: bool = Field(
        True,
        description="Put actor, reference and vLLM on the same GPUs, each sleeping while "
        "the others run (OpenRLHF's hybrid engine). Needs actor GPUs == vLLM engines x "
        "tensor parallel; halves the GPUs needed at the cost of wake/sleep time.",
    )
    zero_stage: int = Field(
        3, ge=0, le=3, description="DeepSpeed ZeRO stage of actor and reference (3 shards all)."
    )
    adam_offload: bool = Field(False, description="Keep Adam states in CPU memory (slower).")
    gradient_checkpointing: bool = Field(
        True, description="Recompute activations in the backward pass (less memory, ~30% slower)."
    )
    micro_train_batch_size: int = Field(
        4, ge=1, description="Samples per GPU per forward/backward of the PPO update."
    )
    micro_rollout_batch_size: int = Field(
        8, ge=1, description="Samples per GPU per forward when scoring log-probs."
    )
    max_len: int = Field(
        8192,
        ge=64,
        description="Longest prompt + response in tokens (vLLM max_model_len); the "
        "reflection prompts of late episodes are the longest.",
    )
    extra_args: list[str] = Field(
        default_factory=list,
        description="Further OpenRLHF flags passed through verbatim, e.g. "
        "['--vllm.enable_prefix_caching'].",
    )

    @model_validator(mode="after")
    def _check(self) -> OpenRLHFSection:
        actor_gpus = self.actor_nodes * self.actor_gpus_per_node
        vllm_gpus = self.vllm_engines * self.vllm_tensor_parallel
        if self.colocate_all and actor_gpus != vllm_gpus:
            raise ValueError(
                f"openrlhf.colocate_all needs as many actor GPUs ({self.actor_nodes} x "
                f"{self.actor_gpus_per_node} = {actor_gpus}) as vLLM GPUs "
                f"({self.vllm_engines} x {self.vllm_tensor_parallel} = {vllm_gpus}); "
                "change vllm_engines or set colocate_all: false"
            )
        return self
