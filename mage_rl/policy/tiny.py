"""A tiny Qwen3 model and a locally trained tokenizer, built in-process for tests.

Nothing is downloaded and nothing is written to disk. The model has random weights (a
few hundred thousand parameters), so its text is gibberish; it exists so that the
engine, the learner and the graphs can be exercised end to end on a CPU in seconds.

1. A byte-level BPE tokenizer is trained with the ``tokenizers`` library on a small
   built-in corpus of game prompts, tags (``<action>``, ``<remark>``), actions (PASS,
   BET), digits and common words. Byte-level means every string is encodable.
2. ChatML special tokens ``<|im_start|>`` and ``<|im_end|>`` and a pad token
   ``<|endoftext|>`` are added; ``<|im_end|>`` is the end-of-sequence token, as in Qwen
   chat models, so a response ends where a ChatML turn ends.
3. A ``Qwen3ForCausalLM`` is initialised from a seed. The initialiser scale is larger than
   the usual 0.02 so that next-token distributions are peaked rather than uniform:
   log-prob tests on a near-uniform model would pass even if they were wrong.
"""

from __future__ import annotations

import itertools
import logging

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

logger = logging.getLogger(__name__)

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)

# The same ChatML rendering Qwen and SmolLM2 use, without a default system prompt.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_WORD_TEXT = (
    "you are playing kuhn poker leduc hold em sokoban against an opponent the game is "
    "your card jack queen king legal actions are choose one action and reply with it "
    "inside tags think about what the opponent did last episode then reflect on it "
    "player chips pot payoff won lost draw episode turn step round move box goal wall "
    "push up down left right reward history observation reflection remark strategy "
    "bluff fold call raise check bet pass exploit explore early late it was a good "
    "bad move because they always never sometimes so next time i should will to of "
    "in on at for from by with as this that these those what why how when which who"
)
_WORDS = tuple(_WORD_TEXT.split())

_TEMPLATES = (
    "You are player {p} in Kuhn Poker. Your card is {card}. Legal actions: PASS, BET.",
    "Reply with <action>PASS</action> or <action>BET</action>.",
    "<action>{act}</action>",
    "The opponent played {act} after you played {act2}. The pot is {n} chips.",
    "<remark>The opponent {adv} {act} with a {card}, so I should {act2} next time.</remark>",
    "Episode {n} of {m}: you {outcome} {n} chips. Reward: {sign}{n}.",
    "Sokoban board {n}x{m}: push the box to the goal. Moves: up, down, left, right.",
    "Observation: step {n}, history [{act}, {act2}], payoff {sign}{m}.",
    "Think step by step, then answer inside <action></action> tags.",
    "Reflect on the last episode inside <remark></remark> tags.",
)


def _corpus() -> list[str]:
    """A deterministic corpus that covers the strings the games put in prompts."""
    lines: list[str] = []
    cards = ("J", "Q", "K", "Jack", "Queen", "King")
    acts = ("PASS", "BET", "CALL", "FOLD", "up", "down", "left", "right")
    adverbs = ("always", "never", "sometimes", "often")
    outcomes = ("won", "lost", "drew")
    for i, template in enumerate(_TEMPLATES * 6):
        j = i * 7
        lines.append(
            template.format(
                p=i % 2,
                card=cards[j % len(cards)],
                act=acts[i % len(acts)],
                act2=acts[(j + 3) % len(acts)],
                adv=adverbs[i % len(adverbs)],
                outcome=outcomes[i % len(outcomes)],
                n=i % 13,
                m=(j % 9) + 1,
                sign="-" if i % 2 else "+",
            )
        )
    lines.extend(
        f"{role}\n{line}" for role in ("system", "user", "assistant") for line in lines[:4]
    )
    lines.append(" ".join(str(n) for n in range(200)))
    lines.append("0123456789 +-*/=()[]{}<>.,:;!?'\" \n\t")
    # Word bigrams so that common words become single tokens with a leading space.
    for a, b in itertools.islice(itertools.product(_WORDS, repeat=2), 0, None, 7):
        lines.append(f"{a} {b}.")
    lines.extend(" ".join(_WORDS[k : k + 12]) for k in range(0, len(_WORDS), 12))
    return lines


def build_tiny_tokenizer(vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on the built-in corpus.

    Args:
        vocab_size: Target vocabulary size, special tokens included. The trainer may stop
            short of it when the corpus runs out of merges.

    Returns:
        A fast tokenizer with a ChatML ``chat_template``; ``eos_token`` is ``<|im_end|>``
        and ``pad_token`` is ``<|endoftext|>``.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        # The full byte alphabet makes every string encodable, not only corpus characters.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        chat_template=CHATML_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )


def build_tiny(
    seed: int = 0,
    *,
    vocab_size: int = 1024,
    hidden_size: int = 64,
    num_layers: int = 2,
    init_std: float = 0.3,
    dtype: torch.dtype = torch.float32,
) -> tuple[Qwen3ForCausalLM, PreTrainedTokenizerFast]:
    """Build the tiny test model and its tokenizer.

    Args:
        seed: Seed of the weight initialisation; the same seed gives bitwise the same
            weights. The global torch RNG is left untouched.
        vocab_size: Target tokenizer vocabulary size.
        hidden_size: Model width (4 query heads, 2 key/value heads).
        num_layers: Number of decoder layers.
        init_std: Standard deviation of the weight initialisation; large enough that the
            next-token distributions are far from uniform.
        dtype: Parameter dtype.

    Returns:
        ``(model, tokenizer)``, the model in eval mode.
    """
    tokenizer = build_tiny_tokenizer(vocab_size)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        max_position_embeddings=4096,
        initializer_range=init_std,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.to(dtype=dtype)  # type: ignore[call-arg]  # transformers' wrapped .to() confuses mypy
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.config.name_or_path = "tiny"
    model.eval()
    n_params = sum(p.numel() for p in model.parameters())
    logger.debug("built tiny Qwen3: %d parameters, vocab %d", n_params, len(tokenizer))
    return model, tokenizer
