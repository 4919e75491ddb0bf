"""The stand-in as a real subprocess: HTTP endpoints, log milestones in order, crash and SIGTERM teardown.

Log strings and exit behaviour follow real SGLang 0.5.17 on an H200 (tests/fixtures of the runners' crash tests)
and SGLang 0.5.9's sources: crash -> traceback -> sigquit line -> kill_process_tree -> SIGKILL (exit 137).
"""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import time

from tests.sim._server import BASELINE, Server, start

MILESTONES = ["server_args=ServerArgs(", "Init torch distributed begin.", "Load weight begin.", "Load weight end.",
              "KV Cache is allocated.", "Memory pool end.", "Capture cuda graph begin.", "Capture cuda graph end.",
              "max_total_num_tokens=", "Uvicorn running on", '"POST /generate HTTP/1.1" 200',
              "The server is fired up and ready to roll!"]


def _events(raw: bytes) -> list[dict]:
    lines = [ln[6:] for ln in raw.decode().splitlines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


def _prompt(seed: int, n: int = 256) -> list[int]:
    return [1000 + (seed * 7919 + i * 104729) % 29000 for i in range(n)]


def test_log_milestones_in_order(launch) -> None:
    srv: Server = launch("--stream-interval", "8")
    text = srv.text()
    positions = [text.find(m) for m in MILESTONES]
    assert -1 not in positions and positions == sorted(positions), list(zip(MILESTONES, positions))
    assert "[" in text.splitlines()[0] and "] server_args=" in text.splitlines()[0]


def test_endpoints(launch) -> None:
    srv: Server = launch("--stream-interval", "8", "--served-model-name", "glm-5", scale=0.001)
    assert srv.get("/health")[0] == 200 and srv.get("/health_generate")[0] == 200
    for path in ("/model_info", "/get_model_info"):
        code, info = srv.get(path)
        assert code == 200 and info["is_generation"] is True
    for path in ("/server_info", "/get_server_info"):
        code, info = srv.get(path)
        assert code == 200 and info["sim_time_scale"] == 0.001 and "--stream-interval" in info["launch_args"]
        assert info["version"] == "0.5.9" and info["internal_states"][0]["avg_spec_accept_length"] is None
    assert srv.get("/v1/models")[1]["data"][0]["id"] == "glm-5"
    events = _events(srv.post("/generate", {"input_ids": _prompt(1), "stream": True,
                                            "sampling_params": {"max_new_tokens": 20, "ignore_eos": True}}))
    counts = [e["meta_info"]["completion_tokens"] for e in events]
    assert counts == [1, 8, 16, 20]                       # first token, then every stream_interval, then the end
    assert events[-1]["text"].startswith(events[-2]["text"]) and events[-1]["meta_info"]["prompt_tokens"] == 256
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"
    single = json.loads(srv.post("/generate", {"text": "hello there", "sampling_params": {"max_new_tokens": 5}}))
    assert single["meta_info"]["completion_tokens"] == 5 and single["meta_info"]["e2e_latency"] > 0
    chunks = _events(srv.post("/v1/completions", {"prompt": "hi", "max_tokens": 12, "stream": True}))
    assert "".join(c["choices"][0]["text"] for c in chunks).count("ok") == 12
    assert chunks[-1]["usage"]["completion_tokens"] == 12 and chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert srv.get("/flush_cache")[0] == 200


def _raw(srv: Server, path: str, data: bytes) -> tuple[int, dict]:
    """POST `data` as is: (status, the JSON body)."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(srv.url + path, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_requests_sglang_refuses_are_400_and_never_hold_the_engine(launch) -> None:
    """SGLang answers a body that is no JSON object with 400 (its RequestValidationError handler: ErrorResponse),
    a negative max_new_tokens with SamplingParams.verify's 400, and a request longer than the context with
    TokenizerManager's 400, messages verbatim. The stand-in answered 500 with a traceback in its log, and took
    max_new_tokens=10**8: that one request held the engine, and the next one waited behind it for good."""
    srv: Server = launch(scale=0.001)
    for body in (b"", b"{bad", b"[]", b'"x"'):
        code, out = _raw(srv, "/generate", body)
        assert code == 400 and out["object"] == "error" and out["code"] == 400, (body, out)
        assert _raw(srv, "/v1/completions", body)[0] == 400
    code, out = _raw(srv, "/generate", b'{"text": "hi", "sampling_params": {"max_new_tokens": -5}}')
    assert code == 400 and out["error"]["message"] == "max_new_tokens must be at least 0, got -5."
    assert _raw(srv, "/v1/completions", b'{"prompt": "hi", "max_tokens": -1}')[0] == 400
    assert _raw(srv, "/v1/completions", b'{"prompt": 5}')[0] == 400
    assert _raw(srv, "/generate", b'{"input_ids": ["a"]}')[0] == 400
    code, out = _raw(srv, "/generate", b'{"text": "hi", "sampling_params": {"max_new_tokens": 100000000}}')
    assert code == 400 and "exceeds the model's maximum context length of 202752 tokens" in out["error"]["message"]
    events = _events(srv.post("/generate", {"text": "hi", "stream": True,
                                            "sampling_params": {"max_new_tokens": 10**8}}))
    assert "maximum context length" in events[0]["error"]["message"]         # a stream says it in its one event
    code, out = _raw(srv, "/v1/completions", b'{"prompt": "hi", "max_tokens": 3}')
    assert code == 200 and out["usage"]["completion_tokens"] == 3        # served at once: nothing held the engine
    assert "Traceback" not in srv.text() and srv.proc.poll() is None


def _running(srv: Server) -> float:
    text = srv.get("/metrics")[1]
    return float(next(ln.split()[-1] for ln in text.splitlines() if ln.startswith("sglang:num_running_reqs")))


def _hang_up_after(srv: Server, body: dict, first: bytes) -> None:
    """Send `body`, read until `first` arrives (nothing: the headers are not even sent yet), hang up."""
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    data = json.dumps(body).encode()
    sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
                 + str(len(data)).encode() + b"\r\n\r\n" + data)
    got = b""
    while first and first not in got:
        got += sock.recv(4096)
    time.sleep(0.3)
    sock.close()


def test_a_client_that_hangs_up_has_its_request_aborted(launch) -> None:
    """SGLang aborts a request whose client went away (its KV freed at the next step); the stand-in decoded it to
    the end for nobody, 100,000 tokens holding a slot of the batch long after its level was over."""
    srv: Server = launch("--enable-metrics", scale=0.01)
    long = {"text": "hi", "sampling_params": {"max_new_tokens": 100_000}}
    for body, first in ((long, b""), ({**long, "stream": True}, b"data: ")):
        _hang_up_after(srv, body, first)
        deadline = time.monotonic() + 10
        while _running(srv) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _running(srv) == 0, (body, srv.text()[-1500:])
    assert "Request is disconnected from the client side (type 3). Abort request" in srv.text()   # as SGLang
    code, out = _raw(srv, "/v1/completions", b'{"prompt": "hi", "max_tokens": 3}')
    assert code == 200 and out["usage"]["completion_tokens"] == 3 and _running(srv) == 0
    assert "Traceback" not in srv.text() and srv.proc.poll() is None


def test_an_unknown_sim_card_by_hand_is_one_line(tmp_path) -> None:
    """`tunectl sim serve --sim-card nope` was tunectl's ProfileError as a traceback (the profile checks a card's
    name before tunectl launches; by hand nothing did)."""
    srv = start(tmp_path, "--sim-card", "nope", wait_ready=False)
    assert srv.wait_exit() == 2
    lines = [ln for ln in srv.text().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "sim card not found" in lines[0], lines


def test_health_is_503_until_warmed_up(launch) -> None:
    srv: Server = launch(scale=0.05, wait_ready=False)
    seen = set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and 200 not in seen:
        try:
            seen.add(srv.get("/health")[0])
        except OSError:
            seen.add("refused")                       # before the HTTP server starts, like SGLang
        time.sleep(0.001)
    assert "refused" in seen and 200 in seen
    lines = srv.text().splitlines()
    ready = next(i for i, ln in enumerate(lines) if "fired up and ready" in ln)
    before = [ln for ln in lines[:ready] if "GET /health" in ln]
    assert all(" 503 " in ln for ln in before)        # every probe before the warm-up finished got 503
    assert any("GET /health" in ln and " 200 " in ln for ln in lines[ready:])


def _runtime_crash_lines(text: str) -> None:
    for s in ("Scheduler hit an exception: Traceback (most recent call last):",
              "AttributeError: 'PrefillMetadata' object has no attribute 'page_table_1_flattened'"):
        assert s in text


def _long_prompt(srv: Server) -> None:
    """A prompt longer than --chunked-prefill-size: its second chunk carries a prefix of 8192 cached tokens, which
    reaches SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD (8192) in one prefill batch (the chunked-prefix MHA path)."""
    try:
        srv.post("/generate", {"input_ids": _prompt(0, 8192 + 64), "sampling_params": {"max_new_tokens": 4}})
    except OSError:
        pass                                     # the server died with the request in flight


def test_page_table_crash_and_teardown(launch) -> None:
    srv: Server = launch()
    _long_prompt(srv)
    assert srv.wait_exit() == -signal.SIGKILL
    text = srv.text()
    _runtime_crash_lines(text)
    tail = text[text.find("AttributeError"):]
    assert tail.find("SIGQUIT received. signum=None, frame=None.") < tail.find("kill_process_tree called:")


def test_page_table_crash_avoided_by_the_fix_patch(launch) -> None:
    srv: Server = launch(env={"TUNECTL_SIM_PATCHES": "0002-page-table-1-flattened"})
    _long_prompt(srv)
    assert srv.proc.poll() is None and srv.get("/health")[0] == 200


def test_killpg_on_scheduler_exception(launch) -> None:
    srv: Server = launch(env={"SGLANG_KILLPG_ON_SCHEDULER_EXCEPTION": "1"})
    _long_prompt(srv)
    assert srv.wait_exit() == -signal.SIGKILL
    assert "Scheduler hit an exception" in srv.text() and "SIGQUIT received" not in srv.text()


def test_startup_oom(launch) -> None:
    srv: Server = launch("--mem-fraction-static", "0.97")
    assert srv.wait_exit() == -signal.SIGKILL
    text = srv.text()
    assert "torch.OutOfMemoryError: CUDA out of memory." in text and "fired up" not in text
    assert text.find("Scheduler hit an exception") < text.find("Received sigquit from a child process. It usually "
                                                               "means the child failed.") < text.find(
                                                                   "kill_process_tree")


def test_capture_cuda_graph_failed(launch) -> None:
    srv: Server = launch("--cuda-graph-max-bs", "512", env={"TUNECTL_SIM_PATCHES": "0001-flashinfer-cutlass-autotune"})
    assert srv.wait_exit() == -signal.SIGKILL
    assert "Exception: Capture cuda graph failed: CUDA out of memory." in srv.text()


def test_hang_then_watchdog(launch) -> None:
    srv: Server = launch("--enable-two-batch-overlap", "--watchdog-timeout", "100", "--skip-server-warmup")
    for i in range(2):
        subprocess.Popen(["curl", "-s", "-m", "10", "-d", json.dumps({"input_ids": _prompt(i, 32),
                                                                 "sampling_params": {"max_new_tokens": 4000}}),
                          srv.url + "/generate"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert srv.wait_exit() == -signal.SIGKILL
    assert "Scheduler watchdog timeout (self.watchdog_timeout=100, self.soft=False)" in srv.text()


def test_sigterm_and_child_in_the_same_group(launch) -> None:
    srv: Server = launch()
    kids = subprocess.run(["ps", "-o", "pid=,pgid=", "--ppid", str(srv.proc.pid)], capture_output=True, text=True)
    rows = [r.split() for r in kids.stdout.splitlines()]
    assert rows and all(int(pgid) == srv.proc.pid for _, pgid in rows)
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.wait_exit() == -signal.SIGKILL                   # like real SGLang 0.5.17: 137 after SIGTERM
    assert "SIGTERM received" in srv.text()
    time.sleep(0.3)
    assert not any(_alive(int(pid)) for pid, _ in rows)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"     # a zombie waits for its reaper: gone
    except FileNotFoundError:
        return False


def test_base_flags_come_from_the_profile() -> None:
    assert "--nsa-prefill-backend" in BASELINE


def test_out_of_vocabulary_token_id_is_a_device_side_assert(launch) -> None:
    """Real SGLang 0.5.17 (H200): a token id beyond the vocabulary killed the server with a device-side assert."""
    srv: Server = launch()
    srv.post("/generate", {"input_ids": _prompt(1, 64), "sampling_params": {"max_new_tokens": 4}})
    assert srv.proc.poll() is None                                     # ids inside the vocabulary are fine
    try:
        srv.post("/generate", {"input_ids": [5, 10**7], "sampling_params": {"max_new_tokens": 4}})
    except OSError:
        pass
    assert srv.wait_exit() == -signal.SIGKILL
    text = srv.text()
    assert "Assertion `srcIndex < srcSelectDimSize` failed." in text
    assert "torch.AcceleratorError: CUDA error: device-side assert triggered" in text
    from tunectl.sglang.crashes.classifier import classify
    crash = classify(text, "load", 1, 137)
    assert crash is not None and (crash.signature, crash.cls) == ("device_side_assert", "load_crash")
