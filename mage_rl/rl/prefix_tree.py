"""Sequences that share prefixes, packed as one prefix tree for a single forward pass.

The meta-episodes of a batch begin alike: every conversation opens with the same system
prompt, and rollouts of one task that answered alike share whole rounds. Scored one row
per sequence, each shared token is computed once per sequence that holds it. Packed as a
tree, each distinct prefix is computed once: the tokens of every sequence are inserted
into a trie, its nodes are laid out in depth-first pre-order as one row, and each node
attends to itself and its ancestors only, at the position its depth gives. A node then
sees exactly the tokens its sequences see at that point, so its hidden states and logits
are those of every sequence through it, and a sequence's token ``j`` is read at the node
its path reaches at depth ``j``.

In pre-order the ancestors of node ``i`` are the nodes ``a <= i`` whose subtree (the
interval ``[a, end[a])``) holds ``i``, which gives the mask without walking the tree.

A tree fed to the model is padded to a multiple of :data:`TREE_PAD_MULTIPLE` nodes with
nodes that attend only to themselves and that no sequence reads. Every tree of a run then
has one of a few sizes, so what the CPU kernels keep per shape (oneDNN's compiled
matrix kernels among it) is reused instead of kept anew for each size; without it the
main job's memory in use grew by about 85 MB an iteration (``mage bench memory
--tree-pad 1``).

Gradients stay exact: a logit read by several sequences is gathered once per reader, and
the backward pass adds their contributions at the shared node, as separate rows would
have added them into the shared weights.

The mask makes attention cost ``N^2`` for ``N`` nodes, though a node attends only to its
ancestors. When the tree's sequences share little, attention runs along each sequence's
path instead (:meth:`PrefixTree.path_index`, :mod:`mage_rl.rl.path_attention`): each path
is a causal sequence of its nodes, ``S * L^2 / 2`` for ``S`` paths of at most ``L``, and
each node takes its output from one path through it. The linear layers still see each
node once. On the main job's trees (4 conversations of about 242 tokens sharing a
96-token prompt, 704 nodes) one layer's attention, forward and backward in bf16 on 2
cores, takes 17 ms along paths against 26 ms under the mask; with 24 such conversations,
93 ms against 505 ms; with 4 sequences sharing a 1,000-token prompt, 132 ms against 79
ms. :data:`PATHS_MIN_RATIO` sets where a tree switches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

TREE_PAD_MULTIPLE = 64
"""Fed trees have a multiple of this many nodes."""

PATHS_MIN_RATIO = 1.5
"""Attention runs along paths when the mask's ``N^2`` is at least this many times the
paths' ``S * L^2``: from the timings in the module's docstring, paths cost about as much as
the mask where the ratio is 1.4. Read at each call (``mage bench learner-batch`` sets it to
0 or infinity to time either way)."""


@dataclass(frozen=True)
class PrefixTree:
    """A set of token sequences packed as a trie in depth-first pre-order.

    Attributes:
        tokens: The token id of each node, in pre-order.
        depths: Each node's depth (0 for a first token), its position id.
        ends: One past the last node of each node's subtree.
        paths: For each sequence, the node of each of its tokens, in order.
    """

    tokens: list[int]
    depths: list[int]
    ends: list[int]
    paths: list[list[int]]

    @property
    def size(self) -> int:
        """Nodes: the tokens one forward pass over the tree computes."""
        return len(self.tokens)

    def padded(self, multiple: int = TREE_PAD_MULTIPLE, pad_id: int = 0) -> PrefixTree:
        """This tree with pad nodes appended up to a multiple of ``multiple`` nodes: each
        pad attends only to itself, at position 0, and no path reaches it, so no real
        node's hidden state or logit changes."""
        extra = -self.size % multiple
        if not extra:
            return self
        start = self.size
        return PrefixTree(
            tokens=[*self.tokens, *[pad_id] * extra],
            depths=[*self.depths, *[0] * extra],
            ends=[*self.ends, *range(start + 1, start + extra + 1)],
            paths=self.paths,
        )

    def path_index(self) -> tuple[torch.Tensor, torch.Tensor]:
        """How attention runs along the paths: ``index``, ``(S, L)`` int64, the node of
        each sequence's token ``j`` (0 past its end, a position no real query of the row
        attends to), and ``owner``, ``(N,)`` int64, for each node the flat position
        ``s * L + j`` of one path token that is this node (0 for a pad node, whose output
        nothing reads)."""
        longest = max(len(path) for path in self.paths)
        index = torch.zeros((len(self.paths), longest), dtype=torch.long)
        owner = torch.zeros(self.size, dtype=torch.long)
        for s, path in enumerate(self.paths):
            nodes = torch.tensor(path, dtype=torch.long)
            index[s, : len(path)] = nodes
            owner[nodes] = s * longest + torch.arange(len(path))
        return index, owner

    def attends_along_paths(self) -> bool:
        """Whether attention along the paths is cheaper than under the mask
        (:data:`PATHS_MIN_RATIO`)."""
        longest = max((len(path) for path in self.paths), default=0)
        return self.size**2 >= PATHS_MIN_RATIO * len(self.paths) * longest**2

    def attention_mask(self) -> torch.Tensor:
        """``(1, 1, N, N)`` bool: node ``i`` attends to node ``j`` when ``j`` is ``i`` or
        one of its ancestors."""
        index = torch.arange(self.size)
        ends = torch.tensor(self.ends, dtype=torch.long)
        allowed = (index[None, :] <= index[:, None]) & (ends[None, :] > index[:, None])
        return allowed[None, None]


