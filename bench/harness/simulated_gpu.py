"""A BERT whose forward pass takes what a GPU's would and computes next to nothing: the engine's own cost, measured.

Not imported by the bench: bench/harness/models.py copies this file into the `simgpu` model folder, whose config.json
points at it (`auto_map`), and the engine's real loader runs it as the model's own code (--trust-remote-code),
as the fault tests' model is run. Its pass sleeps `pass_seconds` plus `token_seconds` per token of the padded
batch (what the H100 run measured for MiniLM: about 4 ms a pass, 6.1 ms for 512 sentences; docs/benchmarks.md,
"GPU"), with the GIL released as a CUDA synchronisation releases it, then returns the word embeddings of the ids:
deterministic, the model's width, no transformer layers. So the engine's receive, scheduling, padding, pooling
and reply, and the API servers' work, are what a run measures, at the pace a fast accelerator sets. (On this
"device", the CPU, the engine's pooling of those states is host work a GPU would do: it stays in the figure.)
"""

from __future__ import annotations

import time
from typing import Any

import torch
from transformers import BertModel
from transformers.modeling_outputs import BaseModelOutputWithPoolingAndCrossAttentions


class SimulatedGpuBert(BertModel):  # type: ignore[no-untyped-call]
    def forward(self, input_ids: torch.Tensor | None = None, *args: Any, **kwargs: Any) -> Any:
        assert input_ids is not None
        time.sleep(self.config.pass_seconds + self.config.token_seconds * input_ids.numel())
        # One gather from the word embeddings: the least a deterministic state of the model's width can cost the host.
        return BaseModelOutputWithPoolingAndCrossAttentions(
            last_hidden_state=self.embeddings.word_embeddings(input_ids)
        )
