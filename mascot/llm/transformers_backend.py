"""In-process backend: a transformers causal LM (optionally with a PEFT adapter) on this machine.

Used by the offline profile (tiny models on a laptop CPU) and for quick checks of a trained
adapter without starting a server. Models are loaded once per process and shared by every
backend that names the same (model, adapter, device).

Generation is seeded with `transformers.set_seed`, which sets global RNG state; one process-wide
lock therefore serialises generation, so the same (messages, params, seed) always gives the same
texts. The RNG states are put back afterwards (`_seeded`), so a request changes nothing that the
rest of the process samples next. It runs in a worker thread, so the event loop stays free for
other work meanwhile.

`response_format` is accepted and ignored: plain `generate` cannot constrain output to a JSON
schema. Callers that need structured output parse and retry, as the judges do.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mascot.config import SamplingParams
from mascot.llm.base import MessageLike, check_n, normalize_messages, truncate_at_stop
from mascot.llm.limits import shared_limit
from mascot.torch_runtime import MissingTrainExtra, quiet_transformers, require_torch, resolve_device

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    model: Any  # transformers PreTrainedModel (adapter merged in, when there is one)
    tokenizer: Any
    device: str


_LOADED: dict[tuple[str, str | None, str], LoadedModel] = {}
_LOAD_LOCK = threading.Lock()
# set_seed touches global RNG state, so generation runs one call at a time in the process.
_GENERATE_LOCK = threading.Lock()


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
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return LoadedModel(model=network, tokenizer=tokenizer, device=device)


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """`set_seed(seed)` inside the block; outside it, Python's, NumPy's and torch's RNG states as they were.

    A trainer in the same process samples from those states too: GRPO's reward functions generate
    rollouts here between its own sampling steps. Left changed, what GRPO samples next would depend
    on whether the rollouts were generated or answered by the request cache, and a resumed run
    would train a different policy from a fresh one.
    """
    import numpy
    import torch
    from transformers import set_seed

    states = random.getstate(), numpy.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        set_seed(seed)
        try:
            yield
        finally:
            random.setstate(states[0])
            numpy.random.set_state(states[1])


class TransformersBackend:
    kind = "transformers"

    def __init__(self, model: str | Path, *, adapter: str | Path | None = None, device: str = "auto"):
        self.model = str(model)
        self.adapter = str(adapter) if adapter is not None else None
        self.adapter_fingerprint = adapter_fingerprint(adapter) if adapter is not None else None
        self.device = resolve_device(device)
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
        chat = normalize_messages(messages)
        # Generation is one call at a time anyway (the lock below); queueing for it in order means the
        # shard that asked first is answered first, as with the HTTP backends' limits.
        async with shared_limit("transformers.generate", 1).slot():
            return await asyncio.to_thread(self._generate_blocking, chat, n, params, seed)

    def _generate_blocking(self, chat: list[dict], n: int, params: SamplingParams, seed: int) -> list[str]:
        torch = require_torch()
        loaded = self.load()
        tokenizer, network = loaded.tokenizer, loaded.model
        inputs = tokenizer.apply_chat_template(
            chat, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt",
            **params.chat_template_kwargs,
        ).to(loaded.device)
        sampling = params.temperature > 0
        options: dict[str, Any] = {
            "max_new_tokens": params.max_new_tokens,
            "do_sample": sampling,
            "pad_token_id": tokenizer.pad_token_id,
        }
        if sampling:
            options.update(temperature=params.temperature, top_p=params.top_p, num_return_sequences=n)
        else:
            # Greedy decoding gives one answer; sampling options would only raise warnings.
            options.update(temperature=None, top_p=None, top_k=None)
        if params.stop:
            options.update(stop_strings=list(params.stop), tokenizer=tokenizer)
        with _GENERATE_LOCK, torch.inference_mode(), _seeded(seed):
            output = network.generate(**inputs, **options)
        new_tokens = output[:, inputs["input_ids"].shape[1]:]
        texts = [
            truncate_at_stop(text, params.stop).strip()
            for text in tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
        ]
        self.calls_made += 1
        return texts if sampling else texts * n
