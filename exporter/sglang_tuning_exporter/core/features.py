"""Features SGLang switches off because of another setting (issue 22): the reasons its own messages give,
as codes (a signal's value is a number: the fact `cuda_graph_off` / `chunked_prefill_off` is the code) and
the words a finding prints.  A check whose remedy needs the feature says why instead of advising a flag
that cannot help."""

from __future__ import annotations

import re

SERVER_ARGS = 1  # the server arguments themselves (disable_cuda_graph, chunked_prefill_size -1, ...)
OTHER = 99  # an SGLang message whose reason is not one of the known ones

# SGLang 0.5.23's own reasons (arg_groups/*_hook.py, managers/scheduler.py), matched on the message's tail.
_REASONS: tuple[tuple[int, str, str], ...] = (
    (2, r"deepep_mode=`?normal", "deepep_mode=normal"),
    (3, r"torch native attention", "the torch native attention backend"),
    (4, r"Flex Attention", "the torch Flex Attention backend"),
    (5, r"--enable-mis", "--enable-mis"),
    (6, r"tensor dump", "tensor dump mode"),
    (7, r"msProbe", "msProbe dump mode"),
    (8, r"diffusion LLM", "diffusion LLM inference on AMD GPUs"),
    (9, r"multimodal models with the Transformers backend", "a multimodal model on the Transformers backend"),
)
_WORDS = {SERVER_ARGS: "the server arguments", OTHER: "another setting (SGLang's warning)",
          **{code: words for code, _, words in _REASONS}}
FEATURE_WORDS = {"cuda_graph_off": "CUDA graph", "chunked_prefill_off": "chunked prefill"}


def reason_code(reason: str) -> int:
    """The code of the reason an SGLang `... is disabled because <reason>` message gives."""
    for code, pattern, _ in _REASONS:
        if re.search(pattern, reason):
            return code
    return OTHER


def disabled_text(signal: str, code: float | None) -> str | None:
    """`CUDA graph disabled because deepep_mode=normal` for a fact's code; None when the feature is on."""
    if not code or signal not in FEATURE_WORDS:
        return None
    words = _WORDS.get(int(code), _WORDS[OTHER])
    return f"{FEATURE_WORDS[signal]} disabled because of {words}" if int(code) in (SERVER_ARGS, OTHER) \
        else f"{FEATURE_WORDS[signal]} disabled because {words}"
