"""Prefix trees: the packing itself, and a learner fed trees trains as one fed padded rows."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch

from mage_rl.policy.tiny import build_tiny
from mage_rl.rl import prefix_tree
from mage_rl.rl.batching import (
    ConversationSample,
    Sample,
    collate,
    collate_tree,
    sequence_ids,
)
from mage_rl.rl.learner import Learner, LearnerConfig
from mage_rl.rl.prefix_tree import build_prefix_tree, pack_tree_batches
from tests.rl.test_conversation_learning import both_layouts
from tests.rl.test_learner import make_model, random_pairs

SEQUENCES = [[5, 6, 7, 8], [5, 6, 9], [5, 6, 7, 1, 2], [3], [5, 6, 9], [3, 4]]


def test_the_tree_has_one_node_per_distinct_prefix() -> None:
    tree = build_prefix_tree(SEQUENCES)
    prefixes = {tuple(s[: j + 1]) for s in SEQUENCES for j in range(len(s))}
    assert tree.size == len(prefixes) == 9
    for seq, path in zip(SEQUENCES, tree.paths, strict=True):
        assert [tree.tokens[n] for n in path] == seq
        assert [tree.depths[n] for n in path] == list(range(len(seq)))
    # Equal prefixes, equal nodes; different prefixes, different nodes.
    for (a, pa), (b, pb) in itertools.combinations(zip(SEQUENCES, tree.paths, strict=True), 2):
        for j in range(min(len(a), len(b))):
            assert (pa[j] == pb[j]) == (a[: j + 1] == b[: j + 1])


def test_each_node_attends_to_its_ancestors_and_itself_only() -> None:
    tree = build_prefix_tree(SEQUENCES)
    ancestors = {n: set(path[: j + 1]) for path in tree.paths for j, n in enumerate(path)}
    mask = tree.attention_mask()[0, 0]
    assert mask.shape == (tree.size, tree.size)
    for i in range(tree.size):
        assert set(torch.nonzero(mask[i]).flatten().tolist()) == ancestors[i]


def test_pad_nodes_see_only_themselves_and_nothing_sees_them() -> None:
    tree = build_prefix_tree(SEQUENCES)
    padded = tree.padded(multiple=8, pad_id=0)
    assert padded.size == 16 and padded.paths == tree.paths
    mask = padded.attention_mask()[0, 0]
    assert torch.equal(mask[: tree.size, : tree.size], tree.attention_mask()[0, 0])
    assert not mask[: tree.size, tree.size :].any()  # no real node attends to a pad
    assert torch.equal(mask[tree.size :, :], torch.eye(16, dtype=torch.bool)[tree.size :])
    assert padded.padded(multiple=8) is padded  # already a multiple


def test_trees_are_packed_under_the_node_budget() -> None:
    sequences = [p + r for p, r in random_pairs(30, seed=4)] + [[1, 2, 3]] * 5 + [[9] * 40]
    for budget in (8, 20, 64, 10_000):
        groups = pack_tree_batches(sequences, budget)
        assert sorted(i for g in groups for i in g) == list(range(len(sequences)))
        for group in groups:
            size = build_prefix_tree([sequences[i] for i in group]).size
            assert size <= budget or len(group) == 1
    # Repeats share all their nodes: five copies cost one.
    assert build_prefix_tree([[1, 2, 3]] * 5).size == 3


@pytest.fixture(params=["paths", "mask"])
def tree_attention(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every tree attends along its paths, or every tree under its mask."""
    monkeypatch.setattr(
        prefix_tree, "PATHS_MIN_RATIO", 0.0 if request.param == "paths" else math.inf
    )
    return str(request.param)


def test_each_path_lists_its_nodes_and_each_node_has_one_owner() -> None:
    real = build_prefix_tree(SEQUENCES).size
    tree = build_prefix_tree(SEQUENCES).padded(8)
    assert tree.size > real
    index, owner = tree.path_index()
    longest = max(map(len, SEQUENCES))
    assert index.shape == (len(SEQUENCES), longest) and owner.shape == (tree.size,)
    for s, path in enumerate(tree.paths):
        assert index[s, : len(path)].tolist() == path
    for node in range(tree.size):
        if node >= real:  # pad nodes: no path reaches them
            assert int(owner[node]) == 0
            continue
        s, j = divmod(int(owner[node]), longest)
        assert tree.paths[s][j] == node


def test_trees_that_share_little_attend_along_their_paths() -> None:
    branches = [[1, *range(10 + 20 * k, 30 + 20 * k)] for k in range(4)]  # share one token
    assert build_prefix_tree(branches).attends_along_paths()
    shared = [[*range(100, 300), k] for k in range(4)]  # share 200 of 201 tokens
    assert not build_prefix_tree(shared).attends_along_paths()


