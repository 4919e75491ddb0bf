"""Where an SGLang flag (or a bundled patch) has any effect, read from SGLang's source: a knob outside its scope
changes nothing, so the search treats it as inactive there, as if the profile had written the `when:` itself.

`disable-flashinfer-autotune` does nothing with the deep_gemm MoE runner in SGLang 0.5.9 (its
`ModelRunner._should_run_flashinfer_autotune` returns early for every runner but flashinfer_trtllm and
flashinfer_mxfp4). A search that samples it there carries an arbitrary value along; when a later step switches
to flashinfer_trtllm, that value comes with it, the runner reads 30% slow with autotune off, and the walk learns
the wrong lesson about the runner. With the scope, a knob that becomes active takes its baseline value (SGLang's
default: autotune on), as every knob under a `when:` does.

- `implied(prof)`: knob -> the `when:` its scope implies, for knobs whose profile entry has no `when:` of its own
  (an explicit `when:`, even `{}`, is the profile's word) and whose controlling flag is a knob of the space with
  choices on both sides of the scope. Rules hold for the SGLang versions they name; none for the others.
- `apply(prof)`: sets them on the profile's knobs (`ParamSpec.conditions` reads them; nothing is written back to
  the YAML or the study's recorded space).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tunectl import knobs

if TYPE_CHECKING:                        # profile.py imports this module
    from tunectl.profile import ParamSpec, Profile

PATCH = knobs.PATCH_PREFIX
AUTOTUNE_PATCH = "0001-flashinfer-cutlass-autotune"
SPEC_EAGLE = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE")      # --speculative-algorithm: the EAGLE family


@dataclass(frozen=True)
class Scope:
    target: str                                   # flag name, or patch:<id>
    needs: dict[str, tuple[Any, ...]]             # controlling flag -> the values under which the target acts
    versions: tuple[str, ...] | None              # SGLang versions the rule was read from (None: every version)
    why: str
    # a patch (applied as a base patch or a knob of the space) that widens `needs`: patch id -> flag -> values
    widened_by: dict[str, dict[str, tuple[Any, ...]]] = field(default_factory=dict)


# `auto` stays in scope wherever it is a choice: what it resolves to depends on the model and the GPU.
SCOPES: tuple[Scope, ...] = (
    Scope("disable-flashinfer-autotune",
          {"moe-runner-backend": ("flashinfer_trtllm", "flashinfer_mxfp4", "auto")}, ("0.5.9",),
          "SGLang 0.5.9 runs FlashInfer autotune only for the flashinfer_trtllm and flashinfer_mxfp4 MoE runners "
          "(ModelRunner._should_run_flashinfer_autotune)",
          {AUTOTUNE_PATCH: {"moe-runner-backend": ("flashinfer_cutlass",)}}),
    Scope(PATCH + AUTOTUNE_PATCH,
          {"moe-runner-backend": ("flashinfer_cutlass", "auto"), "disable-flashinfer-autotune": (False,)},
          ("0.5.9",), "the patch adds flashinfer_cutlass to the runners FlashInfer autotune runs for"),
    Scope("cuda-graph-max-bs", {"disable-cuda-graph": (False,)}, None,
          "CUDA graph sizes are captured only with CUDA graphs on"),
    Scope("cuda-graph-bs", {"disable-cuda-graph": (False,)}, None,
          "CUDA graph sizes are captured only with CUDA graphs on"),
    # Speculative decoding (SGLang 0.5.9 ServerArgs._handle_speculative_decoding; the same flags in 0.5.17 and
    # 0.5.23): steps and topk are read for the EAGLE family only (NEXTN is EAGLE; NGRAM sets topk from
    # --speculative-ngram-max-bfs-breadth and drafts --speculative-num-draft-tokens), draft tokens for every
    # algorithm, a draft model path for EAGLE/EAGLE3/STANDALONE (NEXTN models draft with their own MTP heads).
    Scope("speculative-num-steps", {"speculative-algorithm": SPEC_EAGLE}, None,
          "--speculative-num-steps is read by the EAGLE family only (NGRAM drafts num-draft-tokens)"),
    Scope("speculative-eagle-topk", {"speculative-algorithm": SPEC_EAGLE}, None,
          "--speculative-eagle-topk is read by the EAGLE family only (NGRAM takes its ngram-max-bfs-breadth)"),
    Scope("speculative-num-draft-tokens", {"speculative-algorithm": (*SPEC_EAGLE, "NGRAM")}, None,
          "draft tokens are verified only with a speculative algorithm"),
    Scope("speculative-draft-model-path", {"speculative-algorithm": ("EAGLE", "EAGLE3", "STANDALONE")}, None,
          "a draft model is loaded for EAGLE, EAGLE3 and STANDALONE (NEXTN drafts with the model's MTP heads)"),
)


def _choices(spec: ParamSpec) -> list[Any] | None:
    if spec.type == "bool":
        return [False, True]
    return list(spec.choices) if spec.choices is not None else None


def _patches(prof: Profile) -> set[str]:
    return set(prof.server.patches) | {s.patch for s in prof.search.space.values() if s.patch is not None}


def implied(prof: Profile) -> dict[str, tuple[dict[str, Any], str]]:
    """knob -> (the `when:` its scope implies, why), for the knobs it applies to (module docstring)."""
    space = prof.search.space
    by_target = {knobs.target(n, s).key: n for n, s in space.items()}
    patches = _patches(prof)
    out: dict[str, tuple[dict[str, Any], str]] = {}
    for scope in SCOPES:
        knob = by_target.get(scope.target)
        if knob is None or "when" in space[knob].model_fields_set:
            continue
        if scope.versions is not None and prof.server.sglang_version not in scope.versions:
            continue
        when: dict[str, Any] = {}
        for flag, values in scope.needs.items():
            ctrl = by_target.get(flag)
            choices = _choices(space[ctrl]) if ctrl is not None else None
            if ctrl is None or ctrl == knob or choices is None:
                continue                    # fixed by the base flags, or a range: no condition to state
            wanted = set(values) | {v for p, more in scope.widened_by.items() if p in patches
                                    for v in more.get(flag, ())}
            keep = [c for c in choices if c in wanted]
            if keep and len(keep) < len(choices):
                when[ctrl] = keep if len(keep) > 1 else keep[0]
        if when:
            out[knob] = (when, scope.why)
    return _acyclic(space, out)


def _acyclic(space: dict[str, ParamSpec], conds: dict[str, tuple[dict[str, Any], str]]
             ) -> dict[str, tuple[dict[str, Any], str]]:
    """Drops an implied condition that would close a circle with the profile's own `when:`s (or another's)."""
    out = dict(conds)
    for knob in conds:
        stack, seen = list(out[knob][0]), set()
        while stack:
            other = stack.pop()
            if other == knob:
                del out[knob]
                break
            if other in space and other not in seen:
                seen.add(other)
                stack += out[other][0] if other in out else space[other].when
    return out


def apply(prof: Profile) -> Profile:
    """Sets each knob's implied condition (`ParamSpec.conditions`); returns the profile."""
    found = implied(prof)
    for name, spec in prof.search.space.items():
        spec.set_implied(found[name][0] if name in found else {})
    return prof


