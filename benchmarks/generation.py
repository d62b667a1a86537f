"""Throughput of the in-process backend: batched decoding against one sequence at a time, in one run.

    python benchmarks/generation.py [--requests 64 --tokens 32 --max-batch 16 --config configs/tiny.yaml]

The model is the config's tiny language model (built, or found in the cache, as `make demo` does),
and the requests are Stage 1's own: Speaker prompts for the config's sample contexts and personas,
of mixed lengths, each with its own seed. For K=1 and K=8 (one request asking for K replies) it times:

- `serial`: the same backend with `max_batch` 1, one request at a time. Every ratio is against it.
- `generate`: transformers' `generate`, one request at a time with `set_seed`: the path the backend
  took before it batched, for reference. Its sampler differs, so its texts are not compared.
- `batched`: `max_batch` --max-batch at concurrency 1, 8 and 32 (requests in flight at once).

Generated tokens are counted by the forward passes themselves (a hook on the model: one token per
sequence per pass), and so is the mean number of sequences in a pass; `generate`'s tokens by its
output. The last column checks each batched side's texts against the serial side's, request by
request: they must be identical.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def requests(config, count: int, tokens: int) -> list[tuple[list[dict], int]]:
    """`count` Stage 1 Speaker prompts (contexts x personas, cycling) and their request seeds."""
    from mascot.data import load_corpus
    from mascot.prompts import speaker_messages
    from mascot.queries import build_queries, request_seed
    from mascot.roster import load_roster

    queries = build_queries(load_corpus(config.data.corpus), load_roster(config.data.roster).active)
    picked = [queries[i % len(queries)] for i in range(count)]
    return [(speaker_messages(q.persona, q.context), request_seed(config.run.seed, q.id, str(i)))
            for i, q in enumerate(picked)]


def timed_backend(backend, work, k: int, params, concurrency: int) -> tuple[float, list[int], list]:
    """Seconds, the sequences of each forward pass (a hook on the model) and the texts of `work` at `concurrency`."""
    generated = []
    hook = backend.load().model.register_forward_hook(
        lambda module, args, kwargs, output: generated.append(len(kwargs["logits_to_keep"])), with_kwargs=True)

    async def run():
        limit = asyncio.Semaphore(concurrency)

        async def one(messages, seed):
            async with limit:
                return await backend.generate(messages, k, params, seed)

        return await asyncio.gather(*(one(messages, seed) for messages, seed in work))

    try:
        began = time.perf_counter()
        texts = asyncio.run(run())
        return time.perf_counter() - began, generated, texts
    finally:
        hook.remove()


def timed_generate(loaded, work, k: int, params) -> tuple[float, int]:
    """transformers' `generate`, one request at a time, seeded with `set_seed`: the pre-batching path."""
    import torch
    from transformers import set_seed

    tokenizer, model = loaded.tokenizer, loaded.model
    began, generated = time.perf_counter(), 0
    for messages, seed in work:
        inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                               return_tensors="pt")
        set_seed(seed)
        with torch.inference_mode():
            output = model.generate(**inputs, max_new_tokens=params.max_new_tokens, do_sample=True,
                                    temperature=params.temperature, top_p=params.top_p, num_return_sequences=k,
                                    pad_token_id=tokenizer.eos_token_id)
        new = output[:, inputs["input_ids"].shape[1]:]
        generated += int((new != tokenizer.eos_token_id).sum())
    return time.perf_counter() - began, generated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "tiny.yaml", help="Its tiny:lm is the model.")
    parser.add_argument("--requests", type=int, default=64, help="Requests per side.")
    parser.add_argument("--tokens", type=int, default=32, help="max_new_tokens of every request.")
    parser.add_argument("--max-batch", type=int, default=16, help="The batched sides' max_batch.")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32], help="Batched sides' concurrency.")
    parser.add_argument("--k", type=int, nargs="+", default=[1, 8], help="Replies per request.")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from mascot.config import SamplingParams, load_config
    from mascot.llm.transformers_backend import TransformersBackend
    from mascot.train.tiny import build_tiny_models

    config = load_config(args.config)
    lm = build_tiny_models(config.tiny, config.cache.root).lm
    params = SamplingParams(temperature=config.generation.params.temperature, top_p=config.generation.params.top_p,
                            max_new_tokens=args.tokens)
    work = requests(config, args.requests, args.tokens)
    serial = TransformersBackend(lm, device="cpu", max_batch=1)
    batched = TransformersBackend(lm, device="cpu", max_batch=args.max_batch, max_concurrency=max(args.concurrency))
    # `generate` needs the model as transformers loads it: the backend's copy decodes only in its batches.
    reference = argparse.Namespace(tokenizer=serial.load().tokenizer,
                                   model=AutoModelForCausalLM.from_pretrained(lm).eval())
    asyncio.run(batched.generate(work[0][0], 1, params, 0))  # first-call costs stay out of every side

    print(f"{args.requests} requests, max_new_tokens {args.tokens}, temperature {params.temperature}, top_p "
          f"{params.top_p}; {lm} on the CPU ({torch.get_num_threads()} threads)")
    print(f"{'K':>2} {'side':<8} {'conc':>4} {'max_batch':>9} {'req/s':>7} {'tok/s':>7} {'x serial':>8} "
          f"{'seqs/pass':>9}  same texts as serial")
    for k in args.k:
        seconds, passes, expected = timed_backend(serial, work, k, params, 1)
        base = args.requests / seconds
        print(f"{k:>2} {'serial':<8} {1:>4} {1:>9} {base:>7.1f} {sum(passes) / seconds:>7.0f} {1.0:>8.2f} "
              f"{sum(passes) / len(passes):>9.1f}  -")
        seconds, tokens = timed_generate(reference, work, k, params)
        print(f"{k:>2} {'generate':<8} {1:>4} {'-':>9} {args.requests / seconds:>7.1f} {tokens / seconds:>7.0f} "
              f"{args.requests / seconds / base:>8.2f} {'-':>9}  (another sampler)")
        for concurrency in args.concurrency:
            seconds, passes, texts = timed_backend(batched, work, k, params, concurrency)
            same = sum(a == b for a, b in zip(texts, expected))
            print(f"{k:>2} {'batched':<8} {concurrency:>4} {args.max_batch:>9} {args.requests / seconds:>7.1f} "
                  f"{sum(passes) / seconds:>7.0f} {args.requests / seconds / base:>8.2f} "
                  f"{sum(passes) / len(passes):>9.1f}  {same}/{len(texts)}")


if __name__ == "__main__":
    main()
