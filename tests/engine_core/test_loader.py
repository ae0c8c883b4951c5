from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest

from engine_core.loader import measure_batch_overhead


class TimedRunner:
    """Takes `overhead` seconds per forward pass plus `per_token` per token: a known cost model."""

    def __init__(self, overhead: float, per_token: float):
        self.overhead, self.per_token = overhead, per_token

    def run_texts(self, rows: Sequence[npt.NDArray[np.int32]], type_rows: object) -> npt.NDArray[np.float32]:
        time.sleep(self.overhead + self.per_token * sum(len(row) for row in rows))
        return np.zeros((len(rows), 4), dtype=np.float32)

    def run_images(self, pixels: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
        raise TypeError


def test_the_measured_overhead_is_the_forward_pass_cost_in_tokens() -> None:
    runner = TimedRunner(overhead=0.004, per_token=0.00002)  # a pass costs as much as 200 tokens
    overhead = measure_batch_overhead(runner, np.arange(10, dtype=np.int32), max_model_len=256)
    assert overhead == pytest.approx(200, rel=0.25)
