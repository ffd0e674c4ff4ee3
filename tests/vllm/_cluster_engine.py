"""Run inside vLLM's environment: :class:`VLLMEnginePolicy` over a real in-process engine.

``python _cluster_engine.py MODEL_DIR IN.json OUT.json`` starts vLLM's ``AsyncLLM`` (fp32,
``processed_logprobs``), wraps it in OpenRLHF's engine-actor contract
(``async generate(prompt_token_ids, sampling_params)`` returning the final
``RequestOutput``), samples the chats of ``IN.json`` (``[{"messages", "temperature",
"seed"}]``) through ``VLLMEnginePolicy`` and writes each
``Generation`` as JSON, for the test in mage's environment to check against the local model.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys

from transformers import AutoTokenizer
from vllm import AsyncEngineArgs
from vllm.v1.engine.async_llm import AsyncLLM

from mage_rl.cluster.vllm_policy import VLLMEnginePolicy
from mage_rl.policy.base import SamplingParams


class EngineActor:
    """OpenRLHF's ``RolloutRayActor.generate`` contract over vLLM's ``AsyncLLM``."""

    def __init__(self, engine: AsyncLLM) -> None:
        self.engine = engine
        self.ids = itertools.count()

    async def generate(self, prompt_token_ids, sampling_params):
        final = None
        request = {"prompt_token_ids": list(prompt_token_ids)}
        async for output in self.engine.generate(request, sampling_params, str(next(self.ids))):
            final = output
        return final


async def main(model_dir: str, requests: str, out: str) -> None:
    engine = AsyncLLM.from_engine_args(
        AsyncEngineArgs(model=model_dir, dtype="float32", logprobs_mode="processed_logprobs",
                        max_num_seqs=4, max_model_len=2048, kv_cache_memory_bytes=1 << 30,
                        enforce_eager=True)
    )  # fmt: skip
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        policy = VLLMEnginePolicy([EngineActor(engine)], tokenizer, max_model_len=2048)
        with open(requests) as f:
            asked = json.load(f)
        params = [SamplingParams(temperature=r["temperature"], max_tokens=24, seed=r["seed"])
                  for r in asked]  # fmt: skip
        chats = [r["messages"] for r in asked]
        gens = await asyncio.gather(
            *(policy.generate(c, p) for c, p in zip(chats, params, strict=True))
        )
        rows = [{"temperature": p.temperature, "prompt_ids": g.prompt_ids,
                 "response_ids": g.response_ids, "logprobs": g.logprobs, "text": g.text}
                for g, p in zip(gens, params, strict=True)]  # fmt: skip
        with open(out, "w") as f:
            json.dump(rows, f)
    finally:
        engine.shutdown()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
