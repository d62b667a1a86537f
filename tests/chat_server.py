"""A simulated OpenAI-compatible chat server: reproducible completions, decode-like latency, counters.

    python tests/chat_server.py --port 8123 [--host 127.0.0.1] [--seconds-per-token 0.03]
                                [--seconds-per-request 0] [--model NAME]

It stands in for a vLLM server where a benchmark (benchmarks/overhead.py) and the tests need one
that costs no GPU. Three things make it useful there:

- Reproducible: choice `i` of a request is `max_tokens` words drawn from a fixed vocabulary, seeded
  by sha256 of the canonical JSON of (messages, seed, i, temperature, top_p, max_tokens). The same
  request always gets the same completions, in any process, so two clients that send the same
  requests can be compared text for text. Like vLLM, it honours `n`.
- Structured output: a request with an OpenAI-style `response_format` of type `json_schema` gets a
  JSON object that the schema accepts (enums, integer ranges, nullable strings, required keys),
  drawn from the same seeded generator, as vLLM's guided decoding would return.
- Latency: every request sleeps `seconds_per_request + max_tokens * seconds_per_token` once before
  answering, whatever `n` is (a batched decode), without blocking the event loop, so any number of
  requests can be in flight at once and the client's concurrency decides the wall time. A fixed
  per-request latency is what a hosted API looks like from outside.
- Streaming: a request with `stream: true` gets choice 0's text as server-sent chunks, a word every
  `seconds_per_token` after `seconds_per_request`, then `data: [DONE]`, as vLLM streams.
- Counting: `GET /stats` says how many requests came, how many are in flight now and at most, when
  the first arrived and the last was answered (time.time()), how many repeated an earlier
  request's body exactly, and how many were answered, again for a body answered before (a request
  paid for twice; one cut off by a shutdown, or whose client was gone when its answer was ready, was
  never answered: like vLLM, the server aborts a request whose client disconnected). `POST /stats/reset` zeroes it
  all. One event loop serves every request, so the counters are exact without locks.

`POST /hold` makes answers wait (requests still arrive and count) until `POST /release`: a test
that kills a client while its requests are held knows that no answer was on its way.

Other endpoints: `GET /health` and `GET /v1/models`. Importable from tests (`from chat_server
import make_app`) and served with tests/loopback_servers.serve.

As vLLM (`served`, tests/served_models.py): it serves a named base model and LoRA adapters, loaded at start
(`--lora-modules`) or at runtime (`/v1/load_lora_adapter`, where VLLM_ALLOW_RUNTIME_LORA_UPDATING is set), refuses
other model names as vLLM does, and answers either with simulated words seeded by the adapter's content too, or
with the tiny models themselves (`TransformersEngine`). `/stats` then counts requests by model (`by_model`).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from served_models import ServedModels, add_lora_routes, unknown_model

DEFAULT_MODEL = "sim-chat"
DEFAULT_MAX_TOKENS = 16
_WORDS = """
    about above across after again air all almost along also always among animal answer any around ask
    away back because become before begin behind believe best better between big body book both bring
    build call calm can care carry change child city clear close cold come could country course dark day
    deep different door down draw during early earth easy enough even evening every eye face fact family
    far feel few field find fire first follow food friend full garden give glad good great green ground
    group grow half hand happy hard head hear heart help here high hold home hope house idea important
    keep kind know land large last late laugh learn leave letter life light line listen little live long
    look make many mean mind moment morning move much music name near need never new next night north
    open order other over own paper part people picture place plan play point quiet rain ready real
    remember rest right river road room round run same say school sea second see seem sense shape short
    show side simple since small soft some song soon sound speak spring stand start stay step still stone
    story strong study summer sun sure table take talk tell thing think through time today together tree
    true turn under until voice wait walk warm watch water way weather week well while whole wind window
    word work world write year young
