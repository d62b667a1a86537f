"""Batched decoding for the in-process backend, with each request's text independent of its batch.

Requests for the same loaded model are decoded together: each step runs one forward pass for every
sequence in flight. A request joins at the next step after it arrives and leaves as soon as it is
done (continuous batching), so no request waits for a batch to drain. What a request generates must
not depend on which other requests share its steps, so nothing in a step mixes sequences:

- No padding. The new tokens of every sequence in the step are packed into one row, each with its
  own positions. Attention runs per sequence over that sequence's own keys, in the same shapes as
  when it runs alone.
- Linear layers multiply fixed blocks of rows. A BLAS picks its kernel, and with it the order of its
  sums, by the matrix's shape. On a CPU with torch 2.13, a row multiplied inside a 1-row, 2-row or
  9-row matrix differs in its last bits. Cut into zero-padded blocks of `LINEAR_BLOCK_ROWS`, every row
  is multiplied in a matrix of one shape, and within one shape a row's result depends on neither its
  place nor its neighbours.
- Each sequence samples from its own torch.Generator, seeded by the request's seed and the
  sequence's index. No process-wide random state is read or changed, so a trainer sampling in the
  same process draws the same numbers whether a request ran or came from the cache.

Prompts are read in chunks at fixed positions, and their shared beginnings are read once
(`mascot.llm.kv_cache`).

Sampling is temperature then top-p, as the OpenAI-style parameters describe; there is no top-k.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mascot.config import SamplingParams
from mascot.llm.base import truncate_at_stop
from mascot.llm.kv_cache import PrefixStore, SequenceCache, prompt_pieces

log = logging.getLogger(__name__)

LINEAR_BLOCK_ROWS = 64
ATTENTION = "mascot_per_sequence"
# Names what the texts depend on besides the request, for the request cache's key: a change to how
# tokens are sampled here must not be answered by records of the old way.
SAMPLER = "per-sequence-generators/temperature-top-p/v1"


def make_batch_invariant(model: Any) -> None:
    """Make `model` (a transformers causal LM owned by the caller) compute each sequence as if alone."""
    import torch
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, _per_sequence_attention)
    model.set_attn_implementation(ATTENTION)
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.forward = functools.partial(_blocked_linear, module)


def _blocked_linear(layer: Any, inputs: Any) -> Any:
    """`layer(inputs)`, as one batched product of (LINEAR_BLOCK_ROWS x in) blocks by the weight."""
    import torch
    import torch.nn.functional as F

    rows = inputs.reshape(-1, inputs.shape[-1])
    count = rows.shape[0]
    blocks = F.pad(rows, (0, 0, 0, -count % LINEAR_BLOCK_ROWS)).view(-1, LINEAR_BLOCK_ROWS, rows.shape[1])
    out = torch.bmm(blocks, layer.weight.t().expand(blocks.shape[0], -1, -1)).view(-1, layer.weight.shape[0])[:count]
    if layer.bias is not None:
        out = out + layer.bias
    return out.reshape(*inputs.shape[:-1], -1)


def _per_sequence_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                            scaling: float | None = None, dropout: float = 0.0, segments: list | None = None,
                            sliding_window: int | None = None, **kwargs: Any) -> tuple[Any, None]:
    """Attention for packed sequences: `segments` lists each piece's (start in the packed row, length, cache,
    position of its first token).

    query is (1, heads, tokens, dim), key and value (1, kv_heads, tokens, dim): the step's new tokens.
    A piece's tokens see the sequence's tokens before them and, causally, each other.
    """
    import torch
    import torch.nn.functional as F

    if segments is None:
        raise RuntimeError(f"{ATTENTION} attention runs only inside mascot's batched decoder")
    if sliding_window is not None:
        raise NotImplementedError(f"layer {module.layer_idx} uses sliding-window attention, which the in-process "
                                  "decoder does not implement; serve this model with vLLM (generation.kind: openai)")
    outputs = []
    for start, length, cache, position in segments:
        keys, values = cache.extend(module.layer_idx, position, key.narrow(2, start, length),
                                    value.narrow(2, start, length))
        mask = None
        if length > 1:
            mask = torch.ones(length, position + length, dtype=torch.bool, device=query.device).tril(position)
        outputs.append(F.scaled_dot_product_attention(query.narrow(2, start, length), keys, values,
                                                      attn_mask=mask, scale=scaling, enable_gqa=True))
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


def packed_forward(model: Any, pieces: list[tuple[list[int], SequenceCache, int]]) -> Any:
    """One forward pass over several sequences' new tokens, packed into one row; the logits of each piece's last token.

    A piece is (tokens, the sequence's cache, the position of its first token): a chunk of a prompt,
    or the last sampled token of a sequence that decodes. Their keys and values go into the caches;
    a sequence's pieces come in order.
    """
    import torch

    tokens, positions, segments = [], [], []
    for new, cache, position in pieces:
        segments.append((len(tokens), len(new), cache, position))
        tokens += new
        positions += range(position, position + len(new))
    device = model.device
    last = torch.tensor([start + length - 1 for start, length, _, _ in segments], device=device)
    output = model(input_ids=torch.tensor([tokens], device=device), position_ids=torch.tensor([positions], device=device),
                   use_cache=False, logits_to_keep=last, segments=segments)
    for _, length, cache, position in segments:
        cache.length = max(cache.length, position + length)
    return output.logits[0]


@dataclass(eq=False)
class _Request:
    prompt: list[int]
    n: int
    params: SamplingParams
    seed: int
    future: concurrent.futures.Future
    # Streaming (one sequence): called in the decoding thread with the tokens so far, after each new one.
    on_tokens: Callable[[list[int]], None] | None = None
    admitted: int = 0  # sequences given a place in the batch so far
    sequences: list[_Sequence] = field(default_factory=list)
    # After the prompt's forward pass, until every sequence has started: its cache and last logits.
    prompt_cache: SequenceCache | None = None
    prompt_logits: Any = None

    @property
    def rows(self) -> int:
        """Sequences it decodes: greedy decoding gives one answer, repeated n times at the end."""
        return self.n if self.params.temperature > 0 else 1


@dataclass(eq=False)
class _Sequence:
    request: _Request
    cache: SequenceCache
    generator: Any  # torch.Generator, or None when greedy
    tokens: list[int] = field(default_factory=list)
    done: bool = False


class BatchedDecoder:
    """Decodes every request submitted for one loaded model, at most `max_batch` sequences at a time, in one thread.

    A request for n samples is n sequences that share one forward pass over the prompt. Its sequences
    take places in the batch as places free up, so `max_batch` 1 decodes one sequence at a time.
    """

    def __init__(self, model: Any, tokenizer: Any, tokenizer_lock: threading.Lock, prefixes: PrefixStore, device: str,
                 max_batch: int):
        self.model, self.tokenizer, self.tokenizer_lock, self.prefixes = model, tokenizer, tokenizer_lock, prefixes
        self.device, self.max_batch = device, max_batch
        ends = model.generation_config.eos_token_id
        self.end_ids = {tokenizer.eos_token_id, *(ends if isinstance(ends, list) else [ends])} - {None}
        self.dtype = next(model.parameters()).dtype
        self._waiting: collections.deque[_Request] = collections.deque()  # until all its sequences are admitted
        self._active: list[_Sequence] = []
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, prompt: list[int], n: int, params: SamplingParams, seed: int,
               on_tokens: Callable[[list[int]], None] | None = None) -> concurrent.futures.Future:
        """Queue a request; its future gives n texts. Cancelling the future drops the request at the next step.

        `on_tokens` (for n=1) sees the sequence's tokens after each new one; it runs in the decoding thread,
        so it must return at once (hand the tokens to another thread, say). It changes nothing decoded."""
        if on_tokens is not None and n != 1:
            raise ValueError(f"a streamed request decodes one sequence, got n={n}")
        request = _Request(prompt, n, params, seed, concurrent.futures.Future(), on_tokens)
        with self._wake:
            if self._closed:
                raise RuntimeError("this decoder was closed: its model was unloaded")
            self._waiting.append(request)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="mascot-decoder", daemon=True)
                self._thread.start()
            self._wake.notify()
        return request.future

    def _run(self) -> None:
        import torch

        # Per-step operators are too small to split across threads, and a second OpenMP team in the process
        # (torch used from any other thread) halved this thread's speed on 2 cores. The setting is this thread's.
        torch.set_num_threads(1)
        with torch.inference_mode():
            while True:
                admitted = self._admit()
                if admitted is None:
                    return
                joining, resuming = admitted
                self._active = [s for s in self._active if not s.request.future.cancelled()]
                try:
                    self._step(joining, resuming)
                except Exception as exc:  # every request in the step gets the error; the next step goes on
                    log.exception("batched decoding step failed")
                    failed = {s.request for s in self._active} | {request for request, _ in joining + resuming}
                    for request in failed:
                        _settle(request.future, exception=exc)
                    self._active = []

    def close(self) -> None:
        """End the decoding thread once its work is done; later submissions are refused."""
        with self._wake:
            self._closed = True
            self._wake.notify()

    def _admit(self) -> tuple[list[tuple[_Request, int]], list[tuple[_Request, int]]] | None:
        """Places for waiting sequences beside the active ones, first come first served: (request, sequences) for
        requests whose prompt goes through this step, and for those whose prompt already has. Blocks while idle;
        None once closed and idle."""
        with self._wake:
            while not self._active and not self._waiting:
                if self._closed:
                    return None
                self._wake.wait()
            joining, resuming = [], []
            places = self.max_batch - len(self._active)
            while self._waiting and places > 0:
                request = self._waiting[0]
                if request.future.cancelled():
                    self._waiting.popleft()
                    continue
                count = min(places, request.rows - request.admitted)
                (resuming if request.admitted else joining).append((request, count))
                request.admitted += count
                places -= count
                if request.admitted < request.rows:
                    break  # its other sequences come first, as places free up
                self._waiting.popleft()
            return joining, resuming

    def _step(self, joining: list[tuple[_Request, int]], resuming: list[tuple[_Request, int]]) -> None:
        """One forward pass: the next token of every decoding sequence, and every joining request's prompt."""
        for request, count in resuming:  # their prompt's logits are at hand: their first tokens need no pass
            self._active += self._start(request, count, request.prompt_logits)
        self._finish()  # a first token may have ended a sequence
        pieces = [([sequence.tokens[-1]], sequence.cache, sequence.cache.length) for sequence in self._active]
        prompt_ends = []  # each joining request's last piece: its logits give the first tokens
        for request, _ in joining:
            request.prompt_cache = SequenceCache(self.model.config, len(request.prompt) + request.params.max_new_tokens,
                                                 self.device, self.dtype)
            self.prefixes.reuse(request.prompt, request.prompt_cache)
            pieces += prompt_pieces(request.prompt, request.prompt_cache)
            prompt_ends.append(len(pieces) - 1)
        if not pieces:
            return
        logits = packed_forward(self.model, pieces).float()
        decoding = len(self._active)
        tokens = _sample(logits[:decoding], [s.request.params for s in self._active], [s.generator for s in self._active])
        for sequence, token in zip(self._active, tokens):
            self._append(sequence, token)
        for (request, count), row in zip(joining, prompt_ends):
            self.prefixes.keep(request.prompt, request.prompt_cache)
            self._active += self._start(request, count, logits[row])
        self._finish()

    def _start(self, request: _Request, count: int, prompt_logits: Any) -> list[_Sequence]:
        """`count` more sequences of `request`, each with a copy of the prompt's cache and its first token."""
        import numpy
        import torch

        started = []
        for index in range(len(request.sequences), len(request.sequences) + count):
            generator = None
            if request.params.temperature > 0:
                seed = numpy.random.SeedSequence([request.seed, index]).generate_state(1, numpy.uint64)[0]
                generator = torch.Generator(device=self.device).manual_seed(int(seed))
            last = index == request.rows - 1  # the last one takes the prompt's cache itself
            started.append(_Sequence(request, request.prompt_cache if last else request.prompt_cache.copy(), generator))
        request.sequences += started
        tokens = _sample(prompt_logits.expand(count, -1), [request.params] * count, [s.generator for s in started])
        for sequence, token in zip(started, tokens):
            self._append(sequence, token)
        if len(request.sequences) == request.rows:
            request.prompt_cache = request.prompt_logits = None
        else:
            request.prompt_logits = prompt_logits
        return started

    def _append(self, sequence: _Sequence, token: int) -> None:
        params = sequence.request.params
        if token in self.end_ids:
            sequence.done = True
            return
        sequence.tokens.append(token)
        if sequence.request.on_tokens is not None:
            sequence.request.on_tokens(list(sequence.tokens))
        if len(sequence.tokens) >= params.max_new_tokens:
            sequence.done = True
        elif params.stop:
            with self.tokenizer_lock:
                text = self.tokenizer.decode(sequence.tokens, skip_special_tokens=True)
            sequence.done = any(stop and stop in text for stop in params.stop)

    def _finish(self) -> None:
        """Answer every request whose sequences have all started and ended; keep the others' sequences."""
        for request in {sequence.request: None for sequence in self._active if sequence.done}:
            if len(request.sequences) == request.rows and all(s.done for s in request.sequences):
                with self.tokenizer_lock:
                    decoded = self.tokenizer.batch_decode([s.tokens for s in request.sequences],
                                                          skip_special_tokens=True)
                texts = [truncate_at_stop(text, request.params.stop).strip() for text in decoded]
                _settle(request.future, result=texts * (request.n // len(texts)))
        self._active = [sequence for sequence in self._active if not sequence.done]


def _sample(logits: Any, params: list[SamplingParams], generators: list[Any]) -> list[int]:
    """One token per row of `logits`: greedy, or temperature, then top-k and min-p, then top-p, drawn with the
    row's own generator (vLLM's order: top-p is taken of the mass that top-k and min-p leave).

    Top-p without a sort: a draw from the whole distribution is kept when the tokens more likely than
    it hold less than top_p of the mass, and drawn again otherwise, which samples the nucleus
    exactly. All arithmetic is along rows (softmax, cumulative sums, sums), so a row's token does not
    depend on the other rows; only the draws need a call per row.
    """
    import torch

    device, vocabulary = logits.device, logits.shape[-1]
    tokens = logits.argmax(-1).tolist()  # greedy rows keep theirs
    pending = [row for row, p in enumerate(params) if p.temperature > 0]
    if not pending:
        return tokens
    temperature = torch.tensor([p.temperature or 1.0 for p in params], device=device)
    top_p = torch.tensor([p.top_p for p in params], device=device)
    probabilities = _top_k_min_p(torch.softmax(logits / temperature[:, None], dim=-1), params)
    cumulative = probabilities.cumsum(-1)
    while pending:
        if len(pending) == len(params):
            probs, cumulated, nucleus = probabilities, cumulative, top_p
        else:  # draws again for the rows whose draw fell outside the nucleus
            rows = torch.tensor(pending, device=device)
            probs, cumulated, nucleus = probabilities[rows], cumulative[rows], top_p[rows]
        draws = torch.cat([torch.rand(1, generator=generators[row], device=device) for row in pending])
        total = cumulated[:, -1]
        picked = torch.searchsorted(cumulated, (draws * total)[:, None], right=True).clamp(max=vocabulary - 1)
        more_likely = (probs * (probs > probs.gather(-1, picked))).sum(-1)
        kept = (more_likely < nucleus * total).tolist()
        for row, token, keep in zip(pending, picked[:, 0].tolist(), kept):
            if keep:
                tokens[row] = token
        pending = [row for row, keep in zip(pending, kept) if not keep]
    return tokens


def _top_k_min_p(probabilities: Any, params: list[SamplingParams]) -> Any:
    """`probabilities` with each row's tokens outside its top k, or below min_p times its likeliest, set to 0 (not
    renormalised: the draws scale by the row's total). Both masks are of the same distribution, so their order does
    not matter; tokens tied with the k-th are kept, as vLLM keeps them."""
    import torch

    if all(p.top_k is None and p.min_p is None for p in params):
        return probabilities
    vocabulary = probabilities.shape[-1]
    keep = torch.ones_like(probabilities, dtype=torch.bool)
    ks = [min(p.top_k or vocabulary, vocabulary) for p in params]
    if min(ks) < vocabulary:
        largest = probabilities.topk(max(ks), dim=-1).values
        kth = largest.gather(-1, torch.tensor(ks, device=probabilities.device)[:, None] - 1)
        keep &= probabilities >= kth
    min_p = torch.tensor([p.min_p or 0.0 for p in params], device=probabilities.device, dtype=probabilities.dtype)
    keep &= probabilities >= min_p[:, None] * probabilities.max(-1, keepdim=True).values
    return probabilities * keep


def _settle(future: concurrent.futures.Future, result: Any = None, exception: BaseException | None = None) -> None:
    """Answer a request's future, unless its caller cancelled it meanwhile."""
    try:
        if exception is not None:
            future.set_exception(exception)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass
