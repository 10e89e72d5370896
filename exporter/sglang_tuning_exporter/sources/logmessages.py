"""The parser's handlers of SGLang's messages other than batch lines: retractions, OOMs, errors,
startup memory and capacity, CUDA-graph capture, server args, versions (each `(line, n) -> result`).
Pure."""

from __future__ import annotations

import re
from typing import Any

from sglang_tuning_exporter.core import events as ev
from sglang_tuning_exporter.core.events import Event
from sglang_tuning_exporter.core.redact import redact_text
from sglang_tuning_exporter.sources.logline import (
    PARTIAL,
    RETRACT_KEYS,
    UNPARSED,
    ParseResult,
    auto_value,
    make_event,
    normalise_key,
    read_pairs,
    reason_text,
)
from sglang_tuning_exporter.sources.serverargs import parse_server_args

# SGLang's own retraction line after its prefix (0.4-0.5.x); _RETRACT_HEAD reads it and older spellings.
# SGLang's own start-up sizing failure: the pool does not fit after the weights (raise the fraction).
# The hybrid (mamba / linear-attention) state pool failing at start-up is the same advice (SGLang 0.5.2x,
# mem_cache/kv_cache_configurator.py): more static memory.
# The sliding-window pool too small for one request, or its cap (DSV4's too) leaving none for the full pool
# (0.5.1x-0.5.2x, model_executor/pool_configurator.py, raised): more KV budget, the same advice.
POOL_TOO_SMALL = re.compile(r"Not enough memory\. Please try to increase|leave no GPU memory for the KV cache"
                            r"|state cache is too small to serve any requests"
                            r"|Not enough GPU memory for hybrid \(mamba/linear-attention\) state cache"
                            r"|SWA pool \(\d+ tokens\) cannot hold even one request"
                            r"|SWA pool cap \(\d+ tokens, [^)]{1,40}\) leaves no room for the full KV pool")
# A start-up pool taken from the headroom the fraction leaves (the int8 mamba checkpoint pool, raised): the
# remedy is the fraction down, startup_oom's init_headroom.
HEADROOM_TOO_SMALL = re.compile(r"int8 mamba checkpoint pool needs")
RETRACT_HEAD_STD = "KV cache pool is full. Retract requests. "
_RETRACT_HEAD = re.compile(
    r"(?i)(decode out of memory happened[.,]?|kv cache pool is full\. retract requests\.|testing retraction\.) ?")
_RATIO = re.compile(r"#new_token_ratio: ([0-9.]+) -> ([0-9.]+)")


def retract_line(s: str, n: int) -> ParseResult:
    m = _RETRACT_HEAD.search(s)
    if m is not None:
        p, body_at = m.start(), m.end()
    else:
        p = body_at = s.find("#retracted_reqs")
        if p < 0:
            return None
    fields: dict[str, Any] = {}
    r = _RATIO.search(s, body_at)
    body = s[body_at:r.start() if r else len(s)].rstrip().rstrip(",")
    bad = read_pairs(body, ", ", RETRACT_KEYS, fields)
    if r is not None:
        fields["new_token_ratio_before"] = float(r.group(1))
        fields["new_token_ratio_after"] = float(r.group(2))
    if "num_retracted_reqs" not in fields:
        return UNPARSED
    if m is not None and m.group(1).lower().startswith("testing"):
        fields["testing"] = True
    if bad:
        fields[PARTIAL] = bad
    return make_event(n, ev.RETRACT, s[:p], fields)


