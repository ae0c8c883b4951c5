"""The one typed configuration, built once by the CLI and handed to every process."""

from __future__ import annotations

import importlib.metadata
import ipaddress
import os
import urllib.parse
from typing import Literal

import msgspec

BUNDLED_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"

Device = Literal["auto", "cpu", "cuda"]
DType = Literal["auto", "float32", "float16", "bfloat16"]
Pooling = Literal["auto", "mean", "cls", "last"]
LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["text", "json"]
AcceptBalance = Literal["connections", "requests", "both", "none"]

# The one environment variable that carries a setting (read by the CLI, as --api-key's default):
# a key in the environment stays out of `ps`, where a command-line flag would be readable by anyone.
API_KEY_ENV = "POOLSERVE_API_KEY"

MIB = 1024 * 1024

# The entry-point group under which installed packages offer endpoints (apiserver/plugins.py).
PLUGIN_GROUP = "poolserve.plugins"


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
    max_image_bytes: int = 20 * MIB
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
    # Access and hostile input (docs/security.md).
    api_key: str = ""
    protect_metrics: bool = False
    # Room for one --max-image-bytes image as a base64 data URL (4/3 of its bytes) and the JSON around it.
    max_request_bytes: int = 32 * MIB
    # A full request of the bundled model (2048 inputs of 256 tokens); a long-context model gets no more.
    max_tokens_per_request: int = 2048 * 256
    max_images_per_request: int = 32
    allowed_media_domains: list[str] = msgspec.field(default_factory=list)
    allow_private_media_urls: bool = False
    cors_allowed_origins: list[str] = msgspec.field(default_factory=list)
    # Spreading connections over the API servers (docs/operations.md, "How connections are spread").
    accept_balance: AcceptBalance = "both"
    max_requests_per_connection: int = 1000
    max_connection_age: float = 300.0
    keep_alive_timeout: float = 75.0
    # Entry-point names of installed plugins whose endpoints to serve (docs/api.md, "Plugins").
    plugins: list[str] = msgspec.field(default_factory=list)

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
        check_range("--max-request-bytes", self.max_request_bytes, 1024, 1 << 34)
        check_range("--max-tokens-per-request", self.max_tokens_per_request, 1, 1 << 30)
        check_range("--max-images-per-request", self.max_images_per_request, 0, 1 << 16)
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
        check_range("--max-requests-per-connection", self.max_requests_per_connection, 0, 1 << 40)
        if self.max_connection_age < 0:
            raise ConfigError(f"--max-connection-age has value {self.max_connection_age!r}; it must be >= 0 (0: none).")
        if self.keep_alive_timeout <= 0:
            raise ConfigError(f"--keep-alive-timeout has value {self.keep_alive_timeout!r}; it must be > 0.")
        if self.shutdown_timeout < 0:
            raise ConfigError(f"--shutdown-timeout has value {self.shutdown_timeout!r}; it must be >= 0.")
        if not self.host:
            raise ConfigError("--host is empty; give an address such as 127.0.0.1.")
        for name in self.served_model_name:
            if not name.strip():
                raise ConfigError("--served-model-name has an empty name.")
        check_api_key(self.api_key)
        if self.protect_metrics and not self.api_key:
            raise ConfigError(f"--protect-metrics needs an API key (--api-key or {API_KEY_ENV}).")
        for domain in self.allowed_media_domains:
            if not is_hostname(domain):
                raise ConfigError(f"--allowed-media-domains has value {domain!r}; give host names such as example.com.")
        check_plugins(self.plugins)
        for origin in self.cors_allowed_origins:
            if not is_origin(origin):
                raise ConfigError(
                    f"--cors-allowed-origins has value {origin!r}; give origins such as https://app.example.com, or *."
                )

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
        """Whether other machines may reach the HTTP socket: any address but a loopback one."""
        if self.host == "localhost":
            return False
        try:
            return not ipaddress.ip_address(self.host).is_loopback
        except ValueError:  # a host name: it may resolve to anything
            return True


def check_range(flag: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ConfigError(f"{flag} has value {value!r}; it must be between {low} and {high}.")


def check_plugins(names: list[str]) -> None:
    """Every name is an installed plugin: a typo fails at start-up, not as a missing endpoint later."""
    if not names:
        return
    installed = sorted({entry.name for entry in importlib.metadata.entry_points(group=PLUGIN_GROUP)})
    for name in names:
        if name not in installed:
            listed = ", ".join(installed) if installed else "none"
            raise ConfigError(f"--plugin has value {name!r}, which is not an installed plugin; installed: {listed}.")


def check_api_key(key: str) -> None:
    """A key travels in an HTTP header: printable ASCII without spaces. The message never shows the key."""
    if key and not all(33 <= ord(c) < 127 for c in key):
        raise ConfigError("--api-key must be printable ASCII without spaces (it travels in an HTTP header).")


def is_hostname(value: str) -> bool:
    labels = value.rstrip(".").split(".")
    return bool(value) and all(label and len(label) <= 63 and label.replace("-", "").isalnum() for label in labels)


def is_origin(value: str) -> bool:
    """`*`, or scheme://host[:port] as a browser sends it in `Origin` (no path, no trailing slash)."""
    if value == "*":
        return True
    parts = urllib.parse.urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.netloc) and value == f"{parts.scheme}://{parts.netloc}"
