"""Throughput of the in-process backend: batched decoding against one sequence at a time, in one run.

    python benchmarks/generation.py [--requests 64 --tokens 32 --max-batch 32 --rounds 3 --config configs/tiny.yaml]

The model is the config's tiny language model (built, or found in the cache, as `make demo` does),
and the requests are Stage 1's own: Speaker prompts for the config's sample contexts and personas,
of mixed lengths, each with its own seed. For K=1 and K=8 (one request asking for K replies) it times:

- `serial`: the same backend with `max_batch` 1, one request at a time. Every ratio is against it.
- `generate`: transformers' `generate`, one request at a time with `set_seed`: the path the backend
  took before it batched, for reference. Its sampler differs, so its texts are not compared.
- `batched`: `max_batch` --max-batch (the config's default, 32) at concurrency 1, 8 and 32 (requests in
  flight at once).

Generated tokens are those of the returned texts, tokenized again, for every side. The mean number
of sequences decoding in a forward pass is counted by the passes themselves (a hook on the model).
The last column checks each batched side's texts against the serial side's, request by request:
they must be identical. Prompts share the prefix store of the loaded model (`PrefixStore`), as in a
run: the serial side runs first, with the store empty.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mascot.config import BackendConfig


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
    """Seconds, the sequences decoding in each forward pass (a hook on the model: its one-token pieces; prompt
    chunks are longer) and the texts of `work` at `concurrency`."""
    generated = []
    hook = backend.load().model.register_forward_hook(
        lambda module, args, kwargs, output: generated.append(sum(length == 1 for _, length, *_ in kwargs["segments"])),
        with_kwargs=True)

    async def run():
        limit = asyncio.Semaphore(concurrency)

        async def one(messages, seed):
            async with limit:
                return await backend.generate(messages, k, params, seed)

        return await asyncio.gather(*(one(messages, seed) for messages, seed in work))

    try:
        began = time.perf_counter()
        texts = asyncio.run(run())
        return time.perf_counter() - began, [count for count in generated if count], texts
    finally:
        hook.remove()


def generated_tokens(tokenizer, texts: list[list[str]]) -> int:
    return sum(len(tokenizer.encode(text)) for replies in texts for text in replies)


def timed_generate(loaded, work, k: int, params) -> tuple[float, list]:
    """transformers' `generate`, one request at a time, seeded with `set_seed`: the pre-batching path."""
    import torch
    from transformers import set_seed

    tokenizer, model = loaded.tokenizer, loaded.model
    began, texts = time.perf_counter(), []
    for messages, seed in work:
        inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                               return_tensors="pt")
        set_seed(seed)
        with torch.inference_mode():
            output = model.generate(**inputs, max_new_tokens=params.max_new_tokens, do_sample=True,
                                    temperature=params.temperature, top_p=params.top_p, num_return_sequences=k,
                                    pad_token_id=tokenizer.eos_token_id)
        texts.append(tokenizer.batch_decode(output[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
    return time.perf_counter() - began, texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "tiny.yaml", help="Its tiny:lm is the model.")
    parser.add_argument("--requests", type=int, default=64, help="Requests per side.")
    parser.add_argument("--tokens", type=int, default=32, help="max_new_tokens of every request.")
    parser.add_argument("--max-batch", type=int, default=BackendConfig.model_fields["max_batch"].default,
                        help="The batched sides' max_batch (default: the config's default).")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32], help="Batched sides' concurrency.")
    parser.add_argument("--k", type=int, nargs="+", default=[1, 8], help="Replies per request.")
    parser.add_argument("--rounds", type=int, default=3, help="Rounds of every side, in turn; medians are printed.")
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
          f"{params.top_p}; {lm} on the CPU ({torch.get_num_threads()} threads); medians of {args.rounds} rounds")
    print(f"{'K':>2} {'side':<8} {'conc':>4} {'max_batch':>9} {'req/s':>7} {'tok/s':>7} {'x serial':>8} "
          f"{'seqs/pass':>9}  same texts as serial")
    tokenizer, compared, differing = reference.tokenizer, 0, 0
    sides = [("serial", serial, 1), ("generate", None, 1)] + [("batched", batched, c) for c in args.concurrency]
    for k in args.k:
        measured = {index: [] for index in range(len(sides))}  # per side: (req/s, tok/s, seqs/pass, same texts)
        for _ in range(args.rounds):  # sides take turns, so a slower spell of the machine hits them all
            for index, (name, backend, concurrency) in enumerate(sides):
                if backend is None:
                    seconds, texts = timed_generate(reference, work, k, params)
                    passes, same = [], None
                else:
                    backend.load().prefixes.clear()  # every side starts with no prompt's chunks stored
                    seconds, passes, texts = timed_backend(backend, work, k, params, concurrency)
                    if name == "serial":
                        expected = texts
                    same = sum(a == b for a, b in zip(texts, expected))
                    if name == "batched":
                        compared, differing = compared + generated_tokens(tokenizer, texts), differing + len(texts) - same
                measured[index].append((args.requests / seconds, generated_tokens(tokenizer, texts) / seconds,
                                        sum(passes) / len(passes) if passes else None, same))
        for index, (name, backend, concurrency) in enumerate(sides):
            rows = measured[index]
            ratio = statistics.median(row[0] / base[0] for row, base in zip(rows, measured[0]))
            fill = f"{statistics.median(row[2] for row in rows):>9.1f}" if rows[0][2] is not None else f"{'-':>9}"
            texts = ("-" if name == "serial" else "(another sampler)" if backend is None
                     else f"{min(row[3] for row in rows)}/{args.requests}")
            print(f"{k:>2} {name:<8} {concurrency:>4} {'-' if backend is None else backend.max_batch:>9} "
                  f"{statistics.median(row[0] for row in rows):>7.1f} {statistics.median(row[1] for row in rows):>7.0f} "
                  f"{ratio:>8.2f} {fill}  {texts}")
    print(f"batched sides against serial: {differing} of {len(args.k) * len(args.concurrency) * args.requests * args.rounds} "
          f"requests differ, over {compared:,} generated tokens")
    if differing:
        sys.exit("a request's text changed with its batch")


if __name__ == "__main__":
    main()