# --- OOM ---------------------------------------------------------------------------------------
_OOM = re.compile(
    r"(?P<pd>(?i:prefill|decode)) out of memory(?! happened)"
    r"|(?P<generic>Out of memory\. (?:Try to lower|Please set))"
    r"|(?P<reqslots>alloc_req_slots runs out of memory)"
    r"|(?P<cuda>CUDA out of memory|OutOfMemoryError|CUDA error: out of memory)"
    r"|(?P<capture>Capture (?:prefill )?(?:cuda |CUDA )?graph failed)"
    r"|(?P<startup>" + POOL_TOO_SMALL.pattern + ")"  # the one rule the window's startup OOM follows too
    r"|(?P<headroom>" + HEADROOM_TOO_SMALL.pattern + ")"
    # a request aborted by a retraction that could not keep its KV (0.5.22+: no backup, or the host pool full)
    r"|(?P<abort>due to OOM|Out of memory even after retracting|retract_decode: aborted request )")
# Bounded and anchored to a token start: an unbounded `\w*...Error` search is quadratic on long words.
_EXC_HEAD = re.compile(r"(?<![\w.])((?:[A-Za-z_]\w{0,60}\.){0,8}[A-Z]\w{0,60}?(?:Error|Exception)): ")
_TRY_ALLOC = re.compile(r"Try to allocate (\d+) tokens")
_AVAIL_TOKENS = re.compile(r"Ava(?:li|il)able tokens: (\d+)")
_TRIED = re.compile(r"Tried to allocate ([0-9.]+) ([KMGT]i?B)")
# `Not enough memory. ... Current value: mem_fraction_static=0.3` (late 2026): the value SGLang resolved.
_MFS_VALUE = re.compile(r"Current value: mem_fraction_static=(\d+(?:\.\d+)?)"
                        r"|KV cache under --mem-fraction-static=(\d+(?:\.\d+)?)")
# 0.5.2x `... Raise --mem-fraction-static above 0.772 (minimum viable = ...)`: SGLang's own floor.
_MFS_FLOOR = re.compile(r"Raise --mem-fraction-static above (\d+(?:\.\d+)?)")
_MFS_VIABLE = re.compile(r"minimum viable = [^=]{0,40}= (-?\d+(?:\.\d+)?)")
# The hybrid state pool's figures in its start-up failures (0.5.2x).
_MAMBA_FIGURES = re.compile(r"\b(max_mamba_cache_size|mamba_ratio|max_num_reqs|total_rest_memory|mamba_cache_per_req)="
                            r"(-?\d+(?:\.\d+)?)( ?[GM]B)?")
# The SWA pool's figures (its tokens, its cap's bytes, the floor of one request, the budget it left).
_SWA_FIGURES = re.compile(r"SWA pool (?:cap )?\((\d+) tokens(?:, ([0-9.]+) Gi?B)?\)"
                          r"|\b(sliding_window_size|page_size) \((\d+)\)|within the available ([0-9.]+) Gi?B")
# The int8 mamba checkpoint pool's need, the free memory and its size flag.
_CKPT_FIGURES = re.compile(r"checkpoint pool needs ~([0-9.]+)GB but only ([0-9.]+)GB HBM is free"
                           r"(?:.{0,60}\(currently (\d+)\))?")
# torch's allocator message ("capacty" in torch 2.0-2.1): the GPU's size and what was free at the failure,
# the headroom fact of an OOM before the first batch.
_CAPACITY = re.compile(r"GPU (\d+) has a total capac(?:i)?ty of ([0-9.]+) ([KMGT]i?B) of which ([0-9.]+) ([KMGT]i?B)"
                       r" is free")
_UNIT_GB = {"KiB": 1 / 1024**2, "KB": 1e-6, "MiB": 1 / 1024, "MB": 1e-3, "GiB": 1.0, "GB": 1.0, "TiB": 1024.0,
            "TB": 1000.0}


def oom_phase_from_text(text: str) -> str:
    """Phase named by an OOM message itself: prefill, decode, startup, or unknown."""
    m = _OOM.search(text)
    if m is None:
        return "unknown"
    if m.group("pd"):
        return m.group("pd").lower()
    if m.group("capture") or m.group("startup") or m.group("headroom"):
        return "startup"
    if m.group("abort") or m.group("reqslots"):
        # Request-slot exhaustion (`alloc_req_slots runs out of memory`, raised while a prefill batch is
        # built too): the request pool ran out, whose remedy is --max-running-requests down (decode_oom's).
        return "decode"
    return "unknown"


# Which CUDA graph failed to capture: SGLang's wrapper names it (`Capture prefill CUDA graph failed:`, the
# breakable backend's `Fail when using backend: X for prefill runner.`), else the decode graph's wrapper.
_PREFILL_GRAPH = re.compile(r"Capture prefill CUDA graph failed|for prefill runner\.")
_DECODE_GRAPH = re.compile(r"Capture (?:cuda |CUDA )?graph failed")


def graph_from_text(text: str) -> str | None:
    """prefill / decode when an OOM message names the CUDA graph whose capture failed, else None."""
    if _PREFILL_GRAPH.search(text):
        return "prefill"
    if _DECODE_GRAPH.search(text):
        return "decode"
    return None


def oom_detail_fields(text: str, fields: dict[str, Any]) -> None:
    """Numbers an OOM message carries (tokens asked/available, CUDA bytes asked), and the pool that ran out
    when it is the request pool."""
    if "alloc_req_slots runs out of memory" in text:
        fields["pool"] = "req_to_token"
    m = _TRY_ALLOC.search(text)
    if m:
        fields["tokens_requested"] = int(m.group(1))
    m = _AVAIL_TOKENS.search(text)
    if m:
        fields["tokens_available"] = int(m.group(1))
    m = _TRIED.search(text)
    if m:
        fields["tried_to_allocate_gb"] = round(float(m.group(1)) * _UNIT_GB.get(m.group(2), 1.0), 4)
    m = _MFS_VALUE.search(text)
    if m:
        fields["mem_fraction_static"] = float(m.group(1) or m.group(2))  # the effective value (default None)
    m = _MFS_FLOOR.search(text)
    if m:
        fields["mem_fraction_floor"] = float(m.group(1))
    m = _MFS_VIABLE.search(text)
    if m:
        fields["mem_fraction_static_viable"] = float(m.group(1))  # 1 - available / pre-load memory, unrounded
    for key, value, unit in _MAMBA_FIGURES.findall(text):
        fields[key + ("_" + unit.strip().lower() if unit else "")] = auto_value(value)
    for tokens, cap_gb, key, value, available_gb in _SWA_FIGURES.findall(text):
        if tokens:
            fields["swa_tokens"] = int(tokens)
        if cap_gb:
            fields["swa_cap_gb"] = float(cap_gb)
        if key:
            fields[key] = int(value)
        if available_gb:
            fields["available_gb"] = float(available_gb)
    m = _CKPT_FIGURES.search(text)
    if m:
        fields["mamba_checkpoint_pool_gb"] = float(m.group(1))
        fields["gpu_free_gb"] = float(m.group(2))
        if m.group(3):
            fields["int8_mamba_ckpt_size"] = int(m.group(3))
    m = _CAPACITY.search(text)
    if m:
        fields["gpu"] = int(m.group(1))
        fields["gpu_total_gb"] = round(float(m.group(2)) * _UNIT_GB.get(m.group(3), 1.0), 4)
        fields["gpu_free_gb"] = round(float(m.group(4)) * _UNIT_GB.get(m.group(5), 1.0), 4)


