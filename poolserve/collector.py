"""Python's cyclic garbage collector, set for a server process once its start-up is done (an API server, an engine).

What start-up built (modules, the model, the app) lives as long as the process, and a full collection walks every
tracked object: ~60,000 in an API server (~10 ms), ~392,000 in an engine with torch and a model (200-270 ms, the GIL
held). So it is collected once, then frozen: moved out of the collector's reach.

Requests leave no reference cycles (tests/in_process/test_reference_cycles.py): their objects go by reference
counting, and the collector has nothing to find in them. It still ran, though, because the youngest generation is
collected whenever allocations outnumber frees by its threshold, 700 by default: with a few hundred requests in
flight, an API server under 256 clients ran ~130 young and ~12 middle collections a second (their objects, alive,
are walked and promoted), ~1.4 s of every 26 s. At YOUNG_THRESHOLD the net count of a server at a steady load
seldom gets there; garbage that does form cycles still adds to it until a collection runs, at most that many
objects later (docs/benchmarks.md, "The API server, step 7")."""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000


def settle() -> None:
    """Collect start-up's garbage, freeze what is left, and raise the youngest generation's threshold."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)
