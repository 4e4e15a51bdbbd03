"""Radix tree over token-id sequences mapping cached prefixes to KV-pool slots (prefix caching).

Keys are python lists of ints (image pad values are ordinary ints); values are 1-D int64 tensors of
KV-pool slot indices with the same length as the key. Everything is page granular: an edge always
holds a whole number of pages, and only whole matching pages count as a match.

Hybrid models (`require_snapshot`): a cached prefix is resumable only where the tree also holds the
recurrent state at its end, a snapshot slot of the state pool (`TreeNode.snapshot`, marking the end of
that node's edge). A match then stops at the deepest such node; splitting an edge keeps the snapshot
with the lower half, whose end it marks; evicting a node frees its snapshot with its slots.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Any

import torch

_EMPTY = torch.empty(0, dtype=torch.int64)


class TreeNode:
    _ids = itertools.count()

    def __init__(self, parent: TreeNode | None = None, key: list[int] | None = None, value: torch.Tensor | None = None):
        self.id = next(TreeNode._ids)
        self.parent = parent
        self.children: dict[Any, TreeNode] = {}
        self.key: list[int] = key if key is not None else []
        self.value: torch.Tensor = value if value is not None else _EMPTY
        # Number of running requests whose matched path passes through this node; > 0 => never evicted.
        self.lock_ref = 0
        self.last_access = 0
        self.snapshot: int | None = None  # hybrid models: state-pool slot holding the state at this edge's end

    def __repr__(self) -> str:
        return f"TreeNode(id={self.id}, len={len(self.key)}, lock_ref={self.lock_ref}, t={self.last_access})"


@dataclass
class MatchResult:
    indices: torch.Tensor  # int64 slots of the longest cached page-aligned prefix (possibly empty)
    last_node: TreeNode  # node where the match ended (the root when nothing matched)


class RadixCache:
    """Prefix cache. The tree owns the slots stored in its nodes and frees them on evict()/reset().

    Sizes are counted in tokens. evictable_size() + protected_size() == total_size() always.
    """

    def __init__(self, allocator, page_size: int = 1, disable: bool = False, free_snapshot=None):
        """free_snapshot: given, the tree is a hybrid model's (see the module docstring) and calls it with
        each snapshot slot it drops."""
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.allocator = allocator
        self.page_size = page_size
        self.disable = disable
        self.free_snapshot = free_snapshot
        self.require_snapshot = free_snapshot is not None
        self._clock = itertools.count(1)  # monotonic access counter: deterministic LRU order
        self._reset_tree()

    # ------------------------------------------------------------------ bookkeeping
    def _reset_tree(self) -> None:
        """Drops the tree WITHOUT freeing its slots (use reset() to give them back)."""
        self.root = TreeNode()
        self.root.lock_ref = 1  # the root is never evicted and holds no tokens
        self._evictable = 0
        self._protected = 0

    def reset(self) -> None:
        """Frees every slot held by the tree back to the allocator and empties it.

        Precondition: no running request holds a lock (e.g. /flush_cache when idle); locked
        slots are freed too.
        """
        slots = self.all_slots()
        if slots.numel():
            self.allocator.free(slots)
        for node in self._nodes():
            self._drop_snapshot(node)
        self._reset_tree()

    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def total_size(self) -> int:
        return self._evictable + self._protected

    def snapshot_count(self) -> int:
        return sum(n.snapshot is not None for n in self._nodes())

    def _drop_snapshot(self, node: TreeNode) -> None:
        if node.snapshot is not None:
            self.free_snapshot(node.snapshot)
            node.snapshot = None

    def all_slots(self) -> torch.Tensor:
        """All slots currently owned by the tree (no particular order)."""
        vals = [n.value for n in self._nodes() if n is not self.root]
        return torch.cat(vals) if vals else _EMPTY.clone()

    def _nodes(self):
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    # ------------------------------------------------------------------ key helpers
    def _child_key(self, key: list[int]):
        return key[0] if self.page_size == 1 else tuple(key[: self.page_size])

    def _match_len(self, a: list[int], b: list[int]) -> int:
        """Length of the common prefix of a and b, rounded down to whole pages."""
        n = min(len(a), len(b))
        i = 0
        while i < n and a[i] == b[i]:
            i += 1
        return i - i % self.page_size

    def _page_align(self, n: int) -> int:
        return n - n % self.page_size

    def _split(self, child: TreeNode, at: int) -> TreeNode:
        """Splits child's edge at `at` (page aligned, 0 < at < len); returns the new upper node."""
        upper = TreeNode(child.parent, child.key[:at], child.value[:at])
        upper.lock_ref = child.lock_ref  # locks cover whole paths, so the upper half inherits them
        upper.last_access = child.last_access
        upper.children = {self._child_key(child.key[at:]): child}
        child.parent.children[self._child_key(child.key)] = upper
        child.parent = upper
        child.key = child.key[at:]
        child.value = child.value[at:]
        return upper

    # ------------------------------------------------------------------ public API
    def match_prefix(self, key: list[int]) -> MatchResult:
        """Longest cached page-aligned prefix of key; splits a node if the match ends mid-edge."""
        if self.disable:
            return MatchResult(_EMPTY.clone(), self.root)
        key = key[: self._page_align(len(key))]
        now = next(self._clock)
        node, parts = self.root, []
        while key:
            child = node.children.get(self._child_key(key))
            if child is None:
                break
            child.last_access = now
            n = self._match_len(child.key, key)
            if n < len(child.key):
                node = self._split(child, n)
                parts.append(node.value)
                break
            parts.append(child.value)
            node, key = child, key[n:]
        if self.require_snapshot:
            while node is not self.root and node.snapshot is None:
                node = node.parent
                parts.pop()
        return MatchResult(torch.cat(parts) if parts else _EMPTY.clone(), node)

    def insert(self, key: list[int], indices: torch.Tensor) -> int:
        """Inserts key -> indices (both truncated down to whole pages); returns the length P of the
        prefix of the truncated key that was ALREADY in the tree.

        Ownership contract, with T = len(key) rounded down to a multiple of page_size:
          * positions [0, P): the tree keeps its own slots. If the caller obtained indices[:C] from
            match_prefix (C = its cached length, C <= P while that match stays locked), those ARE the
            tree's slots; the caller must free its own duplicate copies indices[C:P].
          * positions [P, T): ownership of indices[P:T] passes to the tree (freed by evict/reset).
          * positions [T, len(indices)) (a trailing partial page) stay with the caller.
        When disabled, this returns 0 and the tree takes nothing: the caller keeps all its slots.
        """
        if self.disable:
            return 0
        if len(key) != len(indices):
            raise ValueError(f"key has {len(key)} tokens but indices has {len(indices)}")
        t = self._page_align(len(key))
        key, value = list(key[:t]), indices[:t].to(torch.int64).clone()
        now = next(self._clock)
        node, present = self.root, 0
        while key:
            child = node.children.get(self._child_key(key))
            if child is None:
                leaf = TreeNode(node, key, value)
                leaf.last_access = now
                node.children[self._child_key(key)] = leaf
                self._evictable += len(key)  # a fresh leaf is unlocked
                break
            child.last_access = now
            n = self._match_len(child.key, key)
            if n < len(child.key):
                child = self._split(child, n)
            present += n
            node, key, value = child, key[n:], value[n:]
        return present

    def attach_snapshot(self, key: list[int], slot: int) -> bool:
        """Hybrid models: the state after `key` (page aligned, already inserted) is kept in `slot`, at the
        end of the node `key` ends at (an edge is split there). False, and the slot stays the caller's,
        when that node has a snapshot already or `key` is not (or no longer) in the tree."""
        if self.disable or not key or len(key) % self.page_size:
            return False
        node = self.root
        while key:
            child = node.children.get(self._child_key(key))
            if child is None:
                return False
            n = self._match_len(child.key, key)
            if n == 0:
                return False
            if n < len(child.key):
                if n < len(key):
                    return False
                child = self._split(child, n)
            node, key = child, key[n:]
        if node.snapshot is not None:
            return False
        node.snapshot = slot
        return True

    def inc_lock_ref(self, node: TreeNode) -> int:
        """Locks the path node -> root; returns how many tokens moved from evictable to protected."""
        moved = 0
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
                moved += len(node.key)
            node.lock_ref += 1
            node = node.parent
        return moved

    def dec_lock_ref(self, node: TreeNode) -> int:
        """Unlocks the path node -> root; returns how many tokens moved from protected to evictable."""
        moved = 0
        while node is not self.root:
            if node.lock_ref <= 0:
                raise RuntimeError(f"dec_lock_ref below zero on {node!r}")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable += len(node.key)
                self._protected -= len(node.key)
                moved += len(node.key)
            node = node.parent
        return moved

    def evict(self, num_tokens: int, snapshots: int = 0) -> int:
        """Frees unlocked leaves, least recently used first, until >= num_tokens tokens (and >= `snapshots`
        state snapshots) are freed or nothing evictable remains; a parent becomes a candidate once its
        last child is gone. Returns the tokens freed."""
        if self.disable or (num_tokens <= 0 and snapshots <= 0):
            return 0
        heap = [(n.last_access, n.id, n) for n in self._nodes() if not n.children and n.lock_ref == 0]
        heapq.heapify(heap)
        freed = freed_snapshots = 0
        while heap and (freed < num_tokens or freed_snapshots < snapshots):
            _, _, leaf = heapq.heappop(heap)
            self.allocator.free(leaf.value)
            freed_snapshots += leaf.snapshot is not None
            self._drop_snapshot(leaf)
            freed += len(leaf.key)
            self._evictable -= len(leaf.key)
            parent = leaf.parent
            del parent.children[self._child_key(leaf.key)]
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        return freed

    def pretty_print(self) -> str:
        """Prints (and returns) the tree, one node per line, indented by depth."""
        lines = [f"root  evictable={self._evictable} protected={self._protected}"]

        def walk(node: TreeNode, depth: int) -> None:
            for child in sorted(node.children.values(), key=lambda c: c.id):
                head = child.key[:8]
                more = "..." if len(child.key) > 8 else ""
                lines.append(
                    f"{'  ' * depth}- key={head}{more} len={len(child.key)} "
                    f"lock={child.lock_ref} t={child.last_access} slots={child.value[:8].tolist()}{more}"
                )
                walk(child, depth + 1)

        walk(self.root, 1)
        text = "\n".join(lines)
        print(text)
        return text
