"""The in-process transformers backend on the tiny Qwen3 model: seeding, n, greedy, stop, adapters, batching."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys

import pytest

from mascot.config import BackendConfig, SamplingParams
from mascot.data.context import Message
from mascot.llm import (
    BackendError,
    CachedBackend,
    MissingTrainExtra,
    RequestCache,
    make_backend,
    normalize_messages,
)
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
    # The first seed whose reply is long enough to cut: the tiny model sometimes ends at once.
    seed, full = next((seed, text) for seed in range(4, 40) for (text,) in [generate(backend, n=1, seed=seed)]
                      if len(text) > 8)
    # Two characters from inside the reply, without whitespace (which `strip` would blur).
    stop = next((full[i:i + 2] for i in range(1, len(full) - 1) if not full[i:i + 2].isspace()
                 and full[i:i + 2].strip() == full[i:i + 2]), None)
    assert stop is not None, f"no stop string to cut at in {full!r}"
    (cut,) = generate(backend, n=1, seed=seed, params=PARAMS.model_copy(update={"stop": [stop]}))
    assert cut == full[: full.find(stop)].strip()


def test_model_is_loaded_once_per_process(lm_dir, backend):
    other = TransformersBackend(str(lm_dir), device="cpu")
    assert other.load() is backend.load()


def test_generation_leaves_the_event_loop_free(backend):
    async def run():
        ticks = 0
        # Eight samples, so that some write on for many steps (the tiny model often ends at once).
        task = asyncio.create_task(backend.generate(MESSAGES, 8, PARAMS.model_copy(update={"max_new_tokens": 64}), 0))
        while not task.done():
            ticks += 1
            await asyncio.sleep(0.001)
        return ticks, await task

    ticks, texts = asyncio.run(run())
    assert len(texts) == 8 and max(len(text.split()) for text in texts) > 10 and ticks > 1


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


GREEDY = PARAMS.model_copy(update={"temperature": 0.0})
# Eight prompts of different lengths (about 30 to 200 tokens), so a batch packs sequences of every length.
SENTENCES = ["I failed my driving test again this morning.", "My sister says I should just try harder.",
             "Honestly I am tired of feeling like the slow one.", "The instructor was kind about it, though.",
             "We agreed to book another lesson next week.", "Money is tight, so every lesson counts.",
             "Part of me wants to give up for a while.", "What would you do in my place?"]
PROMPTS = [[{"role": "system", "content": ["You are The Anchor.", "You are The Catalyst.", "You are The Beacon."][i % 3]},
            {"role": "user", "content": " ".join(SENTENCES[i:] + SENTENCES[:i] * (i // 2))}] for i in range(8)]


@contextlib.contextmanager
def forward_passes(backend):
    """Each forward pass of the backend's model, as the model sees it: the positions of its input tokens
    (one per decoding sequence, chunks of a prompt for a joining one) and how many sequences it holds
    (the distinct caches its pieces write to: a prompt's chunks share one)."""
    passes = []
    hook = backend.load().model.register_forward_hook(
        lambda module, args, kwargs, output: passes.append(
            (kwargs["position_ids"][0].tolist(), len({id(cache) for _, _, cache, _ in kwargs["segments"]}))),
        with_kwargs=True)
    try:
        yield passes
    finally:
        hook.remove()


async def all_at_once(backend, requests):
    return await asyncio.gather(*(backend.generate(messages, n, params, seed) for messages, n, params, seed in requests))


@pytest.mark.parametrize("params", [PARAMS, GREEDY], ids=["sampling", "greedy"])
def test_a_requests_texts_do_not_depend_on_its_batch(lm_dir, params):
    serial = TransformersBackend(lm_dir, device="cpu", max_batch=1)
    batched = TransformersBackend(lm_dir, device="cpu", max_batch=16)
    requests = [(PROMPTS[i], 1, params, 100 + i) for i in range(8)]
    alone = [generate(serial, n, p, seed, messages) for messages, n, p, seed in requests]
    # Enough text to compare: the tiny model often ends at once, greedily above all.
    assert len({text for (text,) in alone if text}) >= 3 and sum(len(text.split()) for (text,) in alone) >= 40

    with forward_passes(batched) as passes:
        together = asyncio.run(all_at_once(batched, requests))
    assert max(sequences for _, sequences in passes) >= 4, "the requests did not share forward passes"
    assert together == alone
    assert asyncio.run(all_at_once(batched, requests[::-1]))[::-1] == alone

    # Mixed with requests of other lengths, n and limits, which join and leave at other steps.
    others = [(PROMPTS[7 - i][:1] + [{"role": "user", "content": "Tell me more."}], 2, PARAMS.model_copy(
        update={"max_new_tokens": 6 + 5 * i}), 900 + i) for i in range(8)]
    mixed = asyncio.run(all_at_once(batched, [r for pair in zip(others, requests) for r in pair]))
    assert mixed[1::2] == alone


def test_n_samples_are_one_request_whose_rows_do_not_depend_on_the_batch(lm_dir):
    serial = TransformersBackend(lm_dir, device="cpu", max_batch=1)
    batched = TransformersBackend(lm_dir, device="cpu", max_batch=16)
    with forward_passes(serial) as passes:
        alone = generate(serial, n=4, seed=7, messages=PROMPTS[3])
    assert len(alone) == 4 and len(set(alone)) > 1
    # max_batch 1: one pass over the prompt, then its four sequences one after the other.
    assert [sequences for _, sequences in passes] == [1] * len(passes) and len(passes) > 4
    crowd = [(PROMPTS[i], 1, PARAMS, 300 + i) for i in range(6)]
    together = asyncio.run(all_at_once(batched, crowd[:3] + [(PROMPTS[3], 4, PARAMS, 7)] + crowd[3:]))
    assert together[3] == alone


def test_a_sequence_that_ends_leaves_the_batch(lm_dir):
    backend = TransformersBackend(lm_dir, device="cpu", max_batch=8)
    long = PARAMS.model_copy(update={"max_new_tokens": 40})
    seed = next(seed for seed in range(60) if len(generate(backend, 1, long, seed, PROMPTS[0])[0].split()) >= 15)
    with forward_passes(backend) as passes:
        asyncio.run(all_at_once(backend, [(PROMPTS[0], 1, long, seed),
                                          (PROMPTS[1], 1, PARAMS.model_copy(update={"max_new_tokens": 3}), 1)]))
    sequences = [count for _, count in passes]
    assert max(sequences) == 2 and len(sequences) > 10
    assert set(sequences[5:]) == {1}, "the three-token request kept its place after it ended"


def test_a_cancelled_request_leaves_the_batch_and_the_rest_are_answered(lm_dir):
    backend = TransformersBackend(lm_dir, device="cpu", max_batch=8)
    params = PARAMS.model_copy(update={"max_new_tokens": 48})
    # The victim's prompt is longer than any other sequence gets, so its positions tell its tokens apart.
    victim = [{"role": "system", "content": "You are The Anchor."}, {"role": "user", "content": "Again. " * 150}]
    # A seed with which the victim, alone, writes on well past the cancellation.
    seed = next(seed for seed in range(5, 60) if len(generate(backend, 1, params, seed, victim)[0].split()) >= 12)
    requests = [(PROMPTS[i], 1, params, 40 + i) for i in range(3)] + [(victim, 1, params, seed)]
    alone = [generate(backend, n, p, seed, messages) for messages, n, p, seed in requests]
    victim_start = len(backend.load().encode(normalize_messages(victim), {})) - 1  # its prompt's last position
    assert all(len(backend.load().encode(normalize_messages(m), {})) + 48 < victim_start for m, *_ in requests[:3])

    async def cancel_the_victim_once_it_decodes():
        with forward_passes(backend) as passes:
            tasks = [asyncio.create_task(backend.generate(m, n, p, seed)) for m, n, p, seed in requests]
            # Its prompt's last position through a pass: it holds a place in the batch. (After a fixed number of
            # passes, a loaded machine may still be filling its prompt in chunks, and it never had a place to keep.)
            while not any(max(positions) >= victim_start for positions, _ in passes[:]) and not tasks[3].done():
                await asyncio.sleep(0.001)
            tasks[3].cancel()
            # cancel() only asks: the decoder thread may run passes until the task has taken its CancelledError,
            # more of them on a loaded machine, so count from when the cancellation has reached the backend.
            await asyncio.gather(tasks[3], return_exceptions=True)
            cancelled_at = len(passes)
            return await asyncio.gather(*tasks, return_exceptions=True), passes, cancelled_at

    answers, passes, cancelled_at = asyncio.run(cancel_the_victim_once_it_decodes())
    assert isinstance(answers[3], asyncio.CancelledError)
    assert answers[:3] == alone[:3]
    with_victim = [i for i, (positions, _) in enumerate(passes) if max(positions) >= victim_start]
    assert with_victim and max(with_victim) <= cancelled_at + 1, "the cancelled request kept its place in the batch"
    assert len(passes) > cancelled_at + 4, "the others finished before the cancellation could show"


def test_the_concurrency_limit_holds_for_every_thread_of_the_process(lm_dir):
    import threading

    backend = TransformersBackend(lm_dir, device="cpu", max_batch=16, max_concurrency=3)

    def shard(offset):
        asyncio.run(all_at_once(backend, [(PROMPTS[i % 8], 1, PARAMS, offset + i) for i in range(6)]))

    with forward_passes(backend) as passes:
        threads = [threading.Thread(target=shard, args=(offset,)) for offset in (0, 100)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert max(sequences for _, sequences in passes) == 3


def test_a_sequences_logits_are_bitwise_the_same_alone_and_packed_with_others(lm_dir):
    # Equal texts could hide logits that differ in their last bits, which flip a token once in a long while.
    import torch

    from mascot.llm.batched_decoding import packed_forward
    from mascot.llm.kv_cache import SequenceCache, prompt_pieces

    loaded = TransformersBackend(lm_dir, device="cpu").load()
    # Each prompt, and the token it decodes next.
    prompts = [(loaded.encode(normalize_messages(messages), {}), 7 + i) for i, messages in enumerate(PROMPTS)]

    def prefill_then_one_step(group):
        caches = [SequenceCache(loaded.model.config, len(prompt) + 2, "cpu", torch.float32) for prompt, _ in group]
        with torch.inference_mode():
            # Each prompt's logits are those of its last chunk, the last of its pieces.
            pieces = [prompt_pieces(prompt, cache) for (prompt, _), cache in zip(group, caches)]
            ends = torch.tensor(list(itertools.accumulate(len(p) for p in pieces))) - 1
            first = packed_forward(loaded.model, [piece for p in pieces for piece in p])[ends]
            second = packed_forward(loaded.model, [([token], cache, cache.length)
                                                   for (_, token), cache in zip(group, caches)])
        return first, second

    alone = [torch.cat(logits) for logits in zip(*(prefill_then_one_step([prompt]) for prompt in prompts))]
    together = prefill_then_one_step(prompts)
    backwards = [logits.flip(0) for logits in prefill_then_one_step(prompts[::-1])]
    for step in range(2):
        assert torch.equal(together[step], alone[step]) and torch.equal(backwards[step], alone[step])


def test_a_prompt_that_starts_like_an_earlier_one_reuses_its_chunks_and_writes_the_same(lm_dir):
    backend = TransformersBackend(lm_dir, device="cpu", max_batch=4)
    prefixes = backend.load().prefixes
    earlier = [{"role": "system", "content": " ".join(SENTENCES * 3)}, {"role": "user", "content": "What now?"}]
    later = earlier[:1] + [{"role": "user", "content": "And what then, do you think?"}]
    prefixes.clear()
    with forward_passes(backend) as passes:
        fresh = generate(backend, 3, PARAMS, 3, later)
    assert min(passes[0][0]) == 0, "with nothing stored, the prompt is read from its first token"

    prefixes.clear()
    generate(backend, 1, PARAMS, 5, earlier)  # stores the chunks of the system prompt they share
    with forward_passes(backend) as passes:
        reused = generate(backend, 3, PARAMS, 3, later)
    assert min(passes[0][0]) >= 128, "the shared chunks were read again instead of reused"
    assert reused == fresh


def test_the_prefix_store_keeps_to_its_capacity_and_evicts_a_prompts_end_first(lm_dir):
    import torch
    from transformers import AutoConfig

    from mascot.llm.kv_cache import PREFILL_CHUNK, PrefixStore, SequenceCache

    config = AutoConfig.from_pretrained(lm_dir)
    prompt = list(range(4 * PREFILL_CHUNK + 5))
    filled = SequenceCache(config, len(prompt), "cpu", torch.float32)
    filled.keys.normal_(), filled.values.normal_()
    filled.length = len(prompt)
    chunk_bytes = 2 * filled.keys[:, :, :, :PREFILL_CHUNK].nbytes
    store = PrefixStore(capacity=2 * chunk_bytes)
    store.keep(prompt, filled)
    assert store._bytes == 2 * chunk_bytes

    again = SequenceCache(config, len(prompt), "cpu", torch.float32)
    store.reuse(prompt[:3 * PREFILL_CHUNK] + [9999] * 40, again)
    assert again.length == 2 * PREFILL_CHUNK, "the first two chunks stay; the last two went first"
    assert torch.equal(again.keys[:, :, :, :again.length], filled.keys[:, :, :, :again.length])
