"""The in-process transformers backend on the tiny Qwen3 model: seeding, n, greedy, stop, adapters."""

from __future__ import annotations

import asyncio
import sys

import pytest

from mascot.config import BackendConfig, SamplingParams
from mascot.data.context import Message
from mascot.llm import BackendError, CachedBackend, MissingTrainExtra, RequestCache, make_backend
from mascot.llm.transformers_backend import TransformersBackend, require_torch

pytest.importorskip("torch")

MESSAGES = [{"role": "system", "content": "You are The Beacon."}, {"role": "user", "content": "I got the job!"}]
PARAMS = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=24)


@pytest.fixture(scope="module")
def lm_dir(tiny_models):
    return tiny_models.lm


@pytest.fixture(scope="module")
def backend(lm_dir):
    return TransformersBackend(lm_dir, device="cpu")


def generate(backend, n=3, params=PARAMS, seed=0, messages=MESSAGES):
    return asyncio.run(backend.generate(messages, n, params, seed))


def test_returns_n_texts_and_the_same_seed_gives_the_same_texts(backend):
    first = generate(backend, n=3, seed=1)
    assert len(first) == 3 and all(isinstance(text, str) for text in first)
    assert generate(backend, n=3, seed=1) == first
    assert generate(backend, n=3, seed=2) != first
    assert len(set(first)) > 1  # sampled, not one reply repeated


def test_pydantic_messages_give_the_same_texts_as_dicts(backend):
    as_models = [Message(**message) for message in MESSAGES]
    assert generate(backend, n=2, seed=3, messages=as_models) == generate(backend, n=2, seed=3)


def test_greedy_decoding_repeats_its_one_answer(backend):
    texts = generate(backend, n=3, params=PARAMS.model_copy(update={"temperature": 0.0}), seed=0)
    assert len(texts) == 3 and len(set(texts)) == 1


def test_output_is_cut_at_a_stop_string(backend):
    (full,) = generate(backend, n=1, seed=4)
    # Two characters from inside the reply, without whitespace (which `strip` would blur).
    stop = next((full[i:i + 2] for i in range(1, len(full) - 1) if not full[i:i + 2].isspace()
                 and full[i:i + 2].strip() == full[i:i + 2]), None)
    assert stop is not None, f"the tiny model's reply is too short to test stop strings: {full!r}"
    (cut,) = generate(backend, n=1, seed=4, params=PARAMS.model_copy(update={"stop": [stop]}))
    assert cut == full[: full.find(stop)].strip()


def test_model_is_loaded_once_per_process(lm_dir, backend):
    other = TransformersBackend(str(lm_dir), device="cpu")
    assert other.load() is backend.load()


def test_generation_leaves_the_event_loop_free(backend):
    async def run():
        ticks = 0
        task = asyncio.create_task(backend.generate(MESSAGES, 2, PARAMS.model_copy(update={"max_new_tokens": 64}), 0))
        while not task.done():
            ticks += 1
            await asyncio.sleep(0.001)
        return ticks, await task

    ticks, texts = asyncio.run(run())
    assert len(texts) == 2 and ticks > 1


def test_lora_adapter_is_loaded_and_changes_the_samples(lm_dir, backend, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(lm_dir)
    # init_lora_weights=False: random B matrices, so the adapter really changes the model (the
    # default init is an exact no-op until trained).
    lora = LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(base, lora).save_pretrained(tmp_path / "adapter")

    adapted = TransformersBackend(lm_dir, adapter=tmp_path / "adapter", device="cpu")
    assert adapted.adapter_fingerprint.startswith(f"{tmp_path / 'adapter'}@sha256:")
    with_adapter = generate(adapted, n=2, seed=5)
    assert len(with_adapter) == 2
    assert with_adapter == generate(adapted, n=2, seed=5)
    assert with_adapter != generate(backend, n=2, seed=5)
    assert adapted.load() is not backend.load()


def test_make_backend_builds_the_transformers_backend(lm_dir, tmp_path):
    config = BackendConfig(kind="transformers", model="tiny:lm", device="cpu", params=PARAMS)
    with pytest.raises(BackendError, match="tiny:lm"):
        make_backend(config)
    cache = RequestCache(tmp_path / "requests.sqlite")
    backend = make_backend(config.model_copy(update={"model": str(lm_dir)}), cache=cache)
    assert isinstance(backend, CachedBackend) and isinstance(backend.backend, TransformersBackend)
    assert backend.kind == "transformers" and backend.model == str(lm_dir)
    first = asyncio.run(backend.generate(MESSAGES, 2, config.params, 9))
    assert asyncio.run(backend.generate(MESSAGES, 2, config.params, 9)) == first
    assert backend.backend.calls_made == 1 and cache.stats().hits == 1


def test_missing_torch_tells_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    with pytest.raises(MissingTrainExtra, match=r"pip install 'mascot\[train\]'") as caught:
        require_torch()
    assert isinstance(caught.value, ImportError)


def test_a_request_leaves_the_processs_random_states_as_it_found_them(backend):
    # GRPO samples from these states between the rollouts its reward functions generate here; whether a
    # rollout was generated or answered by the request cache must not change what GRPO samples next.
    import random

    import numpy
    import torch

    random.seed(11), numpy.random.seed(11), torch.manual_seed(11)
    expected = random.random(), numpy.random.random(), torch.rand(1).item()
    random.seed(11), numpy.random.seed(11), torch.manual_seed(11)
    generate(backend, n=2, seed=5)
    assert (random.random(), numpy.random.random(), torch.rand(1).item()) == expected
