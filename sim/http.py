"""The stand-in's HTTP API (aiohttp): SGLang's native and OpenAI-compatible endpoints that tunectl and
`sglang.bench_serving` use. Latencies in responses are modeled seconds on the engine's clock; every streamed chunk
carries `sim_clock_ts`: [the request's arrival, this chunk's step] in modeled seconds (in `meta_info` on /generate,
at the top of an OpenAI chunk), so a client can measure in the server's clock, whatever its own host's load."""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import time
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from tunectl.sim.engine import Engine
from tunectl.sim.gpus import visible
from tunectl.sim.sched import Req, block_keys

_rid = itertools.count(1)
WORD = " ok"
CLOCK_HEADER = "X-Sim-Clock"   # "streams=N; level=ID": the client reads the server's clock and keeps N requests in
                               # flight for level ID; N = 0 (on any request): that level sends no more


class Api:
    def __init__(self, state: Any):
        self.st = state          # launch_server.State: args, engine, ready, shutting_down, info

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._access_log], client_max_size=64 << 20)
        r = app.router
        for path in ("/health", "/health_generate"):
            r.add_get(path, self.health)
        for path in ("/model_info", "/get_model_info"):
            r.add_get(path, self.model_info)
        for path in ("/server_info", "/get_server_info"):
            r.add_get(path, self.server_info)
        r.add_get("/v1/models", self.models)
        r.add_post("/generate", self.generate)
        r.add_post("/v1/completions", self.completions)
        r.add_route("*", "/flush_cache", self.flush_cache)
        r.add_get("/sim_gpus", self.gpus)
        if getattr(self.st.ns, "enable_metrics", False):
            r.add_get("/metrics", self.metrics)
        return app

    async def metrics(self, _: web.Request) -> web.Response:
        eng: Engine | None = self.st.engine
        text = eng.metrics.render(self.st.served_name) if eng is not None else ""
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def gpus(self, _: web.Request) -> web.Response:
        """The stand-in's own route (no SGLang one): its GPUs' power and utilization, for `tunectl.sim.smi`."""
        eng: Engine | None = self.st.engine
        draw = eng.power.draw(eng.clock_now()) if eng is not None else None
        card = self.st.setup.card
        ids = (visible(dict(os.environ)) or list(range(card.gpu.count)))[:card.gpu.count]
        rows = [{"index": i, "name": card.gpu.name, "power.draw": draw[0] if draw else None,
                 "utilization.gpu": draw[1] if draw else None} for i in ids]
        return web.json_response(rows)

    @web.middleware
    async def _access_log(self, request: web.Request, handler: Any) -> web.StreamResponse:
        resp = await handler(request)
        peer = request.transport.get_extra_info("peername") if request.transport else None
        addr = f"{peer[0]}:{peer[1]}" if peer else "127.0.0.1:0"
        reason = "OK" if resp.status == 200 else resp.reason
        self.st.log(f'INFO:     {addr} - "{request.method} {request.path} HTTP/1.1" {resp.status} {reason}')
        return resp

    async def health(self, request: web.Request) -> web.Response:
        clock = _clock(request)
        if clock is not None and self.st.engine is not None:
            self.st.engine.declare(*clock)
        ok = self.st.ready and not self.st.shutting_down
        return web.Response(status=200 if ok else 503)

    async def model_info(self, _: web.Request) -> web.Response:
        return web.json_response(self.st.model_info())

    async def server_info(self, _: web.Request) -> web.Response:
        return web.json_response(self.st.server_info())

    async def models(self, _: web.Request) -> web.Response:
        name = self.st.served_name
        return web.json_response({"object": "list", "data": [{
            "id": name, "object": "model", "created": int(self.st.started), "owned_by": "sglang", "root": name,
            "max_model_len": self.st.setup.card.context_len}]})

    async def flush_cache(self, _: web.Request) -> web.Response:
        eng: Engine = self.st.engine
        if eng is not None and eng.sched.idle():
            eng.sched.flush_cache()
        return web.Response(text="Cache flushed.\nPlease check backend logs for more details. (When there are "
                                 "running or waiting requests, the operation will not be performed.)\n")

    # ------------------------------------------------------------------------------------- generation
    def _make_req(self, request: web.Request, prompt: Any, max_new: Any, ids_only: bool = False) -> Req:
        """The request, or BadRequest where SGLang refuses it (its validation and TokenizerManager's length
        checks, messages verbatim): never a 500, and never a request longer than the context that holds the
        engine for hours."""
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            prompt = prompt[0]
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str) and not ids_only:
            prompt = prompt[0]
        if not (_token_ids(prompt) or isinstance(prompt, str) and not ids_only):
            raise BadRequest(f"the prompt is a string, a list of strings or a list of token ids, not {prompt!r:.80}")
        if not isinstance(max_new, int) or isinstance(max_new, bool):
            raise BadRequest(f"max_new_tokens: {max_new!r:.80}: expected an integer")
        if max_new < 0:
            raise BadRequest(f"max_new_tokens must be at least 0, got {max_new}.")
        ids = self.st.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        context = self.st.setup.card.context_len
        if len(ids) >= context:
            raise BadRequest(f"The input ({len(ids)} tokens) is longer than the model's context length ({context} "
                             "tokens).")
        if len(ids) + max_new >= context:
            raise BadRequest(f"Requested token count exceeds the model's maximum context length of {context} "
                             f"tokens. You requested a total of {len(ids) + max_new} tokens: {len(ids)} tokens "
                             f"from the input messages and {max_new} tokens for the completion. Please reduce the "
                             "number of tokens in the input messages or the completion to fit within the limit.")
        self.st.check_vocab(ids)
        return Req(next(_rid), max(1, len(ids)), max(1, max_new), block_keys(ids))

    def _unavailable(self) -> web.Response | None:
        if self.st.engine is None or self.st.shutting_down:
            return web.json_response({"error": {"message": "server is not ready"}}, status=503)
        return None

    async def generate(self, request: web.Request) -> web.StreamResponse:
        if (bad := self._unavailable()) is not None:
            return bad
        body = await _body(request)
        if isinstance(body, web.Response):
            return body
        sp = body.get("sampling_params") or {}
        ids = body.get("input_ids")
        prompt = ids if ids is not None else body.get("text", "")
        try:
            max_new = sp.get("max_new_tokens", 128) if isinstance(sp, dict) else 128
            req = self._make_req(request, prompt, 128 if max_new is None else max_new, ids is not None)
        except BadRequest as e:                # SGLang: 400 {"error": ...}; a stream says it in its one event
            if not body.get("stream"):
                return web.json_response({"error": {"message": str(e)}}, status=400)
            resp = await _sse(request)
            await resp.write(b"data: " + json.dumps({"error": {"message": str(e)}}).encode() + b"\n\ndata: [DONE]\n\n")
            return resp
        q, stream, resp = self.st.engine.submit(req, _clock(request)), body.get("stream"), None
        try:
            with self._aborted_unless_finished(req):
                if not stream:
                    up = await _last(request, q)
                    return web.json_response(self._native(req, req.output_len, True, up.t))
                resp = await _sse(request)
                while True:
                    up = await q.get()
                    await resp.write(b"data: " + json.dumps(self._native(req, up.generated, up.finished,
                                                                         up.t)).encode() + b"\n\n")
                    if up.finished:
                        break
            await resp.write(b"data: [DONE]\n\n")
        except ConnectionError:
            return resp if resp is not None else self._hung_up(req, stream)   # a stream's 200 went: as uvicorn logs
        return resp

    def _native(self, req: Req, n: int, done: bool, t: float) -> dict[str, Any]:
        return {"text": WORD * n, "output_ids": [], "meta_info": {
            "id": str(req.rid), "finish_reason": {"type": "length", "length": req.output_len} if done else None,
            "prompt_tokens": req.input_len, "completion_tokens": n, "cached_tokens": req.cached,
            "e2e_latency": t - req.arrival, "sim_clock_ts": [req.arrival, t]}}

    async def completions(self, request: web.Request) -> web.StreamResponse:
        if (bad := self._unavailable()) is not None:
            return bad
        body = await _body(request)
        if isinstance(body, web.Response):
            return body
        try:
            max_new = body.get("max_tokens", 16)
            req = self._make_req(request, body.get("prompt", ""), 16 if max_new is None else max_new)
        except BadRequest as e:
            return _error_response(str(e), "BadRequest")
        q, stream, resp = self.st.engine.submit(req, _clock(request)), body.get("stream"), None
        try:
            with self._aborted_unless_finished(req):
                if not stream:
                    up = await _last(request, q)
                    return web.json_response(self._oai(req, WORD * req.output_len, "length", True, up.t))
                resp, sent = await _sse(request), 0
                while True:
                    up = await q.get()
                    chunk = self._oai(req, WORD * (up.generated - sent), "length" if up.finished else None,
                                      up.finished, up.t)
                    sent = up.generated
                    await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                    if up.finished:
                        break
            await resp.write(b"data: [DONE]\n\n")
        except ConnectionError:
            return resp if resp is not None else self._hung_up(req, stream)   # a stream's 200 went: as uvicorn logs
        return resp

    def _hung_up(self, req: Req, stream: bool) -> web.Response:
        """What SGLang says of a client that went away: nothing for a stream (its background task aborts the
        request), the tokenizer manager's error line for a non-streaming one (type 1 still queued, type 3
        running); the 400 it answers reaches nobody."""
        if not stream:
            kind = 1 if req.first_token_t is None else 3
            self.st.log(f"[http_server] Error: Request is disconnected from the client side (type {kind}). Abort "
                        f"request obj.rid='{req.rid}'")
        return web.Response(status=400)

    @contextlib.contextmanager
    def _aborted_unless_finished(self, req: Req) -> Iterator[None]:
        """A request whose client went away (a write to a closed stream, a non-streaming client that hung up) is
        aborted, as SGLang's tokenizer manager aborts it: it leaves the queue or the running batch and its KV is
        freed, instead of decoding for nobody and slowing every request after it."""
        try:
            yield
        finally:
            if req.finish_t is None:
                self.st.engine.abort(req.rid)

    def _oai(self, req: Req, text: str, finish: str | None, usage: bool, t: float) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": f"cmpl-{req.rid}", "object": "text_completion", "created": int(time.time()),
            "model": self.st.served_name,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}], "usage": None,
            "sim_clock_ts": [req.arrival, t]}
        if usage:
            out["usage"] = {"prompt_tokens": req.input_len, "completion_tokens": req.output_len,
                            "total_tokens": req.input_len + req.output_len}
        return out


