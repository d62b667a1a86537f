"""Keys and values: one sequence's, and the chunks that prompts share.

Prompts are read in chunks of `PREFILL_CHUNK` tokens at fixed positions, and the keys and values of
a prompt's full chunks are kept (`PrefixStore`) for the next prompt that starts with the same
tokens: a Stage 2 turn repeats the whole conversation so far, and branches share their prefix. A
chunk's attention has the same shapes whether the chunks before it were computed in this pass or
taken from the store, so reuse changes no bit of what follows.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

PREFILL_CHUNK = 64


def prompt_pieces(prompt: list[int], cache: SequenceCache) -> list[tuple[list[int], SequenceCache, int]]:
    """The chunks of `prompt` past what `cache` holds, each at its fixed place (multiples of PREFILL_CHUNK)."""
    return [(prompt[start:start + PREFILL_CHUNK], cache, start)
            for start in range(cache.length, len(prompt), PREFILL_CHUNK)]


class SequenceCache:
    """One sequence's keys and values for every layer, in buffers sized for its prompt and longest reply."""

    def __init__(self, model_config: Any, capacity: int, device: str, dtype: Any):
        import torch

        shape = (model_config.num_hidden_layers, 1, model_config.num_key_value_heads, capacity,
                 getattr(model_config, "head_dim", None) or model_config.hidden_size // model_config.num_attention_heads)
        self.keys = torch.empty(shape, device=device, dtype=dtype)
        self.values = torch.empty(shape, device=device, dtype=dtype)
        self.length = 0  # tokens whose keys every layer holds
        self._layers = list(zip(self.keys.unbind(0), self.values.unbind(0)))  # views: indexing a list is free

    def extend(self, layer: int, position: int, keys: Any, values: Any) -> tuple[Any, Any]:
        """Store one layer's keys and values for tokens from `position` on; the layer's keys and values up to them."""
        layer_keys, layer_values = self._layers[layer]
        layer_keys.narrow(2, position, keys.shape[2]).copy_(keys)
        layer_values.narrow(2, position, keys.shape[2]).copy_(values)
        end = position + keys.shape[2]
        return layer_keys.narrow(2, 0, end), layer_values.narrow(2, 0, end)

    def copy(self) -> SequenceCache:
        twin = object.__new__(SequenceCache)
        twin.keys, twin.values, twin.length = self.keys.clone(), self.values.clone(), self.length
        twin._layers = list(zip(twin.keys.unbind(0), twin.values.unbind(0)))
        return twin


class PrefixStore:
    """The keys and values of recent prompts' full chunks, by the tokens up to each chunk's end; least recently
    used first out, past `capacity` bytes. One per loaded model, shared by its decoders' threads."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._chunks: collections.OrderedDict[tuple[int, ...], tuple[Any, Any]] = collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def reuse(self, prompt: list[int], cache: SequenceCache) -> None:
        """Copy into `cache` the stored chunks that `prompt` starts with, leaving at least its last token to compute
        (its logits are needed)."""
        with self._lock:
            used = []
            for end in range(PREFILL_CHUNK, len(prompt), PREFILL_CHUNK):
                chunk = self._chunks.get(key := tuple(prompt[:end]))
                if chunk is None:
                    break
                cache.keys[:, :, :, end - PREFILL_CHUNK:end], cache.values[:, :, :, end - PREFILL_CHUNK:end] = chunk
                cache.length = end
                used.append(key)
            self._touch(used)

    def keep(self, prompt: list[int], cache: SequenceCache) -> None:
        """Store the full chunks of `prompt` that `cache` now holds."""
        if not self.capacity:
            return
        with self._lock:
            kept = []
            for end in range(PREFILL_CHUNK, min(len(prompt), cache.length) + 1, PREFILL_CHUNK):
                kept.append(key := tuple(prompt[:end]))
                if key not in self._chunks:
                    chunk = (cache.keys[:, :, :, end - PREFILL_CHUNK:end].clone(),
                             cache.values[:, :, :, end - PREFILL_CHUNK:end].clone())
                    self._chunks[key] = chunk
                    self._bytes += 2 * chunk[0].nbytes
            self._touch(kept)
            while self._bytes > self.capacity:
                _, (keys, _) = self._chunks.popitem(last=False)
                self._bytes -= 2 * keys.nbytes

    def _touch(self, keys: list[tuple[int, ...]]) -> None:
        """Mark a prompt's chunks used, its first chunk last: a chunk is of use only after those before it, so
        eviction takes a prompt's end first."""
        for key in reversed(keys):
            self._chunks.move_to_end(key)

    def clear(self) -> None:
        with self._lock:
            self._chunks.clear()
            self._bytes = 0