"""
VOCABULARY = tuple(_WORDS.split())


def completion_text(messages: object, seed: object, index: int, temperature: object, top_p: object,
                    max_tokens: int, schema: dict | None = None, adapter: str | None = None) -> str:
    """Choice `index` of a request: `max_tokens` vocabulary words, or a JSON object valid under `schema`,
    the same for the same inputs (`adapter`: the digest of the LoRA adapter that answers, if one does)."""
    parts = [messages, seed, index, temperature, top_p, max_tokens, *([adapter] if adapter else [])]
    key = json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    rng = random.Random(int.from_bytes(hashlib.sha256(key.encode()).digest(), "big"))
    if schema is not None:
        return json.dumps(structured_value(schema, rng, max_tokens))
    return " ".join(rng.choice(VOCABULARY) for _ in range(max_tokens))


def structured_value(schema: dict, rng: random.Random, max_tokens: int) -> object:
    """A value the JSON schema accepts: the subset of JSON Schema that OpenAI's strict mode allows."""
    if "enum" in schema:
        return rng.choice(schema["enum"])
    kind = schema.get("type", "string")
    if isinstance(kind, list):  # ["string", "null"]: mostly the first, sometimes null
        kind = kind[0] if "null" not in kind or rng.random() < 0.7 else "null"
    if kind == "object":
        return {name: structured_value(sub, rng, max_tokens) for name, sub in schema.get("properties", {}).items()}
    if kind == "integer":
        return rng.randint(schema.get("minimum", 0), schema.get("maximum", 100))
    if kind == "number":
        return round(rng.uniform(schema.get("minimum", 0.0), schema.get("maximum", 1.0)), 3)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "array":
        return [structured_value(schema.get("items", {}), rng, max_tokens) for _ in range(rng.randint(1, 3))]
    text = " ".join(rng.choice(VOCABULARY) for _ in range(max(1, min(max_tokens, 12))))
    return text[:schema["maxLength"]] if "maxLength" in schema else text


@dataclass
class Stats:
    requests: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    first_request_at: float | None = None
    last_response_at: float | None = None
    repeated: int = 0
    answered: int = 0
    answered_again: int = 0  # answers to a body answered before: a request paid for twice
    abandoned: int = 0  # requests whose client was gone (killed, say) when the answer was ready
    authorized: dict[str, int] = field(default_factory=dict)  # requests by the API key they bore (with api_keys)
    by_model: dict[str, int] = field(default_factory=dict)  # chat requests by the model they named
    seen: set[str] = field(default_factory=set)
    answered_bodies: set[str] = field(default_factory=set)

    def report(self) -> dict:
        return {key: value for key, value in asdict(self).items() if key not in ("seen", "answered_bodies")}


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}}, status_code=status)


