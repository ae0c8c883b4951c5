"""The `launch` command: flags to a Config, then the supervisor."""

from __future__ import annotations

import argparse
import os
import sys
import typing

from poolserve.config import (
    API_KEY_ENV,
    MIB,
    AcceptBalance,
    Config,
    ConfigError,
    Device,
    DType,
    LogFormat,
    LogLevel,
    Pooling,
    default_api_server_count,
)
from poolserve.logs import configure_logging
from supervisor.arbiter import Supervisor


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="launch",
        description=(
            "Serve a pooling model (embeddings, rerankers, classifiers, CLIP) over HTTP: N API-server "
            "processes share one listening socket and feed one engine-core process that owns the model "
            "and batches across all of them."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    model = parser.add_argument_group("model")
    model.add_argument(
        "--model",
        default="",
        help="Model folder (a Hugging Face layout) or hub id. Empty: the bundled all-MiniLM-L6-v2.",
    )
    model.add_argument(
        "--served-model-name",
        nargs="+",
        default=[],
        metavar="NAME",
        help="Name(s) clients use in the `model` field; the first is reported in responses. "
        "Default: --model as given, or sentence-transformers/all-MiniLM-L6-v2 for the bundled model.",
    )
    model.add_argument(
        "--max-model-len",
        type=int,
        default=0,
        help="Longest input in tokens; longer inputs get 400 unless the request asks for truncation. "
        "0: the model's own limit (Sentence-Transformers' max_seq_length when the folder has one).",
    )
    model.add_argument(
        "--pooling",
        choices=typing.get_args(Pooling),
        default="auto",
        help="How token states become one vector. auto: the folder's Sentence-Transformers Pooling config, "
        "else last-token for decoder models and mean for encoders.",
    )
    model.add_argument("--trust-remote-code", action="store_true", help="Allow model code shipped in the folder.")

    server = parser.add_argument_group("HTTP")
    server.add_argument(
        "--host",
        default="127.0.0.1",
        help="Address to listen on. Only this machine can connect by default; 0.0.0.0 or :: opens the server to "
        "the network (the ready line says so): pair it with --api-key.",
    )
    server.add_argument(
        "--port", type=int, default=8000, help="TCP port; 0 picks a free one (the ready line says which)."
    )
    server.add_argument(
        "--api-server-count",
        type=int,
        default=default_api_server_count(),
        help="API-server processes sharing the listening socket (default: half the usable cores, 1 to 8).",
    )
    server.add_argument(
        "--accept-balance",
        choices=typing.get_args(AcceptBalance),
        default="both",
        help="What the API servers compare to share connections (fair accept): a server holding more than the "
        "least-loaded one stops accepting until it is back at its share, and the next connection goes to a "
        "sibling. both: open connections plus requests in flight (measured best when a proxy's few connections "
        "carry unequal load); connections: open connections only (exactly even for many similar clients); "
        "requests: requests in flight only; none: leave it to the kernel (measured: one server took 100%% of "
        "32 keep-alive clients).",
    )
    server.add_argument(
        "--max-requests-per-connection",
        type=int,
        default=1000,
        help="A keep-alive connection closes after this many requests (that response says `Connection: close`; "
        "no request is cut), so a proxy's long-lived connections spread again over the API servers. 1000 is "
        "nginx's keepalive_requests; a reconnect every 100 or more requests cost no measurable throughput even "
        "on the cheapest endpoint (every 10: -26%%). 0: no limit.",
    )
    server.add_argument(
        "--max-connection-age",
        type=float,
        default=300.0,
        help="Seconds after which a keep-alive connection closes after its next response, so API servers added "
        "(SIGTTIN) or restarted (SIGHUP) get their share of a proxy's connections within this time, at the cost "
        "of one reconnect per connection per period. 0: no limit.",
    )
    server.add_argument(
        "--keep-alive-timeout",
        type=float,
        default=75.0,
        help="Seconds an idle keep-alive connection stays open after a response. Longer than the idle timeout "
        "of the proxy or load balancer in front (nginx upstream keepalive_timeout 60 s, AWS ALB 60 s), so the "
        "proxy, not the server, closes a connection it might be about to reuse (that race loses requests).",
    )
    server.add_argument(
        "--preprocess-workers",
        type=int,
        default=1,
        help="Threads per API server that parse and tokenize requests; 0 runs that inline on the event loop.",
    )
    server.add_argument(
        "--max-inputs-per-request",
        type=int,
        default=2048,
        help="Most inputs (texts, images, pairs, documents) one request may carry; more gets 400.",
    )
    server.add_argument(
        "--max-queued-inputs",
        type=int,
        default=4096,
        help="Admission limit for the whole server: inputs waiting or running in the engine, from every API "
        "server. A request past it gets 429 with Retry-After at once.",
    )
    server.add_argument(
        "--max-queued-tokens",
        type=int,
        default=262_144,
        help="The same limit counted in tokens (an image counts its vision tokens).",
    )
    server.add_argument(
        "--request-timeout",
        type=float,
        default=300.0,
        help="Seconds a request may take end to end before it gets 504 and the engine drops its work; 0: none.",
    )
    server.add_argument(
        "--engine-wait-timeout",
        type=float,
        default=30.0,
        help="Seconds a new request waits for an engine that is restarting before it gets 503 with Retry-After.",
    )
    server.add_argument(
        "--worker-timeout",
        type=float,
        default=30.0,
        help="A process whose heartbeat (beaten by its event loop or its scheduler loop) is silent this long is "
        "killed and replaced; /health reports a forward pass running over a third of it. 0: off.",
    )
    server.add_argument(
        "--max-tokens-per-request",
        type=int,
        default=2048 * 256,
        help="Most tokens one request may send to the model, all its inputs together (after truncation); "
        "more gets 400.",
    )
    server.add_argument(
        "--max-request-bytes",
        type=int,
        default=32 * MIB,
        help="Largest request body accepted, checked on Content-Length and while a chunked body arrives; "
        "larger gets 413. The default fits one --max-image-bytes image as a base64 data URL.",
    )
    server.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="Seconds in-flight requests get to finish after SIGTERM before the processes are stopped.",
    )

    images = parser.add_argument_group("images")
    images.add_argument(
        "--max-image-bytes",
        type=int,
        default=20 * 1024 * 1024,
        help="Largest encoded image accepted, inline or fetched; larger gets 413.",
    )
    images.add_argument(
        "--max-image-pixels",
        type=int,
        default=40_000_000,
        help="Most pixels (width x height) an image may declare; more is refused before decoding (400).",
    )
    images.add_argument(
        "--image-fetch-timeout",
        type=float,
        default=10.0,
        help="Seconds to fetch an http(s) image URL, connection to last byte.",
    )
    images.add_argument(
        "--allowed-local-media-path",
        default="",
        metavar="DIR",
        help="Folder whose files requests may name as images (file:// URLs or paths); empty: no local files.",
    )

    images.add_argument(
        "--max-images-per-request",
        type=int,
        default=32,
        help="Most images one request may carry; more gets 400 before any is fetched or decoded.",
    )
    images.add_argument(
        "--allowed-media-domains",
        nargs="+",
        default=[],
        metavar="HOST",
        help="Host names http(s) image URLs may name (each redirect too); empty: any public host.",
    )
    images.add_argument(
        "--allow-private-media-urls",
        action="store_true",
        help="Let image URLs reach loopback, private, link-local (cloud metadata) and other non-public addresses. "
        "Off: every address a URL or redirect resolves to must be public, checked on the connection made.",
    )

    access = parser.add_argument_group("access")
    access.add_argument(
        "--api-key",
        default=argparse.SUPPRESS,
        help=f"Require `Authorization: Bearer KEY` on every endpoint but /health, /ping and /metrics (401 "
        f"otherwise). Default: the {API_KEY_ENV} environment variable, which keeps the key out of `ps`; "
        "unset or empty: no key.",
    )
    access.add_argument(
        "--protect-metrics", action="store_true", help="Require the API key on /metrics too (needs --api-key)."
    )
    access.add_argument(
        "--cors-allowed-origins",
        nargs="+",
        default=[],
        metavar="ORIGIN",
        help="Origins browsers may call the API from (https://app.example.com, or * for any); empty: CORS off.",
    )

    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        dest="plugins",
        metavar="NAME",
        help="Serve the endpoint of an installed plugin (a package's `poolserve.plugins` entry point); repeatable.",
    )
    engine = parser.add_argument_group("engine")
    engine.add_argument(
        "--device", choices=typing.get_args(Device), default="auto", help="auto: CUDA when visible, else CPU."
    )
    engine.add_argument(
        "--dtype",
        choices=typing.get_args(DType),
        default="auto",
        help="Weights' precision. auto: float16 on CUDA, float32 on CPU.",
    )
    engine.add_argument(
        "--max-batch-tokens",
        type=int,
        default=0,
        help="Token budget of one forward pass, padding included. 0: 8192 on CPU, 32768 on CUDA.",
    )
    engine.add_argument(
        "--max-batch-size",
        type=int,
        default=0,
        help="Most inputs in one forward pass. 0: 32 on CPU, 256 on CUDA.",
    )
    engine.add_argument(
        "--torch-threads",
        type=int,
        default=0,
        help="torch intra-op threads in the engine; 0: torch's default.",
    )
    engine.add_argument(
        "--engine-start-timeout",
        type=float,
        default=300.0,
        help="Seconds the engine gets to load the model before start-up is abandoned.",
    )
    logs = parser.add_argument_group("logs")
    logs.add_argument("--log-level", choices=typing.get_args(LogLevel), default="info", help="Log verbosity.")
    logs.add_argument(
        "--log-format",
        choices=typing.get_args(LogFormat),
        default="text",
        help="One line per record: readable text, or one JSON object (for log shippers).",
    )
    logs.add_argument(
        "--access-log",
        action="store_true",
        help="Log one line per request: request id, method, path, status, duration, tokens.",
    )
    return parser


