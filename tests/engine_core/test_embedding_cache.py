from __future__ import annotations

import numpy as np

from engine_core.embedding_cache import ENTRY_OVERHEAD_BYTES, EmbeddingCache, input_key


def row(value: float, dim: int = 4) -> np.ndarray:  # type: ignore[type-arg]
    return np.full(dim, value, dtype=np.float32)


def test_keys_differ_by_token_ids_token_types_and_kind() -> None:
    ids = np.asarray([101, 7592, 102], dtype=np.int32)
    assert input_key(b"text", ids, None) == input_key(b"text", ids.copy(), None)
    assert input_key(b"text", ids, None) != input_key(b"text", ids[:2], None)
    assert input_key(b"text", ids, None) != input_key(b"text", ids, np.zeros(3, dtype=np.int32))
    assert input_key(b"text", ids, None) != input_key(b"image", ids)


def test_least_recently_used_rows_go_first_and_the_byte_bound_holds() -> None:
    cost = row(0).nbytes + ENTRY_OVERHEAD_BYTES
    cache = EmbeddingCache(3 * cost)
    for i in range(3):
        cache.put(b"k%d" % i, row(i))
    assert cache.get(b"k0") is not None  # now the most recently used
    cache.put(b"k3", row(3))
    assert cache.get(b"k1") is None and cache.get(b"k0") is not None
    for i in range(4, 1000):  # a stream of distinct inputs
        cache.put(b"k%d" % i, row(i))
        assert cache.bytes <= cache.max_bytes
    assert len(cache) == 3
    got = cache.get(b"k999")
    assert got is not None and got.tolist() == row(999).tolist()


def test_a_cached_row_is_a_copy_not_a_view_of_the_batch() -> None:
    batch = np.stack([row(1), row(2)])
    cache = EmbeddingCache(1 << 20)
    cache.put(b"a", batch[0])
    batch[0] = 9
    got = cache.get(b"a")
    assert got is not None and got.tolist() == row(1).tolist()


def test_size_zero_keeps_nothing() -> None:
    cache = EmbeddingCache(0)
    cache.put(b"a", row(1))
    assert cache.get(b"a") is None and cache.bytes == 0
