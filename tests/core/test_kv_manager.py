"""KVManager: reserved ids, all-or-nothing growth, exact accounting."""

from __future__ import annotations

import random

import pytest

from engine.core.kv_manager import KVManager


def test_reserved_ids_never_handed_out():
    kv = KVManager(num_blocks=5, num_slots=3, block_size=4)
    assert kv.num_blocks == 4 and kv.num_slots == 2
    assert kv.grow("a", 16)
    assert kv.allocate_slot("a") and kv.allocate_slot("a")  # idempotent
    assert sorted(kv.block_table("a")) == [1, 2, 3, 4] and kv.slot("a") in (1, 2)
    kv.check_invariants()
    assert kv.allocate_slot("b") and not kv.allocate_slot("c")
    kv.free("a")
    kv.free("b")
    kv.free("never-seen")
    kv.check_invariants()
    assert kv.num_used_blocks == 0 and kv.num_used_slots == 0


def test_grow_is_all_or_nothing():
    kv = KVManager(num_blocks=5, num_slots=3, block_size=4)
    assert kv.grow("a", 5)  # 2 blocks
    assert not kv.grow("b", 12)  # needs 3, 2 free
    assert kv.block_table("b") == [] and kv.num_free_blocks == 2
    assert kv.grow("a", 8) and len(kv.block_table("a")) == 2  # already covered
    assert kv.can_ever_fit(16) and not kv.can_ever_fit(17)
    kv.check_invariants()


def test_invariants_catch_corruption():
    kv = KVManager(num_blocks=5, num_slots=3, block_size=4)
    kv.grow("a", 4)
    kv._blocks.free.append(kv.block_table("a")[0])  # double-owned
    with pytest.raises(AssertionError):
        kv.check_invariants()


def test_random_alloc_free():
    rng = random.Random(0)
    kv = KVManager(num_blocks=33, num_slots=9, block_size=8)
    owners: list[str] = []
    for _ in range(3000):
        if rng.random() < 0.6:
            rid = f"r{rng.randrange(20)}"
            kv.grow(rid, rng.randint(1, 100))
            kv.allocate_slot(rid)
            owners.append(rid)
        elif owners:
            kv.free(owners.pop(rng.randrange(len(owners))))
        kv.check_invariants()
    for rid in set(owners):
        kv.free(rid)
    kv.check_invariants()
    assert kv.num_used_blocks == 0 and kv.num_used_slots == 0


def test_rejects_pools_without_room_for_the_reserved_id():
    with pytest.raises(ValueError):
        KVManager(num_blocks=1, num_slots=3, block_size=4)


def test_slots_go_lowest_first_so_the_highest_id_is_the_peak_concurrency():
    kv = KVManager(num_blocks=5, num_slots=9, block_size=4)
    for r in "abc":
        assert kv.allocate_slot(r)
    assert [kv.slot(r) for r in "abc"] == [1, 2, 3]
    kv.free("b")
    kv.free("a")
    assert kv.allocate_slot("d") and kv.slot("d") == 1  # the lowest free id, not the last freed
    assert kv.allocate_slot("e") and kv.slot("e") == 2
    assert kv.allocate_slot("f") and kv.slot("f") == 4
    kv.check_invariants()


def test_a_slot_whose_memory_cannot_be_mapped_is_not_handed_out():
    asked: list[int] = []
    mapped = {"up_to": 2}  # slots 1..2 have memory; the device has none for more

    def ready(slot: int) -> bool:
        asked.append(slot)
        return slot <= mapped["up_to"]

    kv = KVManager(num_blocks=5, num_slots=9, block_size=4, slot_ready=ready)
    assert kv.allocate_slot("a") and kv.allocate_slot("b")
    assert not kv.allocate_slot("c")  # slot 3 refused: nothing changes
    assert kv.slot("c") == 0 and kv.num_used_slots == 2 and kv.num_free_slots == 6
    kv.check_invariants()
    kv.free("a")
    assert kv.allocate_slot("c") and kv.slot("c") == 1  # a mapped slot came free
    mapped["up_to"] = 8
    assert kv.allocate_slot("d") and kv.slot("d") == 3
    assert asked == [1, 2, 3, 1, 3]
    kv.check_invariants()
