"""How a reranker reads a query/document pair: tokenized as a pair (BERT-style cross-encoders), or rendered by a
chat template (LLM rerankers and their sequence-classification conversions), and, for a causal language model,
which tokens' logits at the last position make the score.

sentence-transformers 6 is the reference. A CrossEncoder whose tokenizer has a chat template (or whose
sentence_bert_config.json says modality_config "message") renders each pair as the messages
[{"role": "query", ...}, {"role": "document", ...}], after a {"role": "system", ...} one for a prompt; a
CrossEncoder over a `*ForCausalLM` model is followed by a LogitScore module naming the (true, false) tokens:
its score is logit(true) - logit(false), or logit(true) alone. Folders without those files (Qwen3-Reranker's,
bge-reranker-v2-gemma's) are told the same two things by --score-template and --score-tokens, or read as their
own package reads them with --score-format (apiserver/requests/pair_formats.py): its score tokens and activation are
here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import PretrainedConfig, PreTrainedTokenizerBase

from engine_core.folder_choices import LoadError, first_line, is_causal_lm
from engine_core.st_modules import CROSS_ENCODER, StFolder
from poolserve.config import Config
from poolserve.model_card import Activation

# Stand-ins for a pair's two texts when a template is tried at start: each must come out of the render.
PROBE_QUERY, PROBE_DOCUMENT = "poolserve probe query", "poolserve probe document"

# --score-format's score tokens (as each package finds them: the first id of the text) and activation: the
# activation-on score is what the package's default returns where that is a logit and its `normalize` a sigmoid
# (FlagLLMReranker's normalize=True); MxbaiRerankV2's rank() and predict() return the logit, and its normalize
# divides by a per-checkpoint estimate no folder holds, so it is served raw either way.
FORMAT_TOKENS: dict[str, tuple[str, str | None]] = {
    "mxbai-rerank-v2": ("1", "0"),
    "bge-reranker-v2-gemma": ("Yes", None),
}
FORMAT_ACTIVATIONS: dict[str, Activation] = {"mxbai-rerank-v2": "none", "bge-reranker-v2-gemma": "sigmoid"}


@dataclass(frozen=True, slots=True)
class PairScoring:
    """`template`: the chat template pairs are rendered by ("": tokenized as pairs); `special_tokens`: the names
    it may use for the tokenizer's special tokens; `logit_tokens`: a causal model's (true, false) token ids."""

    template: str = ""
    special_tokens: dict[str, str] = field(default_factory=dict)
    logit_tokens: tuple[int, int | None] | None = None
    # --score-format's name ("": none), and the activation it calls for.
    format: str = ""
    activation: Activation | None = None


def is_llm_reranker(config: Config, st: StFolder, model_config: PretrainedConfig) -> bool:
    """A causal language model served as a reranker: its folder has a LogitScore module, or --score-tokens says
    which tokens score it."""
    if config.score_tokens and not is_causal_lm(model_config):
        raise LoadError(
            f"--score-tokens applies to a causal language model (*ForCausalLM); this is a "
            f"{(model_config.architectures or [model_config.model_type])[0]}."
        )
    if config.score_tokens and st.logit_score is not None:
        raise LoadError("--score-tokens replaces the folder's own LogitScore module; drop --score-tokens.")
    if config.score_format != "none":
        if not is_causal_lm(model_config):
            raise LoadError(
                f"--score-format applies to a causal language model (*ForCausalLM); this is a "
                f"{(model_config.architectures or [model_config.model_type])[0]}."
            )
        architecture = (model_config.architectures or [model_config.model_type])[0]
        if any(marker in architecture for marker in ("LayerWise", "CostWise")):
            raise LoadError(
                f"{architecture} is one of FlagEmbedding's layer-wise or lightweight rerankers, scored from chosen "
                "layers (and compressed tokens), which --score-format does not run."
            )
        if st.has_modules:
            raise LoadError(
                f"--score-format {config.score_format} reads a bare causal model's folder as its package does; this "
                "folder is a Sentence-Transformers model, served as its own modules say: drop --score-format."
            )
        return True
    return st.logit_score is not None or (bool(config.score_tokens) and is_causal_lm(model_config))


def choose_pair_scoring(
    config: Config, st: StFolder, model_config: PretrainedConfig, tokenizer: PreTrainedTokenizerBase
) -> PairScoring:
    """How the served reranker (a classifier) reads pairs; LoadError for what it cannot read exactly."""
    llm = is_llm_reranker(config, st, model_config)
    if config.score_format != "none":
        return format_scoring(config.score_format, tokenizer)
    template = read_template_flag(config.score_template) if config.score_template else ""
    if not template and renders_messages(st, tokenizer):
        template = str(tokenizer.chat_template)
    if llm and not template:
        raise LoadError(
            "this language-model reranker has no chat template that renders a query/document pair; give "
            "--score-template FILE (a Jinja template over messages with the roles 'query' and 'document')."
        )
    if template:
        check_template_renders_pairs(tokenizer, template, from_flag=bool(config.score_template))
    logit_tokens = None
    if llm:
        logit_tokens = st.logit_score or token_ids(tokenizer, config.score_tokens)
    special = {str(name): str(value) for name, value in tokenizer.special_tokens_map.items() if isinstance(value, str)}
    return PairScoring(template=template, special_tokens=special if template else {}, logit_tokens=logit_tokens)


def renders_messages(st: StFolder, tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether sentence-transformers renders this CrossEncoder's pairs through the chat template: as the
    modality_config its files save says (a folder saved before there was one is text-only, as
    sentence-transformers 6 reads it), else, for a folder without its files, whenever the tokenizer has one."""
    if st.has_modules:
        return st.model_type == CROSS_ENCODER and st.renders_messages is True
    return getattr(tokenizer, "chat_template", None) is not None


