"""The inputs of a request as a flat list of items: texts, token-id rows, and image sources."""

from __future__ import annotations

from collections.abc import Sequence

from apiserver.errors import bad_request
from apiserver.images.sources import ImageSource
from apiserver.requests.limits import check_input_count
from apiserver.requests.schemas.common import ChatMessage, ImageInput, ImageUrlPart, Input, InputItem, TextPart

Item = str | list[int] | ImageSource


def items_from_input(value: str | Sequence[InputItem], max_items: int, param: str = "input") -> list[Item]:
    """OpenAI's forms: a text, a token-id list, or a list of texts and images, or of token-id lists."""
    if isinstance(value, str):
        value = [value]
    if not value:
        raise bad_request(f"`{param}` must not be empty.", param=param, code="empty_input")
    check_input_count(len(value), max_items, param)
    if isinstance(value[0], int):
        if not all(isinstance(item, int) for item in value):
            raise bad_request(f"`{param}` mixes token ids with other kinds of input.", param=param)
        return [value]  # type: ignore[list-item]
    is_token_rows = isinstance(value[0], list)
    items: list[Item] = []
    for i, item in enumerate(value):
        where = f"{param}[{i}]"
        if is_token_rows != isinstance(item, list) or isinstance(item, int):
            expected = "a list of token ids" if is_token_rows else "a string or an image"
            raise bad_request(f"`{where}` must be {expected} like the other inputs.", param=where)
        if isinstance(item, ImageInput):
            if not item.image:
                raise bad_request(f"`{where}.image` is empty.", param=f"{where}.image")
            items.append(ImageSource(item.image, f"{where}.image"))
            continue
        if not item:
            kind = "list of token ids" if is_token_rows else "string"
            raise bad_request(f"`{where}` is an empty {kind}.", param=where)
        items.append(item)
    return items


def item_from_messages(messages: list[ChatMessage], param: str = "messages") -> Item:
    """vLLM's chat-style input, which makes one input: its text parts joined, or its one image."""
    if not messages:
        raise bad_request(f"`{param}` must not be empty.", param=param)
    texts: list[str] = []
    images: list[ImageSource] = []
    for i, message in enumerate(messages):
        if isinstance(message.content, str):
            texts.append(message.content)
            continue
        for j, part in enumerate(message.content):
            if isinstance(part, TextPart):
                texts.append(part.text)
            elif isinstance(part, ImageUrlPart):
                images.append(ImageSource(part.image_url.url, f"{param}[{i}].content[{j}].image_url.url"))
    text = "\n".join(t for t in texts if t)
    if images and (text or len(images) > 1):
        raise bad_request(
            f"`{param}` must hold either text or one image: this server embeds each input as one or the other.",
            param=param,
        )
    if images:
        return images[0]
    if not text:
        raise bad_request(f"`{param}` has no text and no image.", param=param)
    return text


def request_items(value: Input | None, messages: list[ChatMessage] | None, max_items: int) -> list[Item]:
    """Items of a request that may send `input` or `messages`, but exactly one of the two."""
    if (value is None) == (messages is None):
        raise bad_request("Send exactly one of `input` and `messages`.", param="input")
    if messages is not None:
        return [item_from_messages(messages)]
    assert value is not None
    return items_from_input(value, max_items)