def oom_line(s: str, n: int) -> ParseResult:
    m = _OOM.search(s)
    if m is None:
        return retract_line(s, n) if "out of memory happened" in s.lower() else None
    p = m.start()
    exception = None
    # `RuntimeError: Prefill out of memory...` / `torch.OutOfMemoryError: CUDA out of memory...`
    for x in _EXC_HEAD.finditer(s, max(0, p - 300), m.end() + 2):
        if x.start() <= p:
            exception, p, msg_at = x.group(1), x.start(), x.end()
    message = s[msg_at if exception else p:].strip()
    fields: dict[str, Any] = {"phase": oom_phase_from_text(message), "message": redact_text(message)}
    if exception:
        fields["exception"] = exception
    if m.group("startup"):
        fields["reason"] = "mem_fraction_static_too_small"
    elif m.group("headroom"):
        fields["reason"] = "init_headroom"
    elif m.group("capture"):
        fields["reason"] = "cuda_graph_capture"
        fields["graph"] = graph_from_text(message) or "decode"
    oom_detail_fields(s, fields)
    return make_event(n, ev.OOM, s[:p], fields)


# --- errors ------------------------------------------------------------------------------------
_ERROR_HEAD = re.compile(
    r"(?P<head>\b\w+ hit an exception|Exception in \w+|Traceback \(most recent call last\)"
    r"|Received sigquit from a child process)")


def error_line(s: str, n: int) -> ParseResult:
    m = _ERROR_HEAD.search(s)
    if m is None:
        return None
    head = m.group("head")
    rest = s[m.end():].lstrip(":. ").strip()
    fields: dict[str, Any] = {"error": head if not head.startswith("Traceback") else "Traceback"}
    if rest:
        fields["message"] = redact_text(rest)  # a failed download's URL may carry a token
    return make_event(n, ev.ERROR, s[:m.start()], fields)


# --- startup memory / capacity -----------------------------------------------------------------
_SPLIT_STARTUP = re.compile(r"[.,] +")
_BS = re.compile(r"\bbs=?\s*\[([0-9,\s]*)\]?")
_NUM_LIST = re.compile(r"\b(\w+)=\[([0-9,\s]*)\]")
_UNIT = re.compile(r"^(-?[0-9.]+)\s*(GB|MB|GiB|MiB|s)\.?$")
_STARTUP_ALIASES = {
    "Time elapsed": "elapsed", "#tokens": "kv_tokens", "max_total_num_token": "max_total_num_tokens",
    "max_prefill_num_token": "max_prefill_tokens",
}


def _startup_pairs(body: str, fields: dict[str, Any]) -> None:
    for piece in _SPLIT_STARTUP.split(body.strip().rstrip(".")):
        eq = piece.find("=")
        colon = piece.find(": ")
        if eq < 0 and colon < 0:
            continue
        if colon >= 0 and (eq < 0 or colon < eq):
            k, v = piece[:colon], piece[colon + 2:]
        else:
            k, v = piece[:eq], piece[eq + 1:]
        raw = k.strip()
        key = _STARTUP_ALIASES.get(raw) or normalise_key(raw)
        if not key or len(raw.split()) > 4:
            continue  # prose, not a field
        v = v.strip()
        u = _UNIT.match(v)
        if u:
            unit = u.group(2).lower().replace("ib", "b")
            fields[f"{key}_{unit}"] = float(u.group(1))
        else:
            fields[key] = auto_value(v)


def _batch_sizes(s: str, fields: dict[str, Any]) -> str:
    m = _BS.search(s)
    if m is not None:
        sizes = [int(x) for x in re.findall(r"\d+", m.group(1))]
        if sizes:
            fields["batch_sizes"] = sizes
        s = s[:m.start()] + s[m.end():]
    # Other number lists (the prefill graph's `num_tokens=[64, 128, ...]`, 0.5.14+): kept as lists.
    for k, body in _NUM_LIST.findall(s):
        fields[normalise_key(k)] = [int(x) for x in re.findall(r"\d+", body)]
    return _NUM_LIST.sub("", s) if "[" in s else s