def make_app(model: str = DEFAULT_MODEL, seconds_per_token: float = 0.03, seconds_per_request: float = 0.0,
             structured_output: bool = True, api_keys: set[str] | None = None,
             moderator: Callable[[str], str] | None = None, served: ServedModels | None = None) -> FastAPI:
    """The server's app; its counters are `app.state.stats`. With `structured_output=False` it ignores
    `response_format` and answers in words, as a server without guided decoding does. With `api_keys`, a
    request must bear one of them (`Authorization: Bearer <key>`), as a paid API's must; others get 401.
    With `moderator`, it also plays a moderation model (`add_moderation`). With `served`, it plays vLLM
    serving that base model and its LoRA adapters (tests/served_models.py); `app.state.served` is it."""
    app = FastAPI(title="simulated chat server")
    if moderator is not None:
        add_moderation(app, moderator)
    app.state.served = served
    if served is not None:
        add_lora_routes(app, served)
    app.state.stats = Stats()
    app.state.answering = asyncio.Event()  # cleared by POST /hold: answers wait until POST /release
    app.state.answering.set()

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict:
        if served is not None:
            return {"object": "list", "data": served.cards()}
        return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "simulated"}]}

    @app.get("/stats")
    async def stats() -> dict:
        return app.state.stats.report()

    @app.post("/stats/reset")
    async def reset() -> dict:
        app.state.stats = Stats()
        return app.state.stats.report()

    @app.post("/hold")
    async def hold() -> dict:
        app.state.answering.clear()
        return {"answering": False}

    @app.post("/release")
    async def release() -> dict:
        app.state.answering.set()
        return {"answering": True}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the body is not JSON")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            return _error(400, "expected a JSON object with a non-empty 'messages' list")
        if api_keys is not None:
            key = request.headers.get("authorization", "").removeprefix("Bearer ")
            if key not in api_keys:
                return _error(401, "Incorrect API key provided")
            app.state.stats.authorized[key] = app.state.stats.authorized.get(key, 0) + 1
        n = body.get("n") or 1
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or DEFAULT_MAX_TOKENS
        if not isinstance(n, int) or n < 1 or not isinstance(max_tokens, int) or max_tokens < 1:
            return _error(400, f"'n' and 'max_tokens' must be positive integers, got {n!r} and {max_tokens!r}")
        if served is not None and not served.knows(body.get("model")):
            return unknown_model(body.get("model"))
        lora = served.adapter(body["model"]) if served is not None else None

        stats = app.state.stats  # a reset while this request is in flight does not count it in the new stats
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        stats.repeated += canonical in stats.seen
        stats.seen.add(canonical)
        stats.requests += 1
        stats.by_model[str(body.get("model"))] = stats.by_model.get(str(body.get("model")), 0) + 1
        stats.in_flight += 1
        stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
        if stats.first_request_at is None:
            stats.first_request_at = time.time()
        if body.get("stream"):
            return StreamingResponse(streamed(body, stats, canonical, max_tokens, lora and lora.digest),
                                     media_type="text/event-stream")
        try:
            # One batched decode for all n choices.
            await asyncio.sleep(seconds_per_request + max_tokens * seconds_per_token)
            await app.state.answering.wait()
            if await request.is_disconnected():  # as vLLM does, a request whose client is gone is aborted
                stats.abandoned += 1
                return _error(499, "the client closed the connection")
            messages, seed = body["messages"], body.get("seed")
            temperature, top_p = body.get("temperature"), body.get("top_p")
            response_format = body.get("response_format") or {}
            schema = response_format.get("json_schema", {}).get("schema") \
                if structured_output and response_format.get("type") == "json_schema" else None
            if served is not None and served.engine is not None:  # the model itself answers (no guided decoding)
                texts = await served.engine.complete(lora and lora.path, messages, n, body)
                if await request.is_disconnected():  # the client left while the model generated: vLLM aborts it
                    stats.abandoned += 1
                    return _error(499, "the client closed the connection")
            else:
                texts = [completion_text(messages, seed, i, temperature, top_p, max_tokens, schema,
                                         lora and lora.digest) for i in range(n)]
            choices = [{"index": i, "finish_reason": "stop" if schema else "length", "logprobs": None,
                        "message": {"role": "assistant", "content": text}} for i, text in enumerate(texts)]
            prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in messages if isinstance(m, dict))
            stats.answered += 1
            stats.answered_again += canonical in stats.answered_bodies
            stats.answered_bodies.add(canonical)
            return JSONResponse({
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model") or model,
                "choices": choices,
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n * max_tokens,
                          "total_tokens": prompt_tokens + n * max_tokens},
            })
        finally:
            stats.in_flight -= 1
            stats.last_response_at = time.time()

    async def streamed(body: dict, stats: Stats, canonical: str, max_tokens: int, adapter: str | None):
        """Choice 0 as server-sent chunks, a word every `seconds_per_token`, then `[DONE]`, as vLLM streams."""
        try:
            await asyncio.sleep(seconds_per_request)
            await app.state.answering.wait()
            text = completion_text(body["messages"], body.get("seed"), 0, body.get("temperature"), body.get("top_p"),
                                   max_tokens, adapter=adapter)
            chunk = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk",
                     "created": int(time.time()), "model": body.get("model") or model}
            for index, word in enumerate(text.split(" ")):
                await asyncio.sleep(seconds_per_token)
                delta = {"role": "assistant", "content": word} if index == 0 else {"content": " " + word}
                yield f"data: {json.dumps({**chunk, 'choices': [{'index': 0, 'delta': delta}]})}\n\n"
            yield f"data: {json.dumps({**chunk, 'choices': [{'index': 0, 'delta': {}, 'finish_reason': 'length'}]})}\n\n"
            yield "data: [DONE]\n\n"
            stats.answered += 1
            stats.answered_again += canonical in stats.answered_bodies
            stats.answered_bodies.add(canonical)
        finally:  # also when the client goes away mid-stream (the generator is closed)
            stats.in_flight -= 1
            stats.last_response_at = time.time()

    return app


# What a moderator may decide about a message: the server answers as the model would, or fails as a server can.
SELF_HARM, SAFE, OTHER_HAZARD, ERROR, HANG, GARBAGE = "self-harm", "safe", "other-hazard", "error", "hang", "garbage"


