"""What every API server holds (open connections, requests in flight), in memory all of them read; which
engines are out of service.

The supervisor creates the board (an anonymous memfd: nothing on disk, gone with the last
process that maps it) and hands each API-server process a slot of its own: the process writes
only its slot and reads everyone's, so the fair-accept gate (apiserver/connection/fair_accept.py) can see
in a microsecond what its siblings hold. The supervisor claims a slot when it spawns a process
and clears it when it reaps one, so a dead server's count never stays behind.

Each slot is eight aligned 64-bit words on its own cache line; an aligned 8-byte store is atomic
on every platform CPython runs on, so readers see old or new values, never a torn one. Nothing
here needs the words to agree with each other: the gate tolerates a view a few microseconds old.
"""

from __future__ import annotations

import mmap
import os
import time
from dataclasses import dataclass
from enum import IntEnum

WORDS_PER_SLOT = 8
SLOT_BYTES = WORDS_PER_SLOT * 8
# Room for every process a supervisor may run at once: up to 256 serving (--api-server-count's
# bound), their replacements during a rolling restart, and those still draining.
SLOT_COUNT = 1024
# Slot 0 is the header: its word 0 is one past the highest slot ever claimed, so readers scan
# only that far; its word 1 has a bit set for each engine the supervisor took out of service (a
# crash loop), so the API servers stop keeping that engine's suspects for its restart.
HEADER_SLOT = 0
HEADER_ENGINES_OUT = 1


class Word(IntEnum):
    PID = 0
    STATE = 1
    CONNECTIONS = 2
    IN_FLIGHT = 3
    # CLOCK_MONOTONIC in ns when the process's event loop last wrote here: readers skip a
    # sibling whose loop has been stuck (it cannot accept, so deferring to it would stall).
    BEAT_NS = 4
    # Connections this process has taken off the shared queue, ever (served or refused): a paused
    # server watching a queue that stays non-empty tells siblings draining it from siblings stuck.
    ACCEPTED = 5


class SlotState(IntEnum):
    FREE = 0
    BOOTING = 1
    ACCEPTING = 2
    DRAINING = 3


@dataclass(frozen=True, slots=True)
class SiblingLoad:
    slot: int
    connections: int
    in_flight: int


class LoadBoard:
    """The shared table. `create` in the supervisor, `attach` in an API server (by inherited fd)."""

    def __init__(self, fd: int, memory: mmap.mmap):
        self.fd = fd
        self._memory = memory
        self._words = memoryview(memory).cast("q")

    @classmethod
    def create(cls) -> LoadBoard:
        fd = os.memfd_create("poolserve-load-board", 0)  # no MFD_CLOEXEC: children inherit it via pass_fds
        try:
            os.ftruncate(fd, SLOT_COUNT * SLOT_BYTES)
            memory = mmap.mmap(fd, SLOT_COUNT * SLOT_BYTES)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, memory)

    @classmethod
    def attach(cls, fd: int) -> LoadBoard:
        return cls(fd, mmap.mmap(fd, SLOT_COUNT * SLOT_BYTES))

    def close(self) -> None:
        self._words.release()
        self._memory.close()
        os.close(self.fd)

    # The supervisor's side ---------------------------------------------------------------------

    def claim_slot(self, pid: int = 0) -> int:
        """The lowest free slot, marked booting (not counted by the gate until it accepts)."""
        for slot in range(1, SLOT_COUNT):
            if self.read(slot, Word.STATE) == SlotState.FREE:
                self._clear(slot)
                self.write(slot, Word.PID, pid)
                self.write(slot, Word.STATE, SlotState.BOOTING)
                if slot >= self.slots_in_use:
                    self._words[HEADER_SLOT * WORDS_PER_SLOT] = slot + 1
                return slot
        raise RuntimeError(f"all {SLOT_COUNT - 1} API-server slots of the load board are taken")

    def set_pid(self, slot: int, pid: int) -> None:
        self.write(slot, Word.PID, pid)

    def release_slot(self, slot: int) -> None:
        """The process is gone: its connections and requests are no longer anyone's load."""
        self.write(slot, Word.STATE, SlotState.FREE)
        self._clear(slot)

    def set_engine_out_of_service(self, index: int, is_out: bool) -> None:
        """The supervisor alone writes this word."""
        position = HEADER_SLOT * WORDS_PER_SLOT + HEADER_ENGINES_OUT
        bits = int(self._words[position])
        self._words[position] = bits | (1 << index) if is_out else bits & ~(1 << index)

    def _clear(self, slot: int) -> None:
        for word in range(WORDS_PER_SLOT):
            if word != Word.STATE:
                self._words[slot * WORDS_PER_SLOT + word] = 0

    # Everyone's side ---------------------------------------------------------------------------

    @property
    def slots_in_use(self) -> int:
        return int(self._words[HEADER_SLOT * WORDS_PER_SLOT])

    def is_engine_out_of_service(self, index: int) -> bool:
        return bool(self._words[HEADER_SLOT * WORDS_PER_SLOT + HEADER_ENGINES_OUT] >> index & 1)

    def read(self, slot: int, word: Word) -> int:
        return int(self._words[slot * WORDS_PER_SLOT + word])

    def write(self, slot: int, word: Word, value: int) -> None:
        self._words[slot * WORDS_PER_SLOT + word] = value

    def accepted_total(self) -> int:
        """Connections every server has taken off the shared queue; it grows while anyone accepts."""
        words = self._words
        return sum(int(words[slot * WORDS_PER_SLOT + Word.ACCEPTED]) for slot in range(1, self.slots_in_use))

    def accepting_siblings(self, own_slot: int, stale_after_ns: int) -> list[SiblingLoad]:
        """Every other server that accepts now and whose event loop wrote recently."""
        words = self._words
        now = time.monotonic_ns()
        siblings = []
        for slot in range(1, self.slots_in_use):
            base = slot * WORDS_PER_SLOT
            if (
                slot != own_slot
                and words[base + Word.STATE] == SlotState.ACCEPTING
                and now - words[base + Word.BEAT_NS] < stale_after_ns
            ):
                siblings.append(SiblingLoad(slot, words[base + Word.CONNECTIONS], words[base + Word.IN_FLIGHT]))
        return siblings