# ... and the multi-layer EAGLE draft's one graph (0.5.15+): `Capture single-CG draft extend begin. ... avail mem=`
_CAPTURE = re.compile(r"Capture (?P<what>[\w ]{0,80}?(?:graph|single-CG draft extend)) (?P<stage>begin|end|bs)\b[.,]? ?")
_LOAD = re.compile(r"Load weight (begin|end)\. ?")
_COMMIT = re.compile(r"in ([0-9.]+) s \(capture overlap window ([0-9.]+) s, startup overlap total ([0-9.]+) s\)")
_KV = re.compile(r"(?:(?<![\w-])(?P<label>[\w-]{1,40}) )?KV Cache (?P<stage>is allocated|VA upper bound)\. ?")
_POST_KV = re.compile(r"Post-capture KV sizing: (?:(?P<alloc>KV cache allocated)\. ?)?")
_DSV4 = re.compile(r"DS[vV]4 (memory calculation|pool sizes): ")  # official releases print `DSV4`
_INIT_DIST = re.compile(r"Init torch distributed (begin|ends?)\.? ?")
_SUMMARY = re.compile(r"max_total_num_tokens?=")
# SGLang's own cuts of --max-running-requests (0.5.2x, mem_cache/kv_cache_configurator.py and
# model_runner_components/kv_pool_runtime.py): by the KV pool (`from the requested`; older `from requested`,
# and the post-capture re-sizing) or by the hybrid state pool (`capped to N by the mamba state cache`).
_REDUCED = re.compile(r"max_running_requests was reduced from (?:the )?(?:requested )?(\d+) to (\d+)"
                      r"|Post-capture KV sizing: max_running_requests (\d+) -> (\d+)")
_MAMBA_CAP = re.compile(r"max_running_requests is capped to (\d+) by the mamba state cache "
                        r"\(max_mamba_cache_size=(\d+), (\d+) state slots per request\)")
# A cap SGLang chose itself: speculative decoding's 48 (arg_groups/speculative_hook.py) or a model
# family's own value (`Setting max_running_requests to N for <arch>.`, arg_groups/deepseek_v4_hook.py).
_CAP_DEFAULT = re.compile(r"Max running requests is reset to (\d+) for (speculative decoding)"
                          r"|Setting max_running_requests to (\d+) for ([\w.-]{1,80})")
_TIMINGS = re.compile(r"Engine startup timings \(s\): ")


def _startup(kind_stage: str, s: str, n: int, p: int, body: str) -> ParseResult:
    fields: dict[str, Any] = {"stage": kind_stage}
    _startup_pairs(body, fields)
    return make_event(n, ev.STARTUP_MEMORY, s[:p], fields)


def load_weight_line(s: str, n: int) -> ParseResult:
    m = _LOAD.search(s)
    if m is None:
        return None
    body = s[m.end():]
    if m.group(1) == "end" and body.startswith("Committed"):
        c = _COMMIT.search(body)
        if c is None:
            return UNPARSED
        fields: dict[str, Any] = {"stage": "load_weight_commit", "elapsed_s": float(c.group(1)),
                                  "capture_overlap_window_s": float(c.group(2)),
                                  "startup_overlap_total_s": float(c.group(3))}
        return make_event(n, ev.STARTUP_MEMORY, s[:m.start()], fields)
    e = _startup(f"load_weight_{m.group(1)}", s, n, m.start(), body)
    if isinstance(e, Event) and "avail_mem_gb" not in e.fields:
        return UNPARSED
    return e


def kv_cache_line(s: str, n: int) -> ParseResult:
    m = _POST_KV.search(s)
    if m is not None:
        stage = "post_capture_kv_allocated" if m.group("alloc") else "post_capture_kv_sizing"
        return _startup(stage, s, n, m.start(), s[m.end():])
    m = _KV.search(s)
    if m is None:
        return None
    stage = "kv_cache_allocated" if m.group("stage") == "is allocated" else "kv_cache_va_upper_bound"
    label = m.group("label")
    p = m.start() if label and label not in ("The",) else m.start("stage") - len("KV Cache ")
    e = _startup(stage, s, n, p, s[m.end():])
    if isinstance(e, Event):
        if label and p == m.start():
            e.fields["pool"] = label
        if not any(k.endswith("_gb") for k in e.fields):
            return UNPARSED
    return e