def add_moderation(app: FastAPI, moderator: Callable[[str], str]) -> None:
    """Two moderation models' wire formats on `app`, deciding by `moderator(message)` (one of the names above):

    - `POST /v1/completions`: Llama Guard 3 served by vLLM. The prompt must be its prompt (the hazard categories,
      then the conversation); the message is read from it, and the answer is `safe`, `unsafe\nS11` (self-harm)
      or `unsafe\nS1` (another hazard), as the model writes them.
    - `POST /v1/moderations`: OpenAI's moderation endpoint, answering the self-harm categories, or violence.

    `error` answers 500, `hang` answers only after `app.state.hang_s` (5 s: past a client's timeout, short of a
    test's teardown), `garbage` answers in no format. Each request's message is kept in `app.state.moderated`.
    """
    app.state.moderated = []
    app.state.hang_s = 5.0

    async def decide(text: str) -> str | JSONResponse:
        app.state.moderated.append(text)
        decision = moderator(text)
        if decision == HANG:
            await asyncio.sleep(app.state.hang_s)
        if decision == ERROR:
            return _error(500, "moderation model failed")
        return decision

    @app.post("/v1/completions")
    async def completions(request: Request) -> JSONResponse:
        body = await request.json()
        prompt = body.get("prompt", "")
        found = re.search(r"<BEGIN UNSAFE CONTENT CATEGORIES>\n(.*)\n<END UNSAFE CONTENT CATEGORIES>.*"
                          r"<BEGIN CONVERSATION>\n\nUser: (.*)\n\n<END CONVERSATION>", prompt, re.DOTALL)
        if not isinstance(prompt, str) or not found or "S11: Suicide & Self-Harm." not in found.group(1):
            return _error(400, "not a Llama Guard 3 prompt")
        decision = await decide(found.group(2))
        if isinstance(decision, JSONResponse):
            return decision
        text = {SELF_HARM: "unsafe\nS11", OTHER_HAZARD: "unsafe\nS1", SAFE: "safe"}.get(decision, "I cannot say.")
        return JSONResponse({"id": "x", "object": "text_completion", "created": 0, "model": body.get("model"),
                             "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}]})

    @app.post("/v1/moderations")
    async def moderations(request: Request) -> JSONResponse:
        body = await request.json()
        if not isinstance(body.get("input"), str):
            return _error(400, "input must be a string")
        decision = await decide(body["input"])
        if isinstance(decision, JSONResponse):
            return decision
        if decision == GARBAGE:
            return JSONResponse({"id": "x", "model": body.get("model"), "results": []})
        names = ("harassment", "harassment/threatening", "hate", "hate/threatening", "illicit", "illicit/violent",
                 "self-harm", "self-harm/instructions", "self-harm/intent", "sexual", "sexual/minors", "violence",
                 "violence/graphic")
        flagged = {SELF_HARM: {"self-harm", "self-harm/intent"}, OTHER_HAZARD: {"violence"}}.get(decision, set())
        result = {"flagged": bool(flagged), "categories": {name: name in flagged for name in names},
                  "category_scores": {name: 0.9 if name in flagged else 0.01 for name in names},
                  "category_applied_input_types": {name: ["text"] for name in names}}
        return JSONResponse({"id": "modr-x", "model": body.get("model"), "results": [result]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True, help="port to listen on")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--seconds-per-token", type=float, default=0.03, help="simulated decode time per token")
    parser.add_argument("--seconds-per-request", type=float, default=0.0, help="fixed latency of every request")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="the served model name")
    parser.add_argument("--lora-modules", nargs="*", default=[], metavar="NAME=PATH",
                        help="LoRA adapters served from the start, as vLLM's; with them, or with "
                        "VLLM_ALLOW_RUNTIME_LORA_UPDATING set, the server plays vLLM (tests/served_models.py)")
    args = parser.parse_args()
    runtime = os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true")
    served = ServedModels(args.model, allow_runtime_lora=runtime) if runtime or args.lora_modules else None
    for module in args.lora_modules:
        name, _, path = module.partition("=")
        if served.add(name, path) is None:
            parser.error(f"--lora-modules {module}: no adapter (adapter_config.json) in {path}")
    app = make_app(args.model, args.seconds_per_token, args.seconds_per_request, served=served)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
