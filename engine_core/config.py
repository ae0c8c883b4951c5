"""The one typed configuration, built once by the CLI and handed to every process."""

from __future__ import annotations

import os
from typing import Literal

import msgspec

BUNDLED_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"

Device = Literal["auto", "cpu", "cuda"]
DType = Literal["auto", "float32", "float16", "bfloat16"]
Pooling = Literal["auto", "mean", "cls", "last"]
LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["text", "json"]


class ConfigError(ValueError):
    """A configuration value that cannot work; the message names the flag and the value."""


def default_api_server_count() -> int:
    """Half the usable cores (the engine and the kernel need the rest), at least 1, at most 8."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(8, cores // 2))


class Config(msgspec.Struct, kw_only=True, frozen=True):
    """Every setting of a poolserve instance. Cheap to build and to validate; nothing is loaded here."""

    model: str = ""
    served_model_name: list[str] = msgspec.field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = 8000
    api_server_count: int = 1
    max_batch_tokens: int = 0
    max_batch_size: int = 0
    max_model_len: int = 0
    preprocess_workers: int = 1
    device: Device = "auto"
    dtype: DType = "auto"
    pooling: Pooling = "auto"
    torch_threads: int = 0
    trust_remote_code: bool = False
    max_inputs_per_request: int = 2048
    max_image_bytes: int = 20 * 1024 * 1024
    max_image_pixels: int = 40_000_000
    image_fetch_timeout: float = 10.0
    allowed_local_media_path: str = ""
    max_queued_inputs: int = 4096
    max_queued_tokens: int = 262_144
    request_timeout: float = 300.0
    engine_wait_timeout: float = 30.0
    worker_timeout: float = 30.0
    engine_start_timeout: float = 300.0
    shutdown_timeout: float = 30.0
    log_level: LogLevel = "info"
    log_format: LogFormat = "text"
    access_log: bool = False

    def __post_init__(self) -> None:
        check_range("--port", self.port, 0, 65535)
        check_range("--api-server-count", self.api_server_count, 1, 256)
        check_range("--max-batch-tokens", self.max_batch_tokens, 0, 1 << 24)
        check_range("--max-batch-size", self.max_batch_size, 0, 1 << 16)
        check_range("--max-model-len", self.max_model_len, 0, 1 << 20)
        check_range("--preprocess-workers", self.preprocess_workers, 0, 64)
        check_range("--torch-threads", self.torch_threads, 0, 1024)
        check_range("--max-inputs-per-request", self.max_inputs_per_request, 1, 1 << 20)
        check_range("--max-image-bytes", self.max_image_bytes, 1, 1 << 34)
        check_range("--max-image-pixels", self.max_image_pixels, 1, 1 << 34)
        if self.image_fetch_timeout <= 0:
            raise ConfigError(f"--image-fetch-timeout has value {self.image_fetch_timeout!r}; it must be > 0.")
        check_range("--max-queued-inputs", self.max_queued_inputs, 1, 1 << 30)
        check_range("--max-queued-tokens", self.max_queued_tokens, 1, 1 << 40)
        for flag, seconds in (
            ("--request-timeout", self.request_timeout),
            ("--engine-wait-timeout", self.engine_wait_timeout),
            ("--worker-timeout", self.worker_timeout),
        ):
            if seconds < 0:
                raise ConfigError(f"{flag} has value {seconds!r}; it must be >= 0.")
        if self.worker_timeout and self.worker_timeout < 1:
            raise ConfigError(f"--worker-timeout has value {self.worker_timeout!r}; use 0 (off) or >= 1.")
        if self.engine_start_timeout <= 0:
            raise ConfigError(f"--engine-start-timeout has value {self.engine_start_timeout!r}; it must be > 0.")
        if self.shutdown_timeout < 0:
            raise ConfigError(f"--shutdown-timeout has value {self.shutdown_timeout!r}; it must be >= 0.")
        if not self.host:
            raise ConfigError("--host is empty; give an address such as 127.0.0.1.")
        for name in self.served_model_name:
            if not name.strip():
                raise ConfigError("--served-model-name has an empty name.")

    @property
    def is_bundled_model(self) -> bool:
        return not self.model

    @property
    def model_names(self) -> list[str]:
        """Names a request's `model` field may use; the first is the one responses carry."""
        if self.served_model_name:
            return list(self.served_model_name)
        return [self.model or BUNDLED_MODEL_NAME]

    @property
    def binds_beyond_loopback(self) -> bool:
        return self.host not in ("127.0.0.1", "::1", "localhost")


def check_range(flag: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ConfigError(f"{flag} has value {value!r}; it must be between {low} and {high}.")