def parse_config(argv: list[str] | None = None) -> Config:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return Config(
            model=args.model,
            served_model_name=args.served_model_name,
            host=args.host,
            port=args.port,
            api_server_count=args.api_server_count,
            max_batch_tokens=args.max_batch_tokens,
            max_batch_size=args.max_batch_size,
            max_model_len=args.max_model_len,
            preprocess_workers=args.preprocess_workers,
            device=args.device,
            dtype=args.dtype,
            pooling=args.pooling,
            torch_threads=args.torch_threads,
            trust_remote_code=args.trust_remote_code,
            max_inputs_per_request=args.max_inputs_per_request,
            max_image_bytes=args.max_image_bytes,
            max_image_pixels=args.max_image_pixels,
            image_fetch_timeout=args.image_fetch_timeout,
            allowed_local_media_path=args.allowed_local_media_path,
            max_queued_inputs=args.max_queued_inputs,
            max_queued_tokens=args.max_queued_tokens,
            request_timeout=args.request_timeout,
            engine_wait_timeout=args.engine_wait_timeout,
            worker_timeout=args.worker_timeout,
            engine_start_timeout=args.engine_start_timeout,
            shutdown_timeout=args.shutdown_timeout,
            log_level=args.log_level,
            log_format=args.log_format,
            access_log=args.access_log,
            api_key=api_key_of(args),
            protect_metrics=args.protect_metrics,
            max_request_bytes=args.max_request_bytes,
            max_tokens_per_request=args.max_tokens_per_request,
            max_images_per_request=args.max_images_per_request,
            allowed_media_domains=args.allowed_media_domains,
            allow_private_media_urls=args.allow_private_media_urls,
            cors_allowed_origins=args.cors_allowed_origins,
            accept_balance=args.accept_balance,
            max_requests_per_connection=args.max_requests_per_connection,
            max_connection_age=args.max_connection_age,
            keep_alive_timeout=args.keep_alive_timeout,
            plugins=args.plugins,
        )
    except ConfigError as exc:
        parser.error(str(exc))


def api_key_of(args: argparse.Namespace) -> str:
    """The flag's value, else the environment's: the one place the key's environment variable is read."""
    key: str | None = getattr(args, "api_key", None)
    return key if key is not None else os.environ.get(API_KEY_ENV, "")


def main(argv: list[str] | None = None) -> None:
    config = parse_config(argv)
    configure_logging("supervisor", config.log_level, config.log_format)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    sys.exit(Supervisor(config).run())
