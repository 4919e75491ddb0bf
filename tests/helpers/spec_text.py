"""SGLang 0.5.9's own text when its ServerArgs refuses a speculative config (printed to stderr, exit 1, before any
log line): the frames of the sglang-0.5.9 wheel's launch_server.py:31 and srt/server_args.py (5592, 5078, 767,
then the refusing line of `_handle_speculative_decoding`), and the exception the source raises there."""
from __future__ import annotations

SITE = "/usr/local/lib/python3.12/dist-packages/sglang"
FRAMES = [("launch_server.py", 31, "<module>", "server_args = prepare_server_args(sys.argv[1:])"),
          ("srt/server_args.py", 5592, "prepare_server_args", "return ServerArgs.from_cli_args(raw_args)"),
          ("srt/server_args.py", 5078, "from_cli_args", "return cls(**{attr: getattr(args, attr) for attr in attrs})"),
          ("srt/server_args.py", 767, "__post_init__", "self._handle_speculative_decoding()")]
PAGED = ("produces incorrect results for paged attention backends. This combination is only supported for the "
         "'flashinfer' backend.")
# signature -> (line of server_args.py, its code, the exception line)
REFUSALS = {
    "spec_params_partial": (2423, "assert (", "AssertionError"),
    "spec_topk_missing": (2453, "self.speculative_eagle_topk > 1",
                          "TypeError: '>' not supported between instances of 'NoneType' and 'int'"),
    "spec_topk_trtllm": (2439, "raise ValueError(",
                         "ValueError: trtllm_mha backend only supports topk = 1 for speculative decoding."),
    "spec_topk_paged": (2457, "raise ValueError(",
                        "ValueError: speculative_eagle_topk > 1 with page_size > 1 is unstable and " + PAGED),
    "spec_topk_paged_ngram": (2490, "raise ValueError(",
                              "ValueError: speculative_eagle_topk(4) > 1 with page_size(16) > 1 is unstable and "
                              + PAGED),
}


def refusal(signature: str) -> str:
    line, code, exc = REFUSALS[signature]
    out = ["Traceback (most recent call last):"]
    for path, n, fn, src in [*FRAMES, ("srt/server_args.py", line, "_handle_speculative_decoding", code)]:
        out += [f'  File "{SITE}/{path}", line {n}, in {fn}', f"    {src}"]
    return "\n".join([*out, exc]) + "\n"
