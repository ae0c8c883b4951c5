"""Which loader a model folder takes: a StaticEmbedding (no transformer), a Router's chains side by side
(engine_core/router.py), or one transformer and its heads (engine_core/loader.py, which the other two build on)."""

from __future__ import annotations

import torch
import transformers

from engine_core.folder_choices import LoadError, check_long_input_overlap, read_folder
from engine_core.loader import LoadedModel, load_folder, load_static_model, resolve_model_folder, select_device
from engine_core.router import load_router_model
from poolserve.config import Config


def load_model(config: Config) -> LoadedModel:
    transformers.utils.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    folder = resolve_model_folder(config.model, config.revision)
    device = select_device(config.device_kind)
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    if device.type == "cuda":
        # torch's cuDNN attention (its first choice on Hopper in half precision) builds a graph for
        # every new (batch, length) shape: 50 ms each on an H100, against 10 ms without it, and a
        # server sees new shapes all the time (bench/device/sdpa_trial.py; docs/benchmarks.md, "GPU").
        torch.backends.cuda.enable_cudnn_sdp(False)
    st = read_folder(folder)
    if st.static_folder is not None or st.router is not None:
        what = "a static embedding" if st.static_folder is not None else "a Router"
        if config.dtype == "int8":
            raise LoadError(f"--dtype int8 serves a single transformer encoder; {folder} holds {what} model.")
        if config.runtime not in ("torch", "auto"):
            raise LoadError(
                f"--runtime {config.runtime} serves a single transformer encoder; {folder} holds {what} model."
            )
    if st.static_folder is not None:
        loaded = load_static_model(config, folder, st, device)
    elif st.router is not None:
        loaded = load_router_model(config, folder, st, device)
    else:
        loaded = load_folder(config, folder, st, device)
    check_long_input_overlap(config, loaded.card)
    return loaded
