"""The wire between API servers and the engine core: msgspec messages plus raw array frames.

A message is a multipart ZeroMQ message: frame 0 is a msgpack-encoded Struct from the unions
below; arrays follow as raw little-endian frames (token ids int32, pooled outputs float32)
whose shapes the Struct carries. Nothing is pickled. New fields get defaults and go last
(msgspec's schema-evolution rules), so an API server and an engine one version apart still talk.
"""

from __future__ import annotations

import msgspec

TOKEN_DTYPE = "<i4"
OUTPUT_DTYPE = "<f4"
TOKEN_ITEMSIZE = 4
OUTPUT_ITEMSIZE = 4


class ImageProcessing(msgspec.Struct, kw_only=True, frozen=True):
    """How an image becomes model input, from the model's preprocessor_config.json.

    API servers do the part that shrinks the data (decode, convert to RGB, resize, center crop)
    and send uint8 height x width x 3 pixels; the engine rescales and normalizes them into float
    channels-first tensors. Every image of a model ends at the same size, so images batch.
    """

    do_convert_rgb: bool = True
    do_resize: bool = True
    # Resize so the shorter side is `resize_shortest_edge` (aspect ratio kept), or, when that is
    # 0, to exactly `resize_height` x `resize_width`.
    resize_shortest_edge: int = 0
    resize_height: int = 0
    resize_width: int = 0
    resample: int = 3  # a PIL.Image.Resampling value; 3 is BICUBIC
    do_center_crop: bool = True
    crop_height: int = 0
    crop_width: int = 0
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: list[float] = msgspec.field(default_factory=lambda: [0.0, 0.0, 0.0])
    image_std: list[float] = msgspec.field(default_factory=lambda: [1.0, 1.0, 1.0])

    @property
    def output_size(self) -> tuple[int, int]:
        """(height, width) of the pixels an API server sends."""
        if self.do_center_crop:
            return (self.crop_height, self.crop_width)
        return (self.resize_height, self.resize_width)


# Model kinds, and what each kind's output row is.
EMBEDDING = "embedding"  # AutoModel + pooling: one vector per input
CLASSIFIER = "classifier"  # AutoModelForSequenceClassification: one logit per label (cross-encoders: 1 label)
CLIP = "clip"  # text and image towers projected into one space

# Tasks a model card may list; each endpoint needs one of them.
TASK_EMBED = "embed"
TASK_CLASSIFY = "classify"
TASK_SCORE = "score"
TASK_POOL = "pool"
TASK_TOKENIZE = "tokenize"


class ModelCard(msgspec.Struct, kw_only=True, frozen=True):
    """What an API server needs to know of the model, told by the engine in its handshake."""

    path: str
    architecture: str
    kind: str
    tasks: list[str]
    max_model_len: int
    # Length of each output row: the embedding size, or the number of labels of a classifier.
    output_size: int
    vocab_size: int
    pooling: str
    normalize: bool
    pad_token_id: int
    # The model's fast tokenizer as transformers builds it (padding and truncation off), so an API
    # server tokenizes exactly as transformers would without importing it.
    tokenizer_json: str
    device: str
    dtype: str
    # Classifiers: label names in output order, and the activation their config calls for
    # ("sigmoid", "softmax" or "none").
    labels: list[str] = msgspec.field(default_factory=list)
    activation: str = "none"
    # Whether the model takes token type ids (BERT-style pairs).
    uses_token_types: bool = False
    # Image models: how to preprocess, and what one image costs in the token budget.
    image: ImageProcessing | None = None
    image_tokens: int = 0
    # The engine's batch limits, as resolved for this device.
    max_batch_tokens: int = 0
    max_batch_size: int = 0
    # How many token type ids the model has embeddings for (2 for BERT), so that the engine can refuse others.
    type_vocab_size: int = 0

    def supports(self, task: str) -> bool:
        return task in self.tasks


# API server -> engine ---------------------------------------------------------------------


class Hello(msgspec.Struct, tag="hello", array_like=True):
    server_index: int
    pid: int


class PoolRequest(msgspec.Struct, tag="pool", array_like=True):
    """Run `len(lengths)` text inputs and `images` images through the model, as one unit.

    Frames after the header: the token ids of every text input, concatenated (int32); then,
    when `token_types`, their token type ids in the same layout (int32); then, when `images`,
    the images' uint8 pixels (images x height x width x 3, the card's output size). Output rows
    come back text inputs first, then images, each in the order sent.

    `dimensions` 0 means the full output size. `normalize` -1 means the model's own choice.
    `activation` applies a classifier's activation (sigmoid/softmax) to its logits.
    `attempt` counts resubmissions after engine crashes: a resubmitted request was admitted
    already (no queue limit applies), and one that was running when an engine died runs in
    batches of its own (`is_suspect`), so that a second crash names the culprit.
    """

    id: int
    lengths: list[int]
    dimensions: int = 0
    normalize: int = -1
    activation: bool = True
    token_types: bool = False
    images: int = 0
    attempt: int = 0
    is_suspect: bool = False

    @property
    def count(self) -> int:
        return len(self.lengths) + self.images


class Abort(msgspec.Struct, tag="abort", array_like=True):
    ids: list[int]


class Ping(msgspec.Struct, tag="ping", array_like=True):
    nonce: int


ToEngine = Hello | PoolRequest | Abort | Ping


# engine -> API server ---------------------------------------------------------------------


class Ready(msgspec.Struct, tag="ready", array_like=True):
    """The handshake's answer. `suspects`: ids of this API server's requests that were running
    in a forward pass when the previous engine died."""

    card: ModelCard
    suspects: list[int] = msgspec.field(default_factory=list)


# Why the engine refused or failed a request (PooledOutput.code).
ERROR_INVALID = "invalid"
ERROR_OVERLOADED = "overloaded"
ERROR_MODEL = "model_error"


class PooledOutput(msgspec.Struct, array_like=True):
    """One finished request: `rows` x `dim` float32 values in its own frame, or an error and an empty one."""

    id: int
    rows: int
    dim: int
    error: str = ""
    code: str = ""
    # Seconds between admission and the first forward pass, and from there to the last one.
    queue_time: float = 0.0
    inference_time: float = 0.0


class Outputs(msgspec.Struct, tag="outputs", array_like=True):
    """Finished requests for one API server, sent together; output i's data is frame i + 1."""

    outputs: list[PooledOutput]


class Pong(msgspec.Struct, tag="pong", array_like=True):
    """The answer to a Ping, from the engine's I/O thread, with the scheduler's state: how long it
    has been inside one step (a hung forward pass shows here), and what is waiting."""

    nonce: int
    stalled_for: float = 0.0
    queued_inputs: int = 0
    queued_tokens: int = 0


FromEngine = Ready | Outputs | Pong


def make_encoder() -> msgspec.msgpack.Encoder:
    return msgspec.msgpack.Encoder()


def make_engine_decoder() -> msgspec.msgpack.Decoder[ToEngine]:
    """Decodes what the engine receives; built once per process and reused."""
    return msgspec.msgpack.Decoder(ToEngine)


def make_client_decoder() -> msgspec.msgpack.Decoder[FromEngine]:
    """Decodes what an API server receives; built once per process and reused."""
    return msgspec.msgpack.Decoder(FromEngine)