def test_path_attention_gives_the_masks_hidden_states(tree_attention: str) -> None:
    model = make_model()
    learner = Learner(copy.deepcopy(model), LearnerConfig(dtype="fp32"))
    samples = [Sample(list(s[:-1]), [s[-1]], [0.0], 1.0) for s in SEQUENCES if len(s) > 1]
    batch = collate_tree(samples)
    assert (batch.tree_paths is not None) == (tree_attention == "paths")
    kwargs = {} if batch.tree_paths is None else {"tree_paths": batch.tree_paths}
    with torch.no_grad():
        got = learner.model(batch.input_ids, attention_mask=batch.attention_mask,
                            position_ids=batch.position_ids, **kwargs).logits  # fmt: skip
        want = model(batch.input_ids, attention_mask=batch.attention_mask,
                     position_ids=batch.position_ids).logits  # fmt: skip
    real = build_prefix_tree([sequence_ids(s) for s in samples]).size
    assert batch.input_ids.shape[1] > real  # pad nodes too, whose outputs nothing reads
    torch.testing.assert_close(got[0, :real], want[0, :real], rtol=1e-5, atol=1e-5)


def _tree_and_padded(model: torch.nn.Module, **config: object) -> tuple[Learner, Learner]:
    settings = dict(dtype="fp32", lr=1e-3, entropy_coef=0.01, **config)
    tree = Learner(copy.deepcopy(model), LearnerConfig(prefix_tree=True, **settings))
    padded = Learner(copy.deepcopy(model), LearnerConfig(prefix_tree=False, **settings))
    assert tree.tree and not padded.tree
    return tree, padded


def _shared_prompt_samples(learner: Learner) -> list[Sample]:
    """Per-call samples whose prompts share prefixes (three groups of four), with old
    log-probs off the policy so that clipping is active."""
    g = torch.Generator().manual_seed(3)
    samples = []
    for group, (prompt, _) in enumerate(random_pairs(3, seed=5)):
        for k in range(4):
            extra = torch.randint(0, 128, (k % 3,), generator=g).tolist()
            response = torch.randint(0, 128, (1 + (k + group) % 4,), generator=g).tolist()
            samples.append(Sample([*prompt, *extra], response, [0.0] * len(response), 0.0))
    fresh = learner.compute_logprobs(samples)
    return [
        Sample(
            s.prompt_ids,
            s.response_ids,
            (torch.tensor(lp) + 0.3 * torch.randn(len(lp), generator=g)).tolist(),
            float(torch.randn(1, generator=g)) * 2,
        )  # fmt: skip
        for s, lp in zip(samples, fresh, strict=True)
    ]


def _assert_same_training(tree: Learner, padded: Learner, samples: list) -> None:
    for a, b in zip(tree.compute_logprobs(samples), padded.compute_logprobs(samples), strict=True):
        assert a == pytest.approx(b, abs=1e-5)
    stats_tree = tree.accumulate_gradients(samples)
    stats_padded = padded.accumulate_gradients(samples)
    for name in ("loss", "pg_loss", "entropy", "clip_frac", "kl", "free_frac"):
        assert stats_tree[name] == pytest.approx(stats_padded[name], rel=1e-5, abs=1e-7), name
    params = zip(tree.model.named_parameters(), padded.model.parameters(), strict=True)
    for (name, a), b in params:
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("budget", [10_000, 40])
def test_per_call_samples_train_the_same_as_trees(budget: int, tree_attention: str) -> None:
    tree, padded = _tree_and_padded(make_model(), kl_coef=0.1, micro_batch_tokens=budget)
    samples = _shared_prompt_samples(padded)
    sequences = [[*s.prompt_ids, *s.response_ids] for s in samples]
    packed = pack_tree_batches(sequences, budget)
    assert build_prefix_tree(sequences).size < sum(map(len, sequences))
    assert (len(packed) > 1) == (budget < 100)
    _assert_same_training(tree, padded, samples)


def test_conversations_train_the_same_as_trees(tree_attention: str) -> None:
    model, tokenizer = build_tiny(seed=0)
    tree, padded = _tree_and_padded(model, kl_coef=0.1)
    # Seeds 1 and 3 answer the first call alike, so their conversations share it too.
    conversations, _ = both_layouts(padded, tokenizer, seeds=(1, 3, 2))
    ids = [c.ids[: c.length] for c in conversations]
    shared = next(j for j in range(len(ids[0])) if ids[0][j] != ids[1][j])
    assert shared > conversations[0].segments[0].end
    assert all(isinstance(c, ConversationSample) for c in conversations)
    _assert_same_training(tree, padded, conversations)


def test_a_tree_batch_reads_each_trained_token_where_its_row_would() -> None:
    model, tokenizer = build_tiny(seed=0)
    learner = Learner(model, LearnerConfig(dtype="fp32"))
    conversations, _ = both_layouts(learner, tokenizer, seeds=(1, 3))
    padded, packed = collate(conversations), collate_tree(conversations)
    for name in ("response_ids", "old_logprobs", "advantages", "mask"):
        torch.testing.assert_close(getattr(packed, name), getattr(padded, name))
    assert packed.input_ids.shape[1] < padded.attention_mask.sum()
    for b in range(len(conversations)):
        for r in range(int(padded.mask[b].sum())):
            node = int(packed.positions[b, r])
            row_position = int(padded.positions[b, r])
            assert int(packed.position_ids[0, node]) == row_position
            assert int(packed.input_ids[0, node]) == int(padded.input_ids[b, row_position])


def test_models_without_sdpa_attention_get_padded_rows() -> None:
    model = make_model()
    model.config._attn_implementation = "eager"
    assert not Learner(model, LearnerConfig(dtype="fp32")).tree