async def _last(request: web.Request, q: asyncio.Queue[Any]) -> Any:
    """The finishing update of a non-streaming request; ConnectionResetError once its client has gone (checked at
    each update: aiohttp does not cancel a handler whose client hangs up)."""
    while not (up := await q.get()).finished:
        if request.transport is None or request.transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
    return up


def _token_ids(prompt: Any) -> bool:
    return isinstance(prompt, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt)


class BadRequest(ValueError):
    """A request SGLang answers with 400."""


def _error_response(message: str, kind: str = "Bad Request") -> web.Response:
    """SGLang's ErrorResponse body (its handler of request validation errors, and the OpenAI endpoints')."""
    return web.json_response({"object": "error", "message": message, "type": kind, "param": None, "code": 400},
                             status=400)


async def _body(request: web.Request) -> dict[str, Any] | web.Response:
    """The request's JSON object, or SGLang's 400 for a body that is none (FastAPI validates it before the
    handler runs: an empty body, invalid JSON, a list)."""
    try:
        body = await request.json()
    except ValueError as e:
        return _error_response(f"JSON decode error: {e}")
    if not isinstance(body, dict):
        return _error_response(f"Input should be a valid dictionary, got {type(body).__name__}")
    return body


def _clock(request: web.Request) -> tuple[int, str, int] | None:
    """(streams, level, the level's streams in all where this client is one share of it) from a client that reads
    the server's clock, else None."""
    fields = dict(part.strip().partition("=")[::2] for part in request.headers.get(CLOCK_HEADER, "").split(";"))
    n, total = fields.get("streams", ""), fields.get("total", "")
    return (int(n), fields.get("level", ""), int(total) if total.isdigit() else 0) if n.isdigit() else None


async def _sse(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    return resp