def memory_pool_end_line(s: str, n: int) -> ParseResult:
    p = s.find("Memory pool end.")
    if p < 0:
        return None
    e = _startup("memory_pool_end", s, n, p, s[p + len("Memory pool end."):])
    if isinstance(e, Event) and "avail_mem_gb" not in e.fields:
        return UNPARSED
    return e


def capture_line(s: str, n: int) -> ParseResult:
    m = _CAPTURE.search(s)
    if m is None:
        return None
    what = m.group("what").strip()
    what = what[:-len("graph")].strip() if what.endswith("graph") else what
    prefill = "prefill" in what.lower() or "piecewise" in what.lower()
    stage = ("prefill_graph_" if prefill else "cuda_graph_") + m.group("stage")
    fields: dict[str, Any] = {"stage": stage}
    if what and what.lower() != "cuda":
        fields["graph"] = what
    body = s[m.end():]
    if m.group("stage") == "bs":
        body = "bs=" + body  # older releases: `Capture cuda graph bs [1, 2, 4, ...]`
    body = _batch_sizes(body, fields)
    _startup_pairs(body, fields)
    if m.group("stage") == "bs" and "batch_sizes" not in fields:
        return UNPARSED
    return make_event(n, ev.STARTUP_MEMORY, s[:m.start()], fields)


# `Disable prefill CUDA graph because <reason>` (model runner, 0.5.14+; INFO or WARNING)
_PREFILL_OFF = re.compile(r"Disable prefill CUDA graph because ?")
# The prefill graph's other wordings (0.5.15-0.5.23: `Disable prefill CUDA graph for EAGLE target ...`, `Disable
# draft prefill CUDA graph because ...`, `... capture because no configured capture size fits backend=X with
# max_capture_tokens=N (...)`, `Disabling prefill CUDA graph (full) by default for ...`, `Breakable CUDA graph is
# incompatible with X; disabling prefill CUDA graph.`) and a speculative draft's decode graph (`Disable DFLASH
# draft cuda graph because only 1.51 GB GPU memory is available ...`): the whole message is the reason.
_PREFILL_OFF_OTHER = re.compile(r"(?i)Disabl(?:e|ing)(?: \w+)? prefill CUDA graph(?: capture| \([^)]{0,40}\))?"
                                r" (?:because|for|by default)|; disabling prefill CUDA graph"
                                r"|Disable (?P<draft>\w+) draft cuda graph because")
_NAMED_NUMBER = re.compile(r"\b([a-z][\w-]{0,40}?)(?: size)?=(\d+)\b")
_ONLY_GB = re.compile(r"only (\d+(?:\.\d+)?) GB GPU memory is available")


def prefill_graph_off_line(s: str, n: int) -> ParseResult:
    m = _PREFILL_OFF.search(s)
    if m is not None:
        return make_event(n, ev.STARTUP_MEMORY, s[:m.start()],
                      {"stage": "prefill_graph_disabled", "reason": reason_text(s[m.end():], full_stop=False)})
    m = _PREFILL_OFF_OTHER.search(s)
    if m is None:
        return None
    at = s.rfind("] ", 0, m.start() + 1)  # the message starts after the prefix's `] `
    at = at + 2 if at >= 0 else 0
    draft = m.group("draft")
    fields: dict[str, Any] = {"stage": "draft_graph_disabled" if draft else "prefill_graph_disabled",
                              "reason": reason_text(s[at:], full_stop=False)}
    if draft:
        fields["graph"] = f"{draft} draft"
    for key, value in _NAMED_NUMBER.findall(s, m.end()):
        fields[normalise_key(key)] = int(value)
    gb = _ONLY_GB.search(s, m.end())
    if gb is not None:
        fields["avail_mem_gb"] = float(gb.group(1))
    return make_event(n, ev.STARTUP_MEMORY, s[:at], fields)