def read_template_flag(path: str) -> str:
    try:
        return Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LoadError(f"--score-template {path!r} cannot be read: {first_line(exc)}") from exc


def check_template_renders_pairs(tokenizer: PreTrainedTokenizerBase, template: str, *, from_flag: bool) -> None:
    """A template that does not render both texts of a pair would score every pair alike: refused, as
    sentence-transformers refuses it."""
    messages = [{"role": "query", "content": PROBE_QUERY}, {"role": "document", "content": PROBE_DOCUMENT}]
    source = "--score-template" if from_flag else "the tokenizer's chat template"
    try:
        rendered: Any = tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False)
    except Exception as exc:
        raise LoadError(f"{source} cannot render a query/document pair: {first_line(exc)}") from exc
    if not isinstance(rendered, str) or PROBE_QUERY not in rendered or PROBE_DOCUMENT not in rendered:
        fix = "" if from_flag else "; give --score-template FILE with one that does"
        raise LoadError(
            f"{source} does not render a query/document pair (messages with the roles 'query' and 'document'), so "
            f"every pair would score alike{fix}."
        )


def token_ids(tokenizer: PreTrainedTokenizerBase, tokens: list[str]) -> tuple[int, int | None]:
    """--score-tokens' ids: each must be one token of the vocabulary, as sentence-transformers' default
    ("yes", "no") is looked up."""
    vocab = tokenizer.get_vocab()
    missing = [token for token in tokens if token not in vocab]
    if missing:
        raise LoadError(f"--score-tokens {' '.join(missing)} is not a token of the model's vocabulary.")
    ids = [int(vocab[token]) for token in tokens]
    return ids[0], ids[1] if len(ids) > 1 else None


def format_scoring(name: str, tokenizer: PreTrainedTokenizerBase) -> PairScoring:
    """--score-format's scoring: its package's tokens, each the first id of the text as the package looks it up
    (tokenizer(text, add_special_tokens=False)["input_ids"][0])."""
    ids: list[int | None] = []
    for text in FORMAT_TOKENS[name]:
        if text is None:
            ids.append(None)
            continue
        encoded = tokenizer(text, add_special_tokens=False)["input_ids"]
        if not encoded:
            raise LoadError(f"--score-format {name}: the tokenizer gives no token for {text!r}.")
        ids.append(int(encoded[0]))
    true_id, false_id = ids
    assert true_id is not None
    special = {str(key): str(value) for key, value in tokenizer.special_tokens_map.items() if isinstance(value, str)}
    return PairScoring(
        special_tokens=special, logit_tokens=(true_id, false_id), format=name, activation=FORMAT_ACTIVATIONS[name]
    )
