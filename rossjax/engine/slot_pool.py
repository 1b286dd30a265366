"""The free list of KV-cache slots: the one place a slot is handed out or given back."""

from __future__ import annotations

from collections import deque


class SlotPool:
    """Slots 0..capacity-1. A freed slot goes to the back of the line, so a slot's stale cache
    columns are reused as late as possible (and the order is the engine's, reproducibly)."""

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self._free = deque(range(self.capacity))

    @property
    def n_free(self) -> int:
        return len(self._free)

    def free_slots(self) -> list[int]:
        return list(self._free)

    def allocate(self, n: int) -> list[int] | None:
        """n slots, all or none (a request's candidates start together): None when fewer are free."""
        if n > len(self._free):
            return None
        return [self._free.popleft() for _ in range(n)]

    def free(self, slots) -> None:
        for s in slots:
            if not 0 <= s < self.capacity or s in self._free:
                raise ValueError(f"slot pool: slot {s} is not an allocated slot of this pool.")
            self._free.append(s)

    def take(self, slot: int) -> None:
        """Allocate this free slot (a prefix cache hit reuses the slot holding the prefix)."""
        self._free.remove(slot)
