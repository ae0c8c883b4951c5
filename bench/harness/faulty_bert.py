"""A BERT whose forward pass crashes or hangs on a marker token: the fault tests' poison pill and hung engine.

Not imported by the tests or the bench: bench/harness/models.py (`build_faulty`, the `faulty` model) copies this
file into a tiny model folder whose config.json points at it (`auto_map`), and the engine's real loader runs it as
the model's own code (--trust-remote-code), so the product carries no fault injection of its own. The marker ids are
`crash_token_id` and `hang_token_id` in that config.json.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import torch
from transformers import BertModel


class FaultyBertModel(BertModel):  # type: ignore[no-untyped-call]
    def forward(self, input_ids: torch.Tensor | None = None, *args: Any, **kwargs: Any) -> Any:
        if input_ids is not None:
            if bool((input_ids == self.config.crash_token_id).any()):
                # What a segfault in a kernel looks like from outside: the process dies on a signal.
                os.kill(os.getpid(), signal.SIGSEGV)
            if bool((input_ids == self.config.hang_token_id).any()):
                # A forward pass that never returns; the supervisor kills the engine long before.
                time.sleep(3600)
        return super().forward(input_ids, *args, **kwargs)