def build_prefix_tree(sequences: Sequence[Sequence[int]]) -> PrefixTree:
    """Pack ``sequences`` into a :class:`PrefixTree`; equal prefixes share nodes.

    Children keep the order in which they were first inserted, so the layout follows the
    order of ``sequences``.
    """
    # The trie: per node, its token and its children by token (first-seen order).
    node_tokens: list[int] = []
    children: list[dict[int, int]] = [{}]  # children[0] is the root, which holds no token
    trie_paths: list[list[int]] = []
    for seq in sequences:
        node, path = 0, []
        for token in seq:
            token = int(token)
            nxt = children[node].get(token)
            if nxt is None:
                node_tokens.append(token)
                children.append({})
                nxt = len(node_tokens)  # trie ids start at 1; 0 is the root
                children[node][token] = nxt
            node = nxt
            path.append(node)
        trie_paths.append(path)
    # Depth-first pre-order, iteratively (sequences may be thousands of tokens deep).
    order: dict[int, int] = {}
    tokens: list[int] = []
    depths: list[int] = []
    ends: list[int] = []
    stack: list[tuple[int, int, bool]] = [
        (child, 0, False) for child in reversed(children[0].values())
    ]
    while stack:
        node, depth, done = stack.pop()
        if done:
            ends[order[node]] = len(tokens)
            continue
        order[node] = len(tokens)
        tokens.append(node_tokens[node - 1])
        depths.append(depth)
        ends.append(-1)
        stack.append((node, depth, True))
        stack.extend((child, depth + 1, False) for child in reversed(children[node].values()))
    paths = [[order[node] for node in path] for path in trie_paths]
    return PrefixTree(tokens, depths, ends, paths)


def pack_tree_batches(sequences: Sequence[Sequence[int]], node_budget: int) -> list[list[int]]:
    """Group sequence indices into trees of at most ``node_budget`` nodes each.

    Sequences are taken in sorted order of their tokens, so those that share prefixes
    fall into the same tree; a sequence that alone exceeds the budget gets a tree of its
    own. Every index appears exactly once.
    """
    order = sorted(range(len(sequences)), key=lambda i: (list(sequences[i]), i))
    batches: list[list[int]] = []
    current: list[int] = []
    trie: dict[int, dict] = {}
    nodes = 0
    for i in order:
        seq = sequences[i]
        # Walk the shared prefix; the rest of the sequence is what it adds to the tree.
        node, depth = trie, 0
        while depth < len(seq) and int(seq[depth]) in node:
            node = node[int(seq[depth])]
            depth += 1
        if current and nodes + len(seq) - depth > node_budget:
            batches.append(current)
            current, trie, nodes = [], {}, 0
            node, depth = trie, 0
        for token in seq[depth:]:
            node = node.setdefault(int(token), {})
        nodes += len(seq) - depth
        current.append(i)
    if current:
        batches.append(current)
    return batches
