"""Speculative decoding in the stand-in: SGLang 0.5.9's rules for the `--speculative-*` flags (their defaults and
startup refusals, `ServerArgs._handle_speculative_decoding`), the acceptance length a draft reaches on a workload
(the card's `speculative:` section), and what one speculative round costs.

A round drafts `num_steps` deep (`topk` branches each) and verifies `num_draft_tokens` per request (the tree's
best nodes plus the root) in one target forward; the accepted tokens plus the target's own one are `accept_len`
(1 .. num_steps + 1). The stand-in's scheduler makes one token per request per step, so a speculative step is one
token's share of a round:
round time / accept_len. Verification is a target forward over bs x draft tokens: cheap while the step is bound by
weight reads (small batches), as dear as draft-tokens plain steps once it is bound by compute (large ones).

Pure: no I/O. `resolve_spec(card, config, env)` -> (the Spec or None, SGLang's refusal or None: its line in
server_args.py, the code there, the exception line).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tunectl.sim.card import Card, SpecDraft

# SGLang 0.5.9 server_args.py: the traceback of a refusal raised while the server args are checked (exit 1, before
# any log line; the dataclass's generated `__init__` frame between from_cli_args and __post_init__ left out);
# (file, line, function, code)
_ARGS_FRAMES = [("launch_server.py", 31, "<module>", "server_args = prepare_server_args(sys.argv[1:])"),
                ("srt/server_args.py", 5592, "prepare_server_args", "return ServerArgs.from_cli_args(raw_args)"),
                ("srt/server_args.py", 5078, "from_cli_args",
                 "return cls(**{attr: getattr(args, attr) for attr in attrs})"),
                ("srt/server_args.py", 767, "__post_init__", "self._handle_speculative_decoding()")]
# the refusals: (line in server_args.py, the code line shown, the exception line)
PARTIAL = (2423, "assert (", "AssertionError")                  # topk / draft tokens given without num-steps
STEPS_ONLY = (2453, "self.speculative_eagle_topk > 1",            # num-steps given alone: topk stays None
              "TypeError: '>' not supported between instances of 'NoneType' and 'int'")
TRTLLM_TOPK = (2439, "raise ValueError(",
               "ValueError: trtllm_mha backend only supports topk = 1 for speculative decoding.")
PAGED_TOPK = (2457, "raise ValueError(",
              "ValueError: speculative_eagle_topk > 1 with page_size > 1 is unstable and produces incorrect results "
              "for paged attention backends. This combination is only supported for the 'flashinfer' backend.")
MAX_RUNNING_RESET = 48          # 0.5.9 sets --max-running-requests 48 when speculative decoding leaves it unset


@dataclass
class Spec:
    algorithm: str                 # EAGLE (NEXTN is EAGLE in 0.5.9), EAGLE3, STANDALONE, NGRAM
    steps: int
    topk: int
    draft_tokens: int
    draft: SpecDraft
    accept: float                  # per-token acceptance probability on the workload
    simulated: float | None        # SGLANG_SIMULATE_ACC_LEN (0.5.9: the EAGLE family only; 0.5.17: NGRAM too)

    def use_workload(self, kind: str | None) -> None:
        """The acceptance the draft reaches on this workload kind (the card's `accept`)."""
        self.accept = self.draft.accept_on(kind, self.algorithm)

    def accept_len(self) -> float:
        """Mean tokens a round yields per request: 1 + sum of the chance that the first i drafts are accepted."""
        if self.simulated is not None:
            return max(1.0, min(self.steps + 1.0, self.simulated))
        if self.algorithm == "NGRAM":
            return 1.0 + sum(self.accept ** i for i in range(1, self.draft_tokens))
        return 1.0 + tree_gain(self.accept, self.draft_tokens - 1, self.steps, self.topk)

    def accept_rate(self) -> float:
        """SGLang's `accept rate`: accepted tokens / draft tokens per round."""
        return self.accept_len() / max(1, self.draft_tokens)

    def draft_ms(self, bs: int, graphs: bool) -> float:
        d = self.draft
        n = 1 if self.algorithm == "NGRAM" else self.steps
        return n * (d.step_ms + d.per_req_ms * bs * self.topk + (0.0 if graphs else d.launch_ms))


def tree_gain(a: float, nodes: int, depth: int, topk: int) -> float:
    """Expected drafted tokens accepted from a tree of `nodes` drafted tokens, at most `depth` deep and `topk` wide
    per depth, the nodes placed where they add most (as SGLang keeps the draft tokens of the highest scores): depth i
    with w_i candidates is reached when every depth before it was, with chance 1 - (1 - a)^w_i each."""
    widths: list[int] = []

    def value(ws: list[int]) -> float:
        out, reach = 0.0, 1.0
        for w in ws:
            reach *= 1.0 - (1.0 - a) ** w
            out += reach
        return out

    for _ in range(max(0, nodes)):
        options = [widths[:i] + [w + 1] + widths[i + 1:] for i, w in enumerate(widths) if w < topk]
        options += [widths + [1]] if len(widths) < depth else []
        if not options:
            break
        widths = max(options, key=value)
    return value(widths)


def _int(v: Any) -> int | None:
    return None if v is None else int(v)


def _at_least(version: str, floor: tuple[int, ...]) -> bool:
    try:
        return tuple(int(x) for x in version.split(".")[:3]) >= floor
    except ValueError:
        return False


def resolve_spec(card: Card, c: dict[str, Any], env: dict[str, str], version: str = "0.5.9"
                 ) -> tuple[Spec | None, tuple[int, str, str] | None]:
    """`c`: the flags with SGLang's defaults (underscored). (None, None): no speculative decoding (or a card
    without `speculative:`); (None, refusal): SGLang refuses the flags at startup. `version`: the SGLang version
    played (0.5.17's NGRAM verifies through EAGLE's `eagle_sample`, so SGLANG_SIMULATE_ACC_LEN sets its acceptance
    too: ngram_worker.py:21, eagle_utils.py:838; measured on a real H100, docs/real-gpu.md)."""
    algo = c.get("speculative_algorithm")
    if algo in (None, "none", "None", "") or card.speculative is None:
        return None, None
    algo = "EAGLE" if algo == "NEXTN" else str(algo)
    steps, topk, ndt = (_int(c.get(k)) for k in ("speculative_num_steps", "speculative_eagle_topk",
                                                "speculative_num_draft_tokens"))
    sc = card.speculative
    sim = float(env.get("SGLANG_SIMULATE_ACC_LEN", "-1") or -1)
    simulated = sim if sim > 0 else None
    if algo == "NGRAM":
        topk = sc.ngram.max_bfs_breadth
        ndt = ndt or sc.ngram.max_match_window_size
        steps = steps or ndt - 1
        simulated = simulated if _at_least(version, (0, 5, 17)) else None
        return Spec(algo, steps, topk, ndt, sc.ngram, sc.ngram.accept_on(None), simulated), None
    if steps is None:
        if topk is not None or ndt is not None:
            return None, PARTIAL
        steps, topk, ndt = sc.auto_params
    if topk is None:
        return None, STEPS_ONLY
    attn = {c.get("attention_backend"), c.get("decode_attention_backend"), c.get("prefill_attention_backend")}
    if "trtllm_mha" in attn and topk > 1:
        return None, TRTLLM_TOPK
    if topk == 1 or ndt is None:
        ndt = steps + 1                  # 0.5.9: "speculative_num_draft_tokens is adjusted to ... steps + 1"
    if topk > 1 and int(c.get("page_size") or 1) > 1 and c.get("attention_backend") not in ("flashinfer", "fa3"):
        return None, PAGED_TOPK
    path = c.get("speculative_draft_model_path") or "(self)"   # 0.5.9 falls back to the target's own weights
    draft = sc.drafts.get(path, sc.self_draft)
    spec = Spec(algo, steps, topk, ndt, draft, 0.0, simulated)
    spec.use_workload(None)
    return spec, None


def refusal_text(refusal: tuple[int, str, str], site: str) -> str:
    """The traceback SGLang 0.5.9 prints for a refused speculative config (stderr, exit 1)."""
    line, code, exc = refusal
    out = ["Traceback (most recent call last):"]
    for path, n, fn, src in _ARGS_FRAMES + [("srt/server_args.py", line, "_handle_speculative_decoding", code)]:
        out += [f'  File "{site}/{path}", line {n}, in {fn}', f"    {src}"]
    return "\n".join(out + [exc])


def max_running(given: dict[str, Any], spec: Spec | None, default: int) -> int:
    return MAX_RUNNING_RESET if spec is not None and "max_running_requests" not in given else default


def accept_part(setup: Any) -> str:
    """The `Decode batch` line's speculative part, as SGLang 0.5.9 logs it (scheduler_metrics_mixin.py:390):
    `accept len: X.XX, accept rate: Y.YY, ` before `cuda graph:`; empty without speculative decoding."""
    sp = setup.spec
    return "" if sp is None else f"accept len: {sp.accept_len():.2f}, accept rate: {sp.accept_rate():.2f}, "


def spec_accept(setup: Any) -> float | None:
    """`/get_server_info` `internal_states[0].avg_spec_accept_length` (None without speculative decoding)."""
    return None if setup.spec is None else round(setup.spec.accept_len(), 4)
