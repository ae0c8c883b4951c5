"""Fields that peers spell differently for one meaning (vLLM's `activation` and `use_activation`, `text_1`
and `queries`, ...): a request sends at most one spelling, or gets a 400 naming both."""

from __future__ import annotations

from typing import TypeVar

from apiserver.errors import bad_request

T = TypeVar("T")


def one_spelling(**spellings: T | None) -> tuple[str, T] | None:
    """The spelling given and its value; None when none is."""
    given = [(name, value) for name, value in spellings.items() if value is not None]
    if len(given) > 1:
        names = " and ".join(f"`{name}`" for name, _ in given)
        raise bad_request(f"{names} are spellings of one field; send one of them.", param=given[1][0])
    return given[0] if given else None


def value_of(**spellings: T | None) -> T | None:
    """The value given under any one spelling; None when none is."""
    found = one_spelling(**spellings)
    return None if found is None else found[1]