# CUDA graphs SGLang switched off because of another argument (0.5.23 arg_groups/*_hook.py): `Cuda graph is
# disabled because deepep_mode=`normal``, `... because of using torch native attention backend`, `CUDA graph is
# disabled because --enable-mis is set.`, `Cuda graph and server warmup are disabled because of using tensor
# dump mode`, `Cuda graph is disabled for diffusion LLM inference on AMD GPUs`. Not the runtime `CUDA graph
# disabled for N consecutive decode steps` (no `is`). Chunked prefill, mixed chunks and the radix cache switched
# off are logsettings' `setting_forced`.
_CONFIG_OFF = re.compile(r"(?i)\bcuda graph(?: and [\w -]{1,40}?)? (?:is|are) disabled (?:because |for )(?:of )?"
                         r"(?:using )?")


def config_off_line(s: str, n: int) -> ParseResult:
    m = _CONFIG_OFF.search(s)
    if m is None:
        return None
    return make_event(n, ev.STARTUP_MEMORY, s[:m.start()],
                  {"stage": "cuda_graph_disabled", "reason": reason_text(s[m.end():], full_stop=False)})


def summary_line(s: str, n: int) -> ParseResult:
    m = _REDUCED.search(s)
    if m is not None:
        post = m.group(3) is not None
        return make_event(n, ev.MAX_RUNNING_REDUCED, s[:m.start()],
                      {"requested": int(m.group(3 if post else 1)), "reduced_to": int(m.group(4 if post else 2)),
                       "by": "kv_pool_post_capture" if post else "kv_pool"})
    m = _MAMBA_CAP.search(s)
    if m is not None:
        return make_event(n, ev.MAX_RUNNING_REDUCED, s[:m.start()],
                      {"reduced_to": int(m.group(1)), "by": "mamba_state", "max_mamba_cache_size": int(m.group(2)),
                       "mamba_slots_per_request": int(m.group(3))})
    m = _CAP_DEFAULT.search(s)
    if m is not None:
        spec = m.group(1) is not None
        return make_event(n, ev.MAX_RUNNING_DEFAULT, s[:m.start()],
                      {"value": int(m.group(1 if spec else 3)), "reason": m.group(2 if spec else 4).rstrip(".")})
    m = _SUMMARY.search(s)
    if m is None:
        return None
    p = m.start()
    prefix = s[:p]
    fields: dict[str, Any] = {"stage": "summary"}
    _startup_pairs(s[p:].rstrip().rstrip(","), fields)
    if not isinstance(fields.get("max_total_num_tokens"), int):
        return UNPARSED
    return make_event(n, ev.STARTUP_MEMORY, prefix, fields)


# `KV pool holds N tokens, fewer than --context-length C.` (managers/tp_worker.py, 0.5.2x)
_KV_BELOW_CONTEXT = re.compile(r"KV pool holds (\d+) tokens, fewer than --context-length (\d+)")
# `Mamba Cache is allocated. max_mamba_cache_size: N, conv_state size: X GB, ssm_state size: Y GB ...`
_MAMBA_ALLOC = re.compile(r"Mamba Cache is allocated\. max_mamba_cache_size: (\d+)")
_STATE_GB = re.compile(r"\b(\w+) size: (\d+(?:\.\d+)?)GB")
# `Use sliding window memory pool. full_layer_tokens=F, swa_layer_tokens=S` (and `(all SWA). swa_layer_tokens=S`)
_SWA_POOL = re.compile(r"Use sliding window memory pool(?: \(all SWA\))?\. ")
# `Post-capture KV sizing: decode CUDA graph max_bs=B < max_running_requests=R; reserving activation headroom`
_GRAPH_GAP = re.compile(r"Post-capture KV sizing: decode CUDA graph max_bs=(\d+) < max_running_requests=(\d+)")


