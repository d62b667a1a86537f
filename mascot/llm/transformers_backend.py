"""In-process backend: a transformers causal LM (optionally with a PEFT adapter) on this machine.

Used by the offline profile (tiny models on a laptop CPU) and for quick checks of a trained
adapter without starting a server. Models are loaded once per process and shared by every
backend that names the same (model, adapter, device), until the step that loaded them ends
(`models_released`): a model loaded for a step leaves memory with it.

Requests are decoded in batches (`mascot.llm.batched_decoding`): those waiting for the same
loaded model share each forward pass, up to `max_batch` sequences, and each request's texts depend
only on the model, the adapter, the messages, the parameters and the seed, never on its batch.
Decoding runs in a thread of its own, so the event loop stays free meanwhile.

`response_format` is accepted and ignored: this decoder cannot constrain output to a JSON
schema. Callers that need structured output parse and retry, as the judges do.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import logging
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mascot.config import SamplingParams
from mascot.llm.base import MessageLike, check_n, normalize_messages
from mascot.llm.batched_decoding import SAMPLER, BatchedDecoder, make_batch_invariant
from mascot.llm.kv_cache import PrefixStore
from mascot.llm.limits import Limit, shared_limit
from mascot.llm.streaming import ReplyDeltas
from mascot.torch_runtime import MissingTrainExtra, quiet_transformers, require_torch, resolve_device

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    model: Any  # transformers PreTrainedModel (adapter merged in, when there is one)
    tokenizer: Any
    device: str
    prefixes: PrefixStore
    # A fast tokenizer used from two threads at once can fail ("Already borrowed").
    tokenizer_lock: threading.Lock = field(default_factory=threading.Lock)
    decoders: dict[int, BatchedDecoder] = field(default_factory=dict)  # by max_batch

    def decode(self, tokens: list[int]) -> str:
        with self.tokenizer_lock:
            return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def encode(self, chat: list[dict], chat_template_kwargs: dict) -> list[int]:
        with self.tokenizer_lock:
            return list(self.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True,
                                                           return_dict=True, **chat_template_kwargs)["input_ids"])

    def decoder(self, max_batch: int) -> BatchedDecoder:
        with _LOAD_LOCK:
            if max_batch not in self.decoders:
                self.decoders[max_batch] = BatchedDecoder(self.model, self.tokenizer, self.tokenizer_lock,
                                                          self.prefixes, self.device, max_batch)
            return self.decoders[max_batch]


# Memory for the keys and values of prompts' shared chunks, per loaded model: at 512 bytes a token, the tiny
# models' whole demo fits; Qwen3-8B in bf16 takes 144 KiB a token, so 3,600 tokens (a long conversation).
PREFIX_CACHE_BYTES = 512 << 20

_LOADED: dict[tuple[str, str | None, str], LoadedModel] = {}
_LOAD_LOCK = threading.Lock()


def adapter_fingerprint(adapter: str | Path) -> str:
    """Path plus a digest of the adapter's files, so a retrained adapter is a different cache key."""
    folder = Path(adapter)
    if not folder.is_dir():
        raise FileNotFoundError(f"PEFT adapter folder not found: {folder}")
    digest = hashlib.sha256()
    for file in sorted(folder.glob("adapter_*")):
        digest.update(file.name.encode())
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return f"{folder}@sha256:{digest.hexdigest()[:16]}"


def load_model(model: str, adapter: str | None, device: str) -> LoadedModel:
    """Load (or reuse) the model, tokenizer and adapter for this process."""
    key = (model, adapter, device)
    with _LOAD_LOCK:
        if key not in _LOADED:
            _LOADED[key] = _load_uncached(model, adapter, device)
        return _LOADED[key]


def unload_adapter(adapter: str) -> None:
    """Forget every loaded copy of `adapter` (a policy snapshot that training has moved past) and end its
    decoders, so that its memory is freed."""
    with _LOAD_LOCK:
        for key in [key for key in _LOADED if key[1] == adapter]:
            for decoder in _LOADED.pop(key).decoders.values():
                decoder.close()


def loaded_models() -> list[tuple[str, str | None, str]]:
    """The (model, adapter, device) of every model this process holds."""
    with _LOAD_LOCK:
        return list(_LOADED)


@contextlib.contextmanager
def models_released() -> Iterator[None]:
    """Release, when the block ends, every model loaded during it, and return the GPU memory they held.

    A step that loads models (a trainer's scorers and policy snapshots, the before/after comparison's two
    policies) runs in this block, so that the next step does not find them still loaded: in one pipeline process
    an 8B model per step would otherwise pile up until the GPU is full. Models loaded before the block began,
    which the shards of another step running at the same time may be using, are kept."""
    before = set(loaded_models())
    try:
        yield
    finally:
        release_models(keep=before)


def release_models(keep: set[tuple] | frozenset = frozenset()) -> None:
    """Forget every loaded model but those in `keep`, end their decoders once their work is done, and empty
    the CUDA cache, so that their memory returns to the GPU rather than to torch's allocator."""
    with _LOAD_LOCK:
        released = [_LOADED.pop(key) for key in [key for key in _LOADED if key not in keep]]
    for loaded in released:
        for decoder in loaded.decoders.values():
            decoder.close()
    del released
    gc.collect()  # the models' tensors are freed when their last reference goes, which a cycle may hold
    empty_cuda_cache()


