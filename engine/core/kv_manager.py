"""The engine's two memory pools, with exact accounting.

* Paged KV for the full-attention layers: ``num_blocks`` blocks of ``block_size`` tokens. Block 0 is
  the null block the runner pads block tables with, so it is never handed out.
* GDN state slots: one per running request (conv + recurrent state of every GDN layer). Slot 0 is the
  padding slot, never handed out.

Both are free lists keyed by request id. Blocks are reused LIFO. Slots go lowest id first, so the
highest slot id ever handed out is the most requests that ran at once; a runner that maps a slot's
memory when the slot is first handed out (``slot_ready``, engine/model/vmm.py) holds no more. Every
request owns at most one slot and a block table that grows append-only until the request is freed
(finished, aborted or preempted), when everything
goes back at once. ``check_invariants()`` proves that no id is lost, duplicated or shared.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable


class _FreeList:
    """Ids 1..n-1 (0 is reserved). LIFO reuse keeps recently freed (cache-warm) ids in play."""

    def __init__(self, n: int, what: str) -> None:
        if n < 2:
            raise ValueError(f"need at least 2 {what} (id 0 is reserved), got {n}")
        self.n = n
        self.what = what
        self.free: deque[int] | list[int] = deque(range(1, n))

    @property
    def usable(self) -> int:
        return self.n - 1

    def peek(self) -> int:
        """The id :meth:`take` hands out next (there must be one)."""
        return self.free[-1]

    def take(self, k: int) -> list[int]:
        if k > len(self.free):
            raise MemoryError(f"asked for {k} {self.what}, {len(self.free)} free")
        return [self.free.pop() for _ in range(k)]

    def give(self, ids: list[int]) -> None:
        self.free.extend(ids)


class _LowestFirst(_FreeList):
    """A free list that hands out the lowest free id (a heap)."""

    def __init__(self, n: int, what: str) -> None:
        super().__init__(n, what)
        self._heap = list(range(1, n))  # sorted: already a heap
        self.free = self._heap

    def peek(self) -> int:
        return self._heap[0]

    def take(self, k: int) -> list[int]:
        if k > len(self.free):
            raise MemoryError(f"asked for {k} {self.what}, {len(self.free)} free")
        return [heapq.heappop(self._heap) for _ in range(k)]

    def give(self, ids: list[int]) -> None:
        for i in ids:
            heapq.heappush(self._heap, i)


class KVManager:
    """Owns every block table and state slot; the scheduler asks, never touches ids itself."""

    def __init__(
        self,
        num_blocks: int,
        num_slots: int,
        block_size: int,
        slot_ready: Callable[[int], bool] | None = None,
    ) -> None:
        """``slot_ready(slot)`` is asked before a slot is handed out; False (its memory cannot be mapped
        now) refuses the allocation as if no slot were free."""
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        self.block_size = block_size
        self._blocks = _FreeList(num_blocks, "KV blocks")
        self._slots = _LowestFirst(num_slots, "state slots")
        self._slot_ready = slot_ready
        self._tables: dict[str, list[int]] = {}
        self._slot_of: dict[str, int] = {}

    # ---- capacity ------------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        """Usable blocks (the null block excluded)."""
        return self._blocks.usable

    @property
    def num_slots(self) -> int:
        """Usable state slots (the padding slot excluded)."""
        return self._slots.usable

    @property
    def num_free_blocks(self) -> int:
        return len(self._blocks.free)

    @property
    def num_free_slots(self) -> int:
        return len(self._slots.free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_used_slots(self) -> int:
        return self.num_slots - self.num_free_slots

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_ever_fit(self, num_tokens: int) -> bool:
        """Whether a request of this many tokens fits in the whole, otherwise empty, pool."""
        return self.blocks_for(num_tokens) <= self.num_blocks

    # ---- per request ---------------------------------------------------------------------------
    def block_table(self, request_id: str) -> list[int]:
        return self._tables.get(request_id, [])

    def slot(self, request_id: str) -> int:
        return self._slot_of.get(request_id, 0)

    def allocate_slot(self, request_id: str) -> bool:
        """Give the request a slot if it has none; False when none is free (nothing changes)."""
        if request_id in self._slot_of:
            return True
        if not self._slots.free:
            return False
        if self._slot_ready is not None and not self._slot_ready(self._slots.peek()):
            return False
        self._slot_of[request_id] = self._slots.take(1)[0]
        return True

    def grow(self, request_id: str, num_tokens: int) -> bool:
        """Make the request's block table cover ``num_tokens`` tokens; all or nothing."""
        table = self._tables.get(request_id)
        have = len(table) if table is not None else 0
        need = self.blocks_for(num_tokens) - have
        if need <= 0:
            return True
        if need > len(self._blocks.free):
            return False
        new = self._blocks.take(need)
        if table is None:
            self._tables[request_id] = new
        else:
            table.extend(new)
        return True

    def free(self, request_id: str) -> None:
        """Return the request's blocks and slot; a no-op for a request that holds nothing."""
        table = self._tables.pop(request_id, None)
        if table:
            # Reversed so the LIFO free list hands the table's first block out first next time.
            self._blocks.give(table[::-1])
        slot = self._slot_of.pop(request_id, None)
        if slot is not None:
            self._slots.give([slot])

    def owners(self) -> set[str]:
        return set(self._tables) | set(self._slot_of)

    # ---- invariants ----------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Every id is reserved, free or owned by exactly one request; raise AssertionError otherwise."""
        for pool, owned in (
            (self._blocks, [b for t in self._tables.values() for b in t]),
            (self._slots, list(self._slot_of.values())),
        ):
            free = list(pool.free)
            assert len(set(free)) == len(free), f"duplicate free {pool.what}"
            assert len(set(owned)) == len(owned), f"{pool.what} owned twice"
            assert not set(free) & set(owned), f"{pool.what} both free and owned"
            everything = sorted(free + owned)
            assert everything == list(range(1, pool.n)), f"{pool.what} lost or out of range"
        assert all(self._tables.values()), "an empty block table was kept"