def capacity_line(s: str, n: int) -> ParseResult:
    """SGLang's capacity start-up lines: the KV pool below --context-length, the mamba state pool's and the
    sliding-window pool's sizes, the decode graph's ceiling below the running cap (post-capture sizing)."""
    m = _KV_BELOW_CONTEXT.search(s)
    if m is not None:
        return make_event(n, ev.STARTUP_MEMORY, s[:m.start()], {"stage": "kv_pool_below_context",
                                                             "kv_pool_tokens": int(m.group(1)),
                                                             "context_len": int(m.group(2))})
    m = _MAMBA_ALLOC.search(s)
    if m is not None:
        fields: dict[str, Any] = {"stage": "mamba_cache_allocated", "max_mamba_cache_size": int(m.group(1))}
        for key, gb in _STATE_GB.findall(s, m.end()):
            fields[f"{key}_gb"] = float(gb)
        return make_event(n, ev.STARTUP_MEMORY, s[:m.start()], fields)
    m = _SWA_POOL.search(s)
    if m is not None:
        fields = {"stage": "swa_pool"}
        _startup_pairs(s[m.end():], fields)
        if not isinstance(fields.get("swa_layer_tokens"), int):
            return UNPARSED
        return make_event(n, ev.STARTUP_MEMORY, s[:m.start()], fields)
    m = _GRAPH_GAP.search(s)
    if m is not None:
        return make_event(n, ev.STARTUP_MEMORY, s[:m.start()], {"stage": "post_capture_graph_gap",
                                                             "decode_graph_max_bs": int(m.group(1)),
                                                             "max_running_requests": int(m.group(2))})
    return None


def dsv4_line(s: str, n: int) -> ParseResult:
    m = _DSV4.search(s)
    if m is None:
        return None
    stage = "dsv4_" + m.group(1).replace(" ", "_")
    return _startup(stage, s, n, m.start(), s[m.end():])


def init_dist_line(s: str, n: int) -> ParseResult:
    m = _INIT_DIST.search(s)
    if m is None:
        return None
    stage = "init_torch_distributed_" + ("begin" if m.group(1) == "begin" else "end")
    return _startup(stage, s, n, m.start(), s[m.end():])


_TIMING_PAIR = re.compile(r"\b(\w+)=(\{[^}]*\}|[0-9.]+)")


def timings_line(s: str, n: int) -> ParseResult:
    m = _TIMINGS.search(s)
    if m is None:
        return None
    fields: dict[str, Any] = {}
    for key, value in _TIMING_PAIR.findall(s, m.end()):
        if value.startswith("{"):
            fields[f"{key}_s"] = {k: float(v) for k, v in _TIMING_PAIR.findall(value)}
        else:
            fields[f"{key}_s"] = float(value)
    if not fields:
        return UNPARSED
    return make_event(n, ev.STARTUP_TIMINGS, s[:m.start()], fields)


def server_args_line(s: str, n: int) -> ParseResult:
    p = s.find("server_args")
    if p < 0:
        return None
    after = s[p + len("server_args"):p + len("server_args") + 3]
    if not (after.startswith("=") or after.startswith(": ")):
        return None
    try:
        args = parse_server_args(s[p:])
    except (RecursionError, MemoryError):
        args = None
    if not args:
        return UNPARSED
    return make_event(n, ev.SERVER_ARGS, s[:p], args)


_VERSION = re.compile(
    r"(?i)\bsglang(?:==| version:? ?v?|version_line[=:] ?v?|:v| v)(\d+\.\d+(?:\.\d+)?(?:\.?post\d+|rc\d+|\.dev\d+)?)\b")


def version_line(s: str, n: int) -> ParseResult:
    m = _VERSION.search(s)
    if m is None:
        return None
    return make_event(n, ev.VERSION, s[:m.start()], {"version": m.group(1)})
