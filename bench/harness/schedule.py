"""Arrival schedules for the open loop: Poisson arrivals at a rate, seeded so runs repeat."""

from __future__ import annotations

import random


def poisson_arrivals(rate: float, duration: float, seed: int, limit: int = 0) -> list[float]:
    """Offsets in seconds from the start of the run at which requests are due.

    Inter-arrival gaps are exponential with mean 1/rate (a Poisson process), cut at `duration`
    or after `limit` arrivals (0: no limit). The same seed gives the same schedule, so two
    servers can be offered exactly the same load.
    """
    if rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    rng = random.Random(seed)
    arrivals: list[float] = []
    at = rng.expovariate(rate)
    while at < duration and (not limit or len(arrivals) < limit):
        arrivals.append(at)
        at += rng.expovariate(rate)
    return arrivals
