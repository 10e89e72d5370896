"""The parser's handlers of SGLang's messages about its settings: arguments changed without a restart
(POST /set_internal_state) or refused, and settings SGLang forces itself (each `(line, n) -> result`). Pure."""

from __future__ import annotations

import re
from typing import Any

from sglang_tuning_exporter.core import events as ev
from sglang_tuning_exporter.sources.logline import UNPARSED, ParseResult, auto_value, make_event, reason_text
from sglang_tuning_exporter.sources.serverargs import parse_server_args

# Runtime changes (POST /set_internal_state): SGLang logs the applied arguments, or why a key was refused.
_UPDATED = re.compile(r"Config updated via context override: |Global server args updated! (?:get_global_server_args\(\)=)?")
_REJECTED = re.compile(r"Updating (\w+) (?:is not supported\.|to (.{1,200}?) is rejected because it is out of the valid "
                       r"range \[(-?\d+), (-?\d+)\]\.|is (rejected while .{1,200}?)\.?$)")


def runtime_update_line(s: str, n: int) -> ParseResult:
    m = _UPDATED.search(s)
    if m is not None:
        body = s[m.end():].strip()
        try:
            args = {} if body == "{}" else parse_server_args(body)
        except (RecursionError, MemoryError):
            args = None
        if args is None:
            return UNPARSED
        return make_event(n, ev.SERVER_ARGS_UPDATE, s[:m.start()], {"updated": args})
    m = _REJECTED.search(s)
    if m is None:
        return None
    fields: dict[str, Any] = {"key": m.group(1)}
    if m.group(2) is not None:
        fields.update(value=auto_value(m.group(2)), reason="out_of_range", valid_min=int(m.group(3)),
                      valid_max=int(m.group(4)))
    elif m.group(5) is not None:
        fields["reason"] = reason_text(m.group(5), full_stop=False)
    else:
        fields["reason"] = "not_supported"
    return make_event(n, ev.SERVER_ARGS_REJECTED, s[:m.start()], fields)


# SGLang switching chunked prefill, mixed chunks or the radix cache off itself (server_args / arg_groups hooks,
# 0.5.15-0.5.23), or resizing the chunk: the rules about them are moot or judged on SGLang's value.
_FEATURE_WORDS = (("chunked prefill", "chunked_prefill"), ("mixed chunk", "mixed_chunk"),
                  ("chunked-prefill-size -1", "chunked_prefill"), ("turn off --chunked-prefill-size", "chunked_prefill"),
                  ("radix cache", "radix_cache"), ("disable-radix-cache", "radix_cache"),
                  ("forced as chunk cache", "radix_cache"))
_FORCED = re.compile(r"(?i)(?:mixed chunk(?:ed prefill)?|chunked prefill|radix cache)(?: and (?:mixed chunk|chunked prefill"
                     r"|radix cache))? (?:is|are) disabled\b|disabling radix cache and chunked prefill|without radix cache, "
                     r"chunked prefill|forcing [^\n]{0,80}?--chunked-prefill-size -1|Automatically turn off "
                     r"--chunked-prefill-size|KV cache is forced as chunk cache")
_PAGE_SIZE = re.compile(r"page_size = (\d+)")
# Sizes SGLang sets itself: the chunk (DP attention, KV sharding), the per-request SWA ring (0.5.23), a
# multimodal model's decode graph raised to the running cap (qwen3_vl, 0.5.23).
_RESIZED = re.compile(r"(?i)(?P<chunk>chunked prefill size is adjusted (?:from (?P<c_from>\d+) )?to (?P<c_to>\d+)"
                      r"|Rounding --chunked-prefill-size up from (?P<r_from>\d+) to (?P<r_to>\d+))"
                      r"|SWA ring: swa_max_total_num_tokens (?P<s_from>\d+) -> (?P<s_to>\d+)"
                      r"|Expanding multimodal decode CUDA graph max_bs from (?P<g_from>\d+) to max_running_requests="
                      r"(?P<g_to>\d+)")
_RESIZED_SETTING = (("c", "chunked_prefill_size"), ("r", "chunked_prefill_size"), ("s", "swa_max_total_num_tokens"),
                    ("g", "cuda_graph_max_bs"))


def forced_line(s: str, n: int) -> ParseResult:
    m = _RESIZED.search(s)
    fields: dict[str, Any]
    if m is not None:
        tag, setting = next((t, name) for t, name in _RESIZED_SETTING if m.group(f"{t}_to") is not None)
        before = m.group(f"{tag}_from")
        fields = {"setting": setting, "to": int(m.group(f"{tag}_to"))}
        if before is not None:
            fields["from"] = int(before)
        page = _PAGE_SIZE.search(s, m.end())
        if page is not None:
            fields["page_size"] = int(page.group(1))
    else:
        m = _FORCED.search(s)
        if m is None:
            return None
        low = s[m.start():].lower().replace("mixed chunked prefill", "mixed chunk")
        fields = {"features": list(dict.fromkeys(f for word, f in _FEATURE_WORDS if word in low))}
    at = s.rfind("] ", 0, m.start() + 1)  # the message starts after SGLang's (or a decoration's) `] `
    at = at + 2 if at >= 0 else 0
    fields["reason"] = reason_text(s[at:])
    return make_event(n, ev.SETTING_FORCED, s[:at], fields)
