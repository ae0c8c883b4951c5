"""The one typed configuration, built once by the CLI and handed to every process."""

from __future__ import annotations

import importlib.metadata
import ipaddress
import os
import resource
import urllib.parse
from dataclasses import dataclass
from typing import Annotated, Literal

import msgspec

from poolserve.model_card import LongInput
from poolserve.protocol import PRIORITY_MIN

BUNDLED_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"

# --device: auto, cpu, cuda, or cuda:I[,J...] (GPU indexes; Config.device_kind and Config.gpu_indexes read it).
DeviceKind = Literal["auto", "cpu", "cuda"]
DEVICE_KINDS: tuple[DeviceKind, ...] = ("auto", "cpu", "cuda")
DType = Literal["auto", "float32", "float16", "bfloat16", "int8"]
TokenPacking = Literal["auto", "on", "off"]
Runtime = Literal["auto", "torch", "onnxruntime", "hybrid"]
Pooling = Literal["auto", "mean", "cls", "last"]
ScoreFormat = Literal["none", "mxbai-rerank-v2", "bge-reranker-v2-gemma"]
LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["text", "json"]
AcceptBalance = Literal["connections", "requests", "both", "none"]
# OpenTelemetry's sampler names (OTEL_TRACES_SAMPLER), those the SDK builds without a plugin.
TraceSampler = Literal[
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
    "always_on",
    "always_off",
    "traceidratio",
]

# The one environment variable that carries a setting (read by the CLI, as --api-key's default):
# a key in the environment stays out of `ps`, where a command-line flag would be readable by anyone.
API_KEY_ENV = "POOLSERVE_API_KEY"

MIB = 1024 * 1024

# File descriptors an API server keeps for itself beyond its connections: about 35 at rest (engine
# and supervisor sockets, metric files, the listening socket), plus image fetches in flight and
# refused connections lingering (apiserver/connection/refusal.py).
FDS_RESERVED_PER_SERVER = 128

# The entry-point group under which installed packages offer endpoints (apiserver/plugins.py).
PLUGIN_GROUP = "poolserve.plugins"