# ------------------------------------------------------------------------------------------ what a GPU lacks

# Backends whose kernels exist only for some GPU generations (compute capability major: 9 = Hopper, 10 =
# Blackwell datacenter, 12 = Blackwell workstation), whatever the model: TRT-LLM-gen MoE kernels are built for
# sm_100a; DeepGEMM for Hopper and Blackwell datacenter; SGLang's FlashAttention v3 backend asserts SM 8.x or 9.x
# (`attention_registry.create_flashattention_v3_backend`); trtllm_mha is SM100 only and trtllm_mla SM100/SM12x
# (`ServerArgs`: "only supported on Blackwell GPUs").
GPU_NEEDS: dict[tuple[str, str], tuple[int, ...]] = {
    ("moe-runner-backend", "flashinfer_trtllm"): (10,),
    ("moe-runner-backend", "deep_gemm"): (9, 10),
    ("attention-backend", "fa3"): (8, 9),
    ("attention-backend", "trtllm_mha"): (10,),
    ("attention-backend", "trtllm_mla"): (10, 12),
}

# GPU model names as nvidia-smi prints them -> compute capability x 10 (the first name contained wins)
GPU_SM: tuple[tuple[str, int], ...] = (
    ("B300", 103), ("B200", 100), ("RTX PRO 6000", 120), ("RTX 5090", 120), ("H100", 90), ("H200", 90),
    ("H800", 90), ("H20", 90), ("L40S", 89), ("L40", 89), ("L4", 89), ("RTX 4090", 89), ("RTX 6000 Ada", 89),
    ("A100", 80), ("A800", 80), ("A30", 80), ("A10G", 86), ("A10", 86), ("A40", 86), ("RTX A6000", 86),
    ("RTX 3090", 86))


def sm_of(gpu_name: str) -> int | None:
    """Compute capability x 10 of a GPU model name (None: not known, or several kinds of GPU)."""
    found = {next((sm for key, sm in GPU_SM if key.lower() in part.lower()), None)
             for part in gpu_name.split(",") if part.strip()}
    return found.pop() if len(found) == 1 else None


def gpu_lacks(prof: Profile, params: dict[str, Any], sm: int | None) -> list[str]:
    """What of `params` the GPU (compute capability x 10) has no kernels for: one line each; [] when unknown."""
    flags = {}
    for name, value in params.items():
        spec = prof.search.space.get(name)
        if spec is not None and (t := knobs.target(name, spec)).kind == "flag":
            flags[t.name] = value
    return flags_lack(flags, sm)


def flags_lack(flags: dict[str, Any], sm: int | None) -> list[str]:
    """What of a command line's flags (names without dashes) the GPU has no kernels for; [] when unknown."""
    if sm is None:
        return []
    out = []
    for flag, value in flags.items():
        majors = GPU_NEEDS.get((flag, value)) if isinstance(value, str) else None
        if majors is not None and sm // 10 not in majors:
            out.append(f"--{flag} {value} needs compute capability "
                       f"{' or '.join(f'{m}.x' for m in majors)}; this GPU is {sm // 10}.{sm % 10}")
    return out