def empty_cuda_cache() -> None:
    """Hand torch's cached, unused GPU blocks back to the driver (nothing without torch or a GPU)."""
    import sys

    torch = sys.modules.get("torch")  # a process that never imported torch holds no GPU memory
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def _load_uncached(model: str, adapter: str | None, device: str) -> LoadedModel:
    require_torch()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("loading %s%s on %s", model, f" with adapter {adapter}" if adapter else "", device)
    with quiet_transformers():
        tokenizer = AutoTokenizer.from_pretrained(model)
        network = AutoModelForCausalLM.from_pretrained(model, dtype="auto")
    if adapter is not None:
        try:
            from peft import PeftModel
        except ImportError as exc:
            raise MissingTrainExtra("peft") from exc
        # Merged: generation is as fast as the base model. This copy of the base belongs to
        # this (model, adapter, device) entry alone, so merging changes nothing shared.
        network = PeftModel.from_pretrained(network, adapter).merge_and_unload()
    network.to(device).eval()
    make_batch_invariant(network)
    return LoadedModel(model=network, tokenizer=tokenizer, device=device, prefixes=PrefixStore(PREFIX_CACHE_BYTES))


class _Progress:
    """A streamed sequence's latest tokens, handed from the decoding thread to the event loop. Only the latest
    matter: a reader that falls behind decodes the newest tokens once, not every step it missed."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop, self.tokens, self.ended, self.changed = loop, [], False, asyncio.Event()

    def post(self, tokens: list[int] | None) -> None:
        """From the decoding thread: the tokens so far, or None once the request is answered."""
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is listening
            self.loop.call_soon_threadsafe(self._set, tokens)

    def _set(self, tokens: list[int] | None) -> None:
        if tokens is None:
            self.ended = True
        else:
            self.tokens = tokens
        self.changed.set()


class TransformersBackend:
    kind = "transformers"
    sampler = SAMPLER  # part of the request cache's key

    def __init__(self, model: str | Path, *, adapter: str | Path | None = None, device: str = "auto",
                 max_batch: int = 32, max_concurrency: int = 16):
        self.model = str(model)
        self.adapter = str(adapter) if adapter is not None else None
        self.adapter_fingerprint = adapter_fingerprint(adapter) if adapter is not None else None
        self.device = resolve_device(device)
        self.max_batch = max_batch
        self.max_concurrency = max_concurrency
        self.calls_made = 0

    def __repr__(self) -> str:
        adapter = f", adapter={self.adapter!r}" if self.adapter else ""
        return f"TransformersBackend(model={self.model!r}{adapter}, device={self.device!r})"

    def load(self) -> LoadedModel:
        """Load now rather than at the first `generate` (loading takes a while for big models)."""
        return load_model(self.model, self.adapter, self.device)

    async def generate(
        self,
        messages: Sequence[MessageLike],
        n: int,
        params: SamplingParams,
        seed: int,
        response_format: dict | None = None,  # ignored, see the module docstring
    ) -> list[str]:
        check_n(n)
        async with self._limit().slot():
            loaded, prompt = await self._prompt(messages, params)
            texts = await asyncio.wrap_future(loaded.decoder(self.max_batch).submit(prompt, n, params, seed))
        self.calls_made += 1
        return texts

    async def stream(self, messages: Sequence[MessageLike], params: SamplingParams, seed: int) -> AsyncIterator[str]:
        """One reply's text as it is decoded (`mascot.llm.streaming`): the same tokens as `generate` samples
        for this request, whatever else is decoded beside it. Closing the stream drops the request."""
        async with self._limit().slot():
            loaded, prompt = await self._prompt(messages, params)
            progress = _Progress(asyncio.get_running_loop())
            future = loaded.decoder(self.max_batch).submit(prompt, 1, params, seed, on_tokens=progress.post)
            future.add_done_callback(lambda _: progress.post(None))  # after the last token's update
            deltas = ReplyDeltas(params.stop)
            try:
                while not progress.ended:
                    await progress.changed.wait()
                    progress.changed.clear()
                    if delta := deltas.update(loaded.decode(progress.tokens)):
                        yield delta
                text = (await asyncio.wrap_future(future))[0]
            finally:
                future.cancel()  # a stream closed early: the decoder drops the request at its next step
        self.calls_made += 1
        if delta := deltas.finish(text):
            yield delta

    def _limit(self) -> Limit:
        # The limit queues requests for the whole run, first shard first, as the HTTP backends' limits do.
        return shared_limit((self.kind, self.model, self.adapter, self.device), self.max_concurrency)

    async def _prompt(self, messages: Sequence[MessageLike], params: SamplingParams) -> tuple[LoadedModel, list[int]]:
        """The loaded model and the prompt's tokens. Loading takes seconds, once; encoding a prompt takes a
        millisecond, so it stays on the event loop and requests gathered at once reach the decoder at once."""
        chat = normalize_messages(messages)
        loaded = _LOADED.get((self.model, self.adapter, self.device)) or await asyncio.to_thread(self.load)
        return loaded, loaded.encode(chat, params.chat_template_kwargs)