class ConfigError(ValueError):
    """A configuration value that cannot work; the message names the flag and the value."""


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, which containers and taskset narrow)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_api_server_count() -> int:
    """Half the usable cores (the engine and the kernel need the rest), at least 1, at most 8."""
    return max(1, min(8, usable_cores() // 2))


FlagGroup = Literal["model", "HTTP", "images", "access", "engine", "logs", "tracing"]


@dataclass(frozen=True)
class Flag:
    """How a Config field shows in `launch --help`: its section, its help, and what argparse cannot
    infer from the field's type. The flag is the field's name with dashes (`max_batch_size` is
    `--max-batch-size`), its default is the field's default, a Literal's values are its choices, a
    list takes one or more values (or, with `repeated_as`, one value per repeated flag) and a bool
    is a switch."""

    group: FlagGroup
    help: str
    metavar: str | None = None
    # An environment variable that gives the default when the flag is absent, read by the CLI only.
    env: str | None = None
    # A secret (the API key): one set but empty is refused rather than read as unset (config_flags.flag_value).
    is_secret: bool = False
    # A list given one value per flag (`--plugin a --plugin b`), under this singular name instead of
    # the field's.
    repeated_as: str | None = None
    # A setting each model of several may have its own of (a `[[models]]` table of --config sets it; on the
    # command line it is every model's): the model's own flags, and the engine's that shape its processes.
    per_model: bool = False

    @property
    def is_per_model(self) -> bool:
        return self.per_model or self.group == "model"


class Config(msgspec.Struct, kw_only=True, frozen=True):
    """Every setting of a poolserve instance. Cheap to build and to validate; nothing is loaded here.

    Each field is one `launch` flag (its name with dashes); its `Flag` carries the help, and its
    default is the flag's default, so both are written here once.
    """

    model: Annotated[
        str,
        Flag(
            "model",
            "Model folder (a Hugging Face layout) or hub id. Not given, or empty: the bundled all-MiniLM-L6-v2. "
            "Repeat it to serve several models, each with its own engines, as NAME=PATH (NAME: what requests put in "
            "`model`; an empty PATH: the bundled model); the first is the default, which routes without a `model` "
            "field (TEI's) use. The other flags apply to every model; --config gives each its own.",
            metavar="[NAME=]PATH",
        ),
    ] = ""
    revision: Annotated[
        str,
        Flag(
            "model",
            "Branch, tag or commit of a hub id --model (from the local Hugging Face cache when offline). "
            "Empty: main. A model folder takes none.",
        ),
    ] = ""
    served_model_name: Annotated[
        list[str],
        Flag(
            "model",
            "Name(s) clients use in the `model` field; the first is reported in responses. "
            "Default: --model as given, or sentence-transformers/all-MiniLM-L6-v2 for the bundled model. "
            "One model only (several take NAME=PATH, or --config).",
            metavar="NAME",
        ),
    ] = msgspec.field(default_factory=list)
    config: Annotated[
        str,
        Flag(
            "model",
            "A TOML file declaring the models to serve, one [[models]] table each: `model` (the folder; absent: the "
            "bundled model), `served_model_name` (a list), and any of the per-model flags by their field name "
            "(engine_count, dtype, max_batch_size, max_batch_tokens, device, torch_threads, token_packing, runtime, "
            "onnx_cache_dir, and the model flags); unset keys take the command line's values. The first table is the "
            "default model unless --default-model names another. Not with --model (docs/operations.md, 'Several "
            "models').",
            metavar="FILE",
        ),
    ] = ""
    default_model: Annotated[
        str,
        Flag(
            "model",
            "With several models, the one that answers requests naming none, and TEI's routes (they have no `model` "
            "field): one of its names. Empty: the first declared. It is listed first (/v1/models, /info, the ready "
            "line) and its engines are numbered first.",
            metavar="NAME",
        ),
    ] = ""
    max_model_len: Annotated[
        int,
        Flag(
            "model",
            "Longest input in tokens; longer inputs get 400 unless the request asks for truncation. "
            "0: the model's own limit (Sentence-Transformers' max_seq_length when the folder has one).",
        ),
    ] = 0
    pooling: Annotated[
        Pooling,
        Flag(
            "model",
            "How token states become one vector. auto: the folder's Sentence-Transformers Pooling config, "
            "else last-token for decoder models and mean for encoders (a SPLADE model takes only auto; a "
            "late-interaction model pools nothing: its vectors are per token).",
        ),
    ] = "auto"
    trust_remote_code: Annotated[bool, Flag("model", "Allow model code shipped in the folder.")] = False
    default_prompt_name: Annotated[
        str,
        Flag(
            "model",
            "The prompt (a name in the folder's config_sentence_transformers.json `prompts`) put before every text "
            "that names none, instead of the folder's own default_prompt_name (TEI's flag).",
            metavar="NAME",
        ),
    ] = ""
    default_prompt: Annotated[
        str,
        Flag(
            "model",
            "A prompt text put before every text that names no prompt, instead of the folder's default "
            "(TEI's flag; not with --default-prompt-name).",
            metavar="TEXT",
        ),
    ] = ""

    score_tokens: Annotated[
        list[str],
        Flag(
            "model",
            "Serve a causal language model as a reranker scored from its logits at the last token: the token that "
            "means relevant, then optionally the one that means not (Qwen3-Reranker: yes no; bge-reranker-v2-gemma: "
            "Yes), as the tokenizer's vocabulary spells them. The score is logit(first) - logit(second), or "
            "logit(first) alone. For folders without a Sentence-Transformers LogitScore module.",
            metavar="TOKEN",
        ),
    ] = msgspec.field(default_factory=list)
    score_template: Annotated[
        str,
        Flag(
            "model",
            "A Jinja chat template file that renders a query/document pair for a reranker (the messages' roles are "
            "'query' and 'document', and 'system' for a request's instruction), used instead of the folder's own "
            "chat template.",
            metavar="FILE",
        ),
    ] = ""

    score_format: Annotated[
        ScoreFormat,
        Flag(
            "model",
            "Serve a causal language model as a reranker exactly as its own package reads and scores a pair, which a "
            "chat template cannot say (each part tokenized and cut apart): mxbai-rerank-v2 (the mxbai-rerank "
            "package's MxbaiRerankV2: logit('1') - logit('0'), a request's instruction in its prompt) or "
            "bge-reranker-v2-gemma (FlagEmbedding's FlagLLMReranker: the 'Yes' logit). Not with --score-tokens or "
            "--score-template.",
        ),
    ] = "none"

    host: Annotated[
        str,
        Flag(
            "HTTP",
            "Address to listen on. Only this machine can connect by default; 0.0.0.0 or :: opens the server to "
            "the network (the ready line says so): pair it with --api-key.",
        ),
    ] = "127.0.0.1"
    port: Annotated[int, Flag("HTTP", "TCP port; 0 picks a free one (the ready line says which).")] = 8000
    api_server_count: Annotated[
        int,
        Flag(
            "HTTP",
            "API-server processes sharing the listening socket (default: half the usable cores, 1 to 8).",
        ),
    ] = msgspec.field(default_factory=default_api_server_count)
    max_api_server_count: Annotated[
        int,
        Flag(
            "HTTP",
            "The most API servers SIGTTIN may scale up to; more are refused with a warning. 0: twice the usable "
            "cores, or --api-server-count when that is more.",
        ),
    ] = 0
    # Spreading connections over the API servers (docs/operations.md, "How connections are spread").
    accept_balance: Annotated[
        AcceptBalance,
        Flag(
            "HTTP",
            "What the API servers compare to share connections (fair accept): a server holding more than the "
            "least-loaded one stops accepting until it is back at its share, and the next connection goes to a "
            "sibling. both: open connections plus requests in flight (measured best when a proxy's few "
            "connections carry unequal load); connections: open connections only (exactly even for many similar "
            "clients); requests: requests in flight only; none: leave it to the kernel (measured: one server "
            "took 100% of 32 keep-alive clients).",
        ),
    ] = "both"
    max_requests_per_connection: Annotated[
        int,
        Flag(
            "HTTP",
            "A keep-alive connection closes after this many requests (that response says `Connection: close`; "
            "no request is cut), so a proxy's long-lived connections spread again over the API servers. 1000 is "
            "nginx's keepalive_requests; a reconnect every 100 or more requests cost no measurable throughput "
            "even on the cheapest endpoint (every 10: -26%). 0: no limit.",
        ),
    ] = 1000
    max_connection_age: Annotated[
        float,
        Flag(
            "HTTP",
            "Seconds after which a keep-alive connection closes after its next response, so API servers added "
            "(SIGTTIN) or restarted (SIGHUP) get their share of a proxy's connections within this time, at the "
            "cost of one reconnect per connection per period. 0: no limit.",
        ),
    ] = 300.0
    keep_alive_timeout: Annotated[
        float,
        Flag(
            "HTTP",
            "Seconds an idle keep-alive connection stays open after a response. Longer than the idle timeout "
            "of the proxy or load balancer in front (nginx upstream keepalive_timeout 60 s, AWS ALB 60 s), so "
            "the proxy, not the server, closes a connection it might be about to reuse (that race loses "
            "requests).",
        ),
    ] = 75.0
    # Slow clients (docs/security.md, "Slow and surplus connections"); the clock is
    # apiserver/connection/read_timeouts.py.
    header_timeout: Annotated[
        float,
        Flag(
            "HTTP",
            "Seconds a connection gets to send a request's line and headers, counted from its start (or from "
            "the first byte of a later request on it); then it is closed, with 408 if it sent part of a head. "
            "nginx's client_header_timeout. 0: none.",
        ),
    ] = 60.0
    body_timeout: Annotated[
        float,
        Flag(
            "HTTP",
            "Longest gap in seconds between two reads of a request body (not the whole upload), counted only "
            "while the server reads it; then 408 and the connection closes. nginx's client_body_timeout. 0: none.",
        ),
    ] = 60.0
    send_timeout: Annotated[
        float,
        Flag(
            "HTTP",
            "Longest time in seconds an answer may wait for the client to read it (the socket's buffers full, no "
            "progress); then the connection is dropped and the answer's memory freed. nginx's send_timeout. 0: none.",
        ),
    ] = 60.0
    max_connections_per_server: Annotated[
        int,
        Flag(
            "HTTP",
            "Open connections one API server holds; past it new connections go to its siblings, and when all are "
            "full they get 503 with Retry-After. Each connection holds a file descriptor: 512 is half the common "
            "default `ulimit -n` of 1024, the other half left for what the server opens itself (engine sockets, "
            "metric files, image fetches) and for the 503s. At most `ulimit -n` less "
            f"{FDS_RESERVED_PER_SERVER} (checked at start): raise both together.",
        ),
    ] = 512
    max_connections_per_client: Annotated[
        int,
        Flag(
            "HTTP",
            "Open connections one client address may hold on one API server; past it that address's new connections "
            "get 503 too_many_connections, so one client cannot hold every slot (nginx's limit_conn). 0: a quarter of "
            "--max-connections-per-server. Proxies trusted with FORWARDED_ALLOW_IPS (uvicorn's setting; loopback "
            "by default) carry many clients and are not counted: limit clients behind a proxy at the proxy.",
        ),
    ] = 0
    plugins: Annotated[
        list[str],
        Flag(
            "HTTP",
            "Serve the endpoint of an installed plugin (a package's `poolserve.plugins` entry point); repeatable "
            '(docs/api.md, "Plugins").',
            metavar="NAME",
            repeated_as="plugin",
        ),
    ] = msgspec.field(default_factory=list)
    preprocess_workers: Annotated[
        int,
        Flag(
            "HTTP",
            "Threads per API server that parse and tokenize requests; 0 runs that inline on the event loop.",
        ),
    ] = 1
    max_inputs_per_request: Annotated[
        int,
        Flag("HTTP", "Most inputs (texts, images, pairs, documents) one request may carry; more gets 400."),
    ] = 2048
    max_queued_inputs: Annotated[
        int,
        Flag(
            "HTTP",
            "Admission limit of a model's engines: inputs waiting or running in them, from every API server "
            "(with --engine-count M each engine holds 1/M and a refused request tries the others). A request "
            "past it gets 429 with Retry-After at once. With several models each has its own (--config sets it "
            "per model), so a flood on one never fills another's.",
            per_model=True,
        ),
    ] = 4096
    max_queued_tokens: Annotated[
        int,
        Flag("HTTP", "The same limit counted in tokens (an image counts its vision tokens).", per_model=True),
    ] = 262_144
    min_priority: Annotated[
        int,
        Flag(
            "engine",
            "The most urgent `priority` a request may ask for (lower is served sooner, default 0); a lower one "
            "gets 400. 0 lets no client jump the queue (docs/api.md, 'Priority').",
            per_model=True,
        ),
    ] = -100
    priority_max_wait: Annotated[
        float,
        Flag(
            "engine",
            "Seconds a request may wait behind more urgent work: past it, it goes ahead of every request that "
            "has waited less, whatever their priority, so no priority can starve others.",
            per_model=True,
        ),
    ] = 10.0
    cache_bytes: Annotated[
        int,
        Flag(
            "engine",
            "Bytes of the engine's exact-match cache of pooled rows, shared by every API server: an input "
            "whose token ids (or image pixels) were computed before skips the forward pass. Least recently "
            "used rows go first; 0 (default): no cache. A MiniLM row takes about 1.7 KB: 64 MiB holds about "
            "40000 inputs. Off by default because load tests and benchmarks repeat small corpora: with a "
            "cache they measure it, not the model (docs/operations.md, 'Embedding cache'). Each model's "
            "engines have their own.",
            per_model=True,
        ),
    ] = 0
    cache_hits_header: Annotated[
        bool,
        Flag(
            "engine",
            "Send x-cache-hits (how many of a request's inputs the cache answered) on every answer. Off by "
            "default: with it, any client can tell whether someone else embedded a text before (a membership "
            "oracle across users); give it where every client is trusted.",
        ),
    ] = False
    request_timeout: Annotated[
        float,
        Flag(
            "HTTP",
            "Seconds a request may take end to end before it gets 504 and the engine drops its work; 0: none.",
        ),
    ] = 300.0
    engine_wait_timeout: Annotated[
        float,
        Flag(
            "HTTP",
            "Seconds a new request waits for an engine that is restarting before it gets 503 with Retry-After.",
        ),
    ] = 30.0
    worker_timeout: Annotated[
        float,
        Flag(
            "HTTP",
            "A process whose heartbeat (beaten by its event loop or its scheduler loop) is silent this long is "
            "killed and replaced; /health reports a forward pass running over a third of it. 0: off.",
        ),
    ] = 30.0
    # What the engine's whole queue holds at its default (--max-queued-tokens): 1024 inputs of the
    # bundled model's 256 tokens, 2048 of 128; a long-context model gets no more.
    max_tokens_per_request: Annotated[
        int,
        Flag(
            "HTTP",
            "Most tokens one request may send to the model, all its inputs together (after truncation); more gets "
            "400 as soon as tokenizing passes it. --max-queued-tokens bounds it too, when smaller. /tokenize "
            "answers up to this many tokens.",
        ),
    ] = 262144
    long_input: Annotated[
        LongInput,
        Flag(
            "HTTP",
            "What an input longer than the model's maximum gets when its request says neither `long_input` nor "
            "a truncation: refuse (400); truncate (cut to the maximum, as `truncate_prompt_tokens: -1`); chunk "
            "(cut into windows of the maximum, each read with its own special tokens, as vLLM's "
            "enable_chunked_processing: an embedding is the windows' token-weighted mean, then normalized as the "
            "model normalizes; a rerank or score is the best window's). Every window's tokens count in `usage` "
            "and against --max-tokens-per-request.",
        ),
    ] = "refuse"
    long_input_overlap: Annotated[
        int,
        Flag(
            "HTTP",
            "Tokens each window of a chunked input repeats from the one before (--long-input chunk or a request's "
            "`long_input: chunk`). 0, as vLLM: each token is read once, so the weighted mean weighs every token "
            "alike.",
        ),
    ] = 0
    max_request_bytes: Annotated[
        int,
        Flag(
            "HTTP",
            "Largest request body accepted, checked on Content-Length and while a chunked body arrives; "
            "larger gets 413. 0: 32 MiB for a model that takes images (one --max-image-bytes image as a base64 "
            "data URL), 4 MiB for a text-only one (a request at --max-tokens-per-request, with room).",
        ),
    ] = 0
    # Issue 16: 20 uploads of 31 MB, each held one byte short, held +616 MB until their clients closed.
    max_body_bytes_in_flight: Annotated[
        int,
        Flag(
            "HTTP",
            "Bytes of request bodies one API server receives or holds at once: a request reserves its "
            "Content-Length before its body is read (a chunked body, its bytes as they arrive) until it is "
            "answered; past the limit it gets 503 (429 on TEI's routes) with Retry-After, unread, so slow "
            "uploads cannot pile up memory. 0: four times the body limit (--max-request-bytes, or its default "
            "for the model: 128 MiB with images, 16 MiB text-only): four of the largest bodies at once "
            "(measured: four 32 MiB bodies took an API server from 74 to 278 MB at peak, parsing included).",
        ),
    ] = 0
    shutdown_timeout: Annotated[
        float,
        Flag(
            "HTTP",
            "Seconds in-flight requests get to finish after SIGTERM before the processes are stopped; one still "
            "waiting for its engine then is answered 503.",
        ),
    ] = 30.0

    max_image_bytes: Annotated[
        int, Flag("images", "Largest encoded image accepted, inline or fetched; larger gets 413.")
    ] = 20 * MIB
    max_image_pixels: Annotated[
        int,
        Flag("images", "Most pixels (width x height) an image may declare; more is refused before decoding (400)."),
    ] = 40_000_000
    image_fetch_timeout: Annotated[
        float, Flag("images", "Seconds to fetch an http(s) image URL, connection to last byte.")
    ] = 10.0
    allowed_local_media_path: Annotated[
        str,
        Flag(
            "images",
            "Folder whose files requests may name as images (file:// URLs or paths); empty: no local files.",
            metavar="DIR",
        ),
    ] = ""
    max_images_per_request: Annotated[
        int,
        Flag("images", "Most images one request may carry; more gets 400 before any is fetched or decoded."),
    ] = 32
    allowed_media_domains: Annotated[
        list[str],
        Flag(
            "images",
            "Host names http(s) image URLs may name (each redirect too); empty: any public host.",
            metavar="HOST",
        ),
    ] = msgspec.field(default_factory=list)
    allow_private_media_urls: Annotated[
        bool,
        Flag(
            "images",
            "Let image URLs reach loopback, private, link-local (cloud metadata) and other non-public "
            "addresses. Off: every address a URL or redirect resolves to must be public, checked on the "
            "connection made.",
        ),
    ] = False

    # Access (docs/security.md).
    api_key: Annotated[
        str,
        Flag(
            "access",
            "Require `Authorization: Bearer KEY` on every endpoint but /health, /health/ready, /health/live, /ping "
            "and /metrics (401 "
            f"otherwise). Default: the {API_KEY_ENV} environment variable, which keeps the key out of `ps`; "
            "unset: no key; an empty key (flag or variable) is refused at start-up.",
            env=API_KEY_ENV,
            is_secret=True,
        ),
    ] = ""
    protect_metrics: Annotated[bool, Flag("access", "Require the API key on /metrics too (needs --api-key).")] = False
    cors_allowed_origins: Annotated[
        list[str],
        Flag(
            "access",
            "Origins browsers may call the API from (https://app.example.com, or * for any); empty: CORS off.",
            metavar="ORIGIN",
        ),
    ] = msgspec.field(default_factory=list)

    device: Annotated[
        str,
        Flag(
            "engine",
            "auto: CUDA when visible, else CPU; cpu; cuda; or cuda:I[,J...]: these GPUs only (indexes into "
            "CUDA_VISIBLE_DEVICES, else the driver's list), the model's engine k on the (k mod n)-th of them. Without "
            "GPU indexes, engines go round the GPUs no model names (docs/operations.md, 'Several models'); a GPU "
            "that holds several engines is warned about at start; an index beyond the GPUs is refused.",
            metavar="{auto,cpu,cuda,cuda:I[,J...]}",
            per_model=True,
        ),
    ] = "auto"
    engine_count: Annotated[
        int,
        Flag(
            "engine",
            "Engine-core processes (1 to 16, default 1), each with its own copy of the model; every API server "
            "sends each request to the one holding the fewest inputs, and moves a dead engine's requests to the "
            "others at once. On CUDA engine i gets the i-th visible GPU (CUDA_VISIBLE_DEVICES, else the driver's), "
            "wrapping round when there are fewer GPUs (--device cuda:I,J picks them); on the CPU "
            "each gets an equal share of the usable cores as torch threads unless --torch-threads is set. Use one "
            "engine per GPU. On the CPU, engines of 1 thread each beat one engine of all the threads (2 cores: "
            "+15-37% throughput with 2 engines x 1 thread; docs/scaling.md) at the cost of a model copy each.",
            per_model=True,
        ),
    ] = 1
    dtype: Annotated[
        DType,
        Flag(
            "engine",
            "Weights' precision. auto: float16 on CUDA; on CPU bfloat16 where the processor has native bf16 "
            "(AVX512_BF16 or AMX) and the model agrees with float32 on a probe set (cosine >= 0.99, top-10 "
            "overlap >= 0.9), else float32. int8 (CPU only, opt-in fast mode): an embedding model's linear layers "
            "in int8 (oneDNN; input per tensor, weights per channel), the rest in bf16 where native; refused at "
            "start-up unless its "
            "vectors stay within cosine 0.995 of float32's on the probe set (docs/operations.md, Precision).",
            per_model=True,
        ),
    ] = "auto"
    token_packing: Annotated[
        TokenPacking,
        Flag(
            "engine",
            "Run a BERT model (an embedder, or a cross-encoder/classifier over BERT) on its inputs' real tokens: "
            "its linear layers skip the padding, and batches are filled to their caps instead of cut by length. "
            "auto: on the CPU (32 sentences as they arrive: 0.67 x the padded pass's time, equal outputs; "
            "docs/benchmarks.md); on: on CUDA too (one H100 run: not yet a default there); off: the model's own "
            "padded forward. Other architectures, and late-interaction (ColBERT) models, always run padded.",
            per_model=True,
        ),
    ] = "auto"
    runtime: Annotated[
        Runtime,
        Flag(
            "engine",
            "What runs the transformer's forward pass. torch: the model's own modules. onnxruntime (CPU, float32, "
            "single-vector embedding models; opt-in): the model exported to ONNX once from the loaded weights, "
            "optimised by ONNX Runtime's BERT fusions and cached in --onnx-cache-dir, run on packed rows (a batch's "
            "inputs end to end, each attending to its own tokens), pooling and heads as with torch; refused at "
            "start-up unless its vectors match torch float32's on the probe set (cosine >= 0.99999). hybrid (CPU, "
            "--dtype float32 or int8, single-vector embedding models): that ONNX Runtime graph for a pass of at most "
            "128 padded tokens (a lone request, two clients' on a thread each, a few clients' paired; a lone sentence "
            "in about half torch's time on an AVX2 CPU), torch for every other pass, held to torch float32 the same "
            "way; the engine then holds the graph's weights beside torch's. auto: for a BERT embedding model on a "
            "CPU, onnxruntime where float32 is served, hybrid with --dtype int8 or on an AVX-512 CPU (there with "
            "only a lone sentence's pass through the graph; where --dtype auto serves bfloat16, with --dtype int8 "
            "where the CPU has native bfloat16, and on CUDA, torch); torch if its graph cannot be exported or "
            "strays; on a first start, with no graph cached, torch serves at once while a process of its own exports "
            "the graph, which then takes over; the start log says which and why (docs/operations.md, 'ONNX "
            "Runtime').",
            per_model=True,
        ),
    ] = "auto"
    onnx_cache_dir: Annotated[
        str,
        Flag(
            "engine",
            "Where --runtime onnxruntime, hybrid and auto keep their exported graphs, one per model weights and "
            "library versions. Empty: ~/.cache/poolserve/onnx. Never the model folder, which may be read-only.",
            metavar="DIR",
            per_model=True,
        ),
    ] = ""
    max_batch_tokens: Annotated[
        int,
        Flag(
            "engine",
            "Token budget of one forward pass, padding included. 0: 8192 on CPU, 32768 on CUDA.",
            per_model=True,
        ),
    ] = 0
    max_batch_size: Annotated[
        int, Flag("engine", "Most inputs in one forward pass. 0: 32 on CPU, 256 on CUDA.", per_model=True)
    ] = 0
    torch_threads: Annotated[
        int,
        Flag(
            "engine",
            "torch intra-op threads in the engine; 0: torch's default (the usable cores). On CPU a batch of at most "
            "128 padded tokens runs on one of them unless it holds a request with priority < 0 "
            "(engine_core/threads.py), and with more queued than one pass takes, two passes run at once on one "
            "thread each (engine_core/engine.py; 1 turns that off).",
            per_model=True,
        ),
    ] = 0
    engine_start_timeout: Annotated[
        float, Flag("engine", "Seconds the engine gets to load the model before start-up is abandoned.")
    ] = 300.0

    log_level: Annotated[LogLevel, Flag("logs", "Log verbosity.")] = "info"
    log_format: Annotated[
        LogFormat,
        Flag("logs", "One line per record: readable text, or one JSON object (for log shippers)."),
    ] = "text"
    access_log: Annotated[
        bool, Flag("logs", "Log one line per request: request id, method, path, status, duration, tokens, user.")
    ] = False

    # Traces (docs/operations.md, "Traces"); each variable is OpenTelemetry's own, read as its SDKs read it.
    otlp_endpoint: Annotated[
        str,
        Flag(
            "tracing",
            "Send OpenTelemetry traces over OTLP/HTTP (protobuf) to this collector: its base URL "
            "(http://collector:4318; spans go to its /v1/traces) or the full traces URL. Each API server sends a "
            "span per POST request, with child spans for parsing, the engine queue, each forward pass the request "
            "rode in and rendering, continuing the client's W3C `traceparent`. Default: OTEL_EXPORTER_OTLP_ENDPOINT; "
            "unset: no tracing, and nothing of it loaded.",
            metavar="URL",
            env="OTEL_EXPORTER_OTLP_ENDPOINT",
        ),
    ] = ""
    otlp_service_name: Annotated[
        str,
        Flag(
            "tracing",
            "The traces' service.name. Default: OTEL_SERVICE_NAME, else poolserve.",
            metavar="NAME",
            env="OTEL_SERVICE_NAME",
        ),
    ] = "poolserve"
    trace_sampler: Annotated[
        TraceSampler,
        Flag(
            "tracing",
            "Which requests are traced, as OpenTelemetry names samplers: parentbased_* follow the client's "
            "`traceparent` sampled flag when it sends one and otherwise use always_on, always_off or traceidratio "
            "(a share of trace ids, --trace-sampler-arg). Default: OTEL_TRACES_SAMPLER, else parentbased_always_on.",
            env="OTEL_TRACES_SAMPLER",
        ),
    ] = "parentbased_always_on"
    trace_sampler_arg: Annotated[
        float,
        Flag(
            "tracing",
            "The share of traces a traceidratio sampler keeps, 0 to 1. Default: OTEL_TRACES_SAMPLER_ARG, else 1.",
            metavar="RATIO",
            env="OTEL_TRACES_SAMPLER_ARG",
        ),
    ] = 1.0

    def __post_init__(self) -> None:
        check_range("--port", self.port, 0, 65535)
        check_range("--api-server-count", self.api_server_count, 1, 256)
        check_range("--max-api-server-count", self.max_api_server_count, 0, 256)
        if 0 < self.max_api_server_count < self.api_server_count:
            raise ConfigError(
                f"--max-api-server-count has value {self.max_api_server_count}; it must be 0 or at least "
                f"--api-server-count ({self.api_server_count})."
            )
        check_range("--max-batch-tokens", self.max_batch_tokens, 0, 1 << 24)
        check_range("--max-batch-size", self.max_batch_size, 0, 1 << 16)
        check_range("--max-model-len", self.max_model_len, 0, 1 << 20)
        check_range("--preprocess-workers", self.preprocess_workers, 0, 64)
        check_range("--torch-threads", self.torch_threads, 0, 1024)
        check_range("--engine-count", self.engine_count, 1, 16)
        check_device(self.device)
        if self.dtype == "int8" and self.device_kind == "cuda":
            raise ConfigError("--dtype int8 is a CPU mode; with --device cuda use --dtype auto, float16 or bfloat16.")
        if self.runtime not in ("torch", "auto") and self.device_kind == "cuda":
            raise ConfigError(f"--runtime {self.runtime} is a CPU mode; with --device cuda use --runtime torch.")
        if self.runtime == "onnxruntime" and self.dtype != "float32":
            raise ConfigError(
                f"--runtime onnxruntime runs float32; --dtype has value '{self.dtype}': pass --dtype float32."
            )
        if self.runtime == "hybrid" and self.dtype not in ("float32", "int8"):
            raise ConfigError(
                f"--runtime hybrid runs its small passes in float32 beside torch's float32 or int8 ones; --dtype has "
                f"value '{self.dtype}': pass --dtype float32 or int8."
            )
        check_range("--max-inputs-per-request", self.max_inputs_per_request, 1, 1 << 20)
        check_range("--max-image-bytes", self.max_image_bytes, 1, 1 << 34)
        check_range("--max-image-pixels", self.max_image_pixels, 1, 1 << 34)
        if self.max_request_bytes:
            check_range("--max-request-bytes", self.max_request_bytes, 1024, 1 << 34)
        check_range("--max-body-bytes-in-flight", self.max_body_bytes_in_flight, 0, 1 << 40)
        # With --max-request-bytes 0 the body limit is known once the model is (4 MiB at the least).
        smallest_body_limit = self.max_request_bytes or 4 * MIB
        if 0 < self.max_body_bytes_in_flight < smallest_body_limit:
            raise ConfigError(
                f"--max-body-bytes-in-flight has value {self.max_body_bytes_in_flight}; it must be 0 or at least "
                f"the body limit ({smallest_body_limit}, --max-request-bytes), or the largest bodies could never "
                "be let in."
            )
        check_range("--max-tokens-per-request", self.max_tokens_per_request, 1, 1 << 30)
        check_range("--long-input-overlap", self.long_input_overlap, 0, 1 << 20)
        check_range("--max-images-per-request", self.max_images_per_request, 0, 1 << 16)
        if self.image_fetch_timeout <= 0:
            raise ConfigError(f"--image-fetch-timeout has value {self.image_fetch_timeout!r}; it must be > 0.")
        check_range("--max-queued-inputs", self.max_queued_inputs, 1, 1 << 30)
        check_range("--max-queued-tokens", self.max_queued_tokens, 1, 1 << 40)
        check_range("--cache-bytes", self.cache_bytes, 0, 1 << 40)
        if self.score_format != "none" and (self.score_tokens or self.score_template):
            raise ConfigError(
                f"--score-format {self.score_format} says the prompt and the score tokens; drop --score-tokens and "
                "--score-template."
            )
        if len(self.score_tokens) > 2:
            raise ConfigError(f"--score-tokens has {len(self.score_tokens)} values; give one or two tokens.")
        if self.default_prompt_name and self.default_prompt:
            raise ConfigError("--default-prompt-name and --default-prompt are both set; give one of the two.")
        check_range("--min-priority", self.min_priority, PRIORITY_MIN + 1, 0)
        if not 0 < self.priority_max_wait <= 86_400:
            raise ConfigError(f"--priority-max-wait has value {self.priority_max_wait!r}; it must be > 0 and <= 86400.")
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
        for flag, seconds in (
            ("--header-timeout", self.header_timeout),
            ("--body-timeout", self.body_timeout),
            ("--send-timeout", self.send_timeout),
        ):
            if seconds < 0:
                raise ConfigError(f"{flag} has value {seconds!r}; it must be >= 0 (0: none).")
        check_connection_limit(self.max_connections_per_server, open_files_limit())
        check_range("--max-connections-per-client", self.max_connections_per_client, 0, self.max_connections_per_server)
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
        if self.otlp_endpoint and not is_http_url(self.otlp_endpoint):
            raise ConfigError(
                f"--otlp-endpoint has value {self.otlp_endpoint!r}; give an http(s) URL such as http://collector:4318."
            )
        if not self.otlp_service_name.strip():
            raise ConfigError("--otlp-service-name is empty; give a name such as poolserve.")
        if not 0 <= self.trace_sampler_arg <= 1:
            raise ConfigError(f"--trace-sampler-arg has value {self.trace_sampler_arg!r}; it must be within 0..1.")
        for origin in self.cors_allowed_origins:
            if not is_origin(origin):
                raise ConfigError(
                    f"--cors-allowed-origins has value {origin!r}; give origins such as https://app.example.com, or *."
                )

    @property
    def is_bundled_model(self) -> bool:
        return not self.model

    @property
    def device_kind(self) -> DeviceKind:
        """--device without its GPU indexes: an engine placed on cuda:1 sees that GPU alone (CUDA_VISIBLE_DEVICES),
        as `cuda`."""
        kind = self.device.partition(":")[0]
        return kind if kind in ("cpu", "cuda") else "auto"  # type: ignore[return-value]

    @property
    def gpu_indexes(self) -> list[int]:
        """The GPUs --device cuda:I[,J...] names (indexes into the GPUs the supervisor sees); empty: none named."""
        _, _, indexes = self.device.partition(":")
        return [int(index) for index in indexes.split(",")] if indexes else []

    @property
    def api_server_ceiling(self) -> int:
        """How many API servers SIGTTIN may scale up to (--max-api-server-count)."""
        return self.max_api_server_count or max(self.api_server_count, 2 * usable_cores())

    @property
    def client_connection_share(self) -> int:
        """--max-connections-per-client, or a quarter of --max-connections-per-server (at least 1)."""
        return self.max_connections_per_client or max(1, self.max_connections_per_server // 4)

    @property
    def model_names(self) -> list[str]:
        """Names a request's `model` field may use; the first is the one responses carry."""
        if self.served_model_name:
            return list(self.served_model_name)
        return [self.model or BUNDLED_MODEL_NAME]

    @property
    def engine_stall_limit(self) -> float:
        """Seconds inside one forward pass after which an engine reads as hung: /health answers 503 when
        every engine is, and API servers send an engine that is no new requests while another is not.
        A third of --worker-timeout, so that it shows well before the kill; 10 s when nothing kills."""
        return self.worker_timeout / 3 if self.worker_timeout else 10.0

    @property
    def engine_torch_threads(self) -> int:
        """Each engine's --torch-threads: as given; else, with several engines, an equal share of the
        usable cores, so that M engines do not each start one thread per core and fight over them."""
        if self.torch_threads or self.engine_count == 1:
            return self.torch_threads
        return max(1, usable_cores() // self.engine_count)

    @property
    def binds_beyond_loopback(self) -> bool:
        """Whether other machines may reach the HTTP socket: any address but a loopback one."""
        if self.host == "localhost":
            return False
        try:
            return not ipaddress.ip_address(self.host).is_loopback
        except ValueError:  # a host name: it may resolve to anything
            return True


def check_device(device: str) -> None:
    kind, colon, indexes = device.partition(":")
    numbers = indexes.split(",") if colon else []
    if (
        kind not in DEVICE_KINDS
        or (colon and kind != "cuda")
        or not all(number.isdecimal() and number.isascii() for number in numbers)
        or len(set(map(int, numbers))) != len(numbers)
    ):
        raise ConfigError(
            f"--device has value {device!r}; give auto, cpu, cuda, or cuda:I[,J...] with distinct GPU indexes "
            "(cuda:1, cuda:0,2)."
        )


def check_range(flag: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ConfigError(f"{flag} has value {value!r}; it must be between {low} and {high}.")


def open_files_limit() -> int:
    """This process's soft RLIMIT_NOFILE (`ulimit -n`), which the API servers inherit; 0 when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 0 if soft == resource.RLIM_INFINITY else soft


def check_connection_limit(connections: int, open_files: int) -> None:
    """Connections and the server's own files fit under the file-descriptor limit, so accept() never fails
    for lack of one and a full server can still answer 503."""
    if connections < 1:
        raise ConfigError(f"--max-connections-per-server has value {connections!r}; it must be at least 1.")
    room = open_files - FDS_RESERVED_PER_SERVER
    if open_files and connections > room:
        raise ConfigError(
            f"--max-connections-per-server has value {connections}, but an API server may open {open_files} files "
            f"(ulimit -n) and keeps {FDS_RESERVED_PER_SERVER} for itself: give at most {max(room, 0)}, or raise "
            "ulimit -n."
        )


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


def is_http_url(value: str) -> bool:
    parts = urllib.parse.urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def is_origin(value: str) -> bool:
    """`*`, or scheme://host[:port] as a browser sends it in `Origin` (no path, no trailing slash)."""
    if value == "*":
        return True
    parts = urllib.parse.urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.netloc) and value == f"{parts.scheme}://{parts.netloc}"
