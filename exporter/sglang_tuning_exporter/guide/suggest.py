"""Suggested flag values computed from evidence (signals) and the current server arguments.

Each method of checks.yaml `suggest.method` is a pure function returning the current value,
the suggested value and the reasoning that goes into the finding's evidence.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sglang_tuning_exporter.core.features import SERVER_ARGS, disabled_text
from sglang_tuning_exporter.core.versions import version_tuple
from sglang_tuning_exporter.guide.checks import Check, flag_choices

Signals = Mapping[str, float | None]

# Server-args key(s) holding a flag's current value, first found wins.
ARG_KEYS: dict[str, tuple[str, ...]] = {
    "--schedule-conservativeness": ("schedule_conservativeness",),
    "--mem-fraction-static": ("mem_fraction_static",),
    "--chunked-prefill-size": ("chunked_prefill_size",),
    "--max-prefill-tokens": ("max_prefill_tokens",),
    "--max-running-requests": ("max_running_requests",),
    "--cuda-graph-max-bs": ("cuda_graph_max_bs", "cuda_graph_max_bs_decode"),
    "--cuda-graph-max-bs-decode": ("cuda_graph_max_bs_decode", "cuda_graph_max_bs"),
    "--cuda-graph-max-bs-prefill": ("cuda_graph_max_bs_prefill",),
    "--schedule-policy": ("schedule_policy",),
    "--enable-metrics": ("enable_metrics",),
    "--max-mamba-cache-size": ("max_mamba_cache_size",),
    "--swa-full-tokens-ratio": ("swa_full_tokens_ratio",),
    "--context-length": ("context_length",),
}
# Signals that state a flag's effective value when the args do not (startup summary, capture).
FACT_OF: dict[str, str] = {
    "--chunked-prefill-size": "chunked_prefill_size",
    "--max-running-requests": "max_running_requests",
    "--cuda-graph-max-bs": "cuda_graph_max_bs_captured",
    "--cuda-graph-max-bs-decode": "cuda_graph_max_bs_captured",
    "--max-mamba-cache-size": "mamba_cache_size",
    "--context-length": "context_len",
}


@dataclass(frozen=True, slots=True)
class Suggestion:
    """The outcome of a suggest method."""

    current: Any
    suggested: Any
    reasoning: str


def default_schedule_policy(version: str | None) -> str | None:
    """SGLang's default --schedule-policy: lpm up to 0.4.3, fcfs from 0.4.4."""
    if version is None:
        return None
    return "fcfs" if version_tuple(version) >= (0, 4, 4) else "lpm"


def flag_spellings(check: Check, version: str | None, args: Mapping[str, Any]) -> tuple[str, ...]:
    """The spellings the running server may accept, oldest first: its own args decide first (one), then its
    release (one), else every spelling from its version floor on (core/versions; never a guess)."""
    if check.flag == "--chunked-prefill-size" and args:
        if "chunked_prefill_size" in args:
            return ("--chunked-prefill-size",)
        if "max_prefill_tokens" in args:
            return ("--max-prefill-tokens",)
    if check.flag == "--cuda-graph-max-bs":
        if "cuda_graph_max_bs_decode" in args:
            return ("--cuda-graph-max-bs-decode",)
        if "cuda_graph_max_bs" in args:  # the field was renamed with the flag (0.5.14)
            return ("--cuda-graph-max-bs",)
    return flag_choices(check, version)


def flag_name(check: Check, version: str | None, args: Mapping[str, Any]) -> str | None:
    """The flag the running server accepts; when its spelling is not known, the newest (the finding's text
    names the others: guide/checks.spelling_note)."""
    names = flag_spellings(check, version, args)
    return names[-1] if names else None


def current_value(flag: str | None, args: Mapping[str, Any], sig: Signals,
                  version: str | None = None) -> tuple[Any, str]:
    """(value, where it came from) for a flag: server args, then startup facts, then known defaults."""
    if flag is None:
        return None, ""
    for key in ARG_KEYS.get(flag, ()):
        if args.get(key) is not None:
            return args[key], f"server_args {key}"
    fact = FACT_OF.get(flag)
    if fact is not None and sig.get(fact) is not None:
        v = sig[fact]
        return (int(v) if v is not None and float(v).is_integer() else v), f"startup log {fact}"
    if flag == "--mem-fraction-static" and sig.get("mem_fraction_static_estimate") is not None:
        return sig["mem_fraction_static_estimate"], ("an estimate from the startup memory lines "
                                                     "(1 - (avail after weights - KV size) / GPU memory)")
    if flag == "--schedule-conservativeness":
        return 1.0, "SGLang default (1.0 since 0.2.0)"
    if flag == "--schedule-policy":
        d = default_schedule_policy(version)
        if d is not None:
            return d, f"SGLang {version} default"
    return None, ""


def _round_step(x: float, step: float, up: bool) -> float:
    n = x / step
    n = math.ceil(n - 1e-9) if up else math.floor(n + 1e-9)
    return round(n * step, 6)


def _f(x: float | None) -> str:
    if x is None:
        return "?"
    return f"{x:.2f}".rstrip("0").rstrip(".") if not float(x).is_integer() else str(int(x))


def s_none(check: Check, p: Mapping[str, Any], cur: Any, sig: Signals) -> Suggestion:
    """No server-side value (client-side remedies)."""
    return Suggestion(cur, None, "")


def s_constant(check: Check, p: Mapping[str, Any], cur: Any, sig: Signals) -> Suggestion:
    """The guide's fixed value (e.g. --max-running-requests 128 for the latency recipe)."""
    return Suggestion(cur, p.get("value", check.suggest.guide_value), "the guide's value")


def s_toward_target(check: Check, p: Mapping[str, Any], cur: Any, sig: Signals) -> Suggestion:
    """Move to the guide's target (0.3 / 1.3); past it already, one more 0.1 step, bounded."""
    target = float(p["target"])
    lo, hi = float(p.get("min", 0.0)), float(p.get("max", 10.0))
    c = float(cur) if isinstance(cur, (int, float)) else None
    if c is None:
        return Suggestion(cur, target, f"the guide's value {_f(target)}")
    increase = check.action == "increase"
    if (increase and c < target) or (not increase and c > target):
        return Suggestion(cur, target, f"move from {_f(c)} to the guide's {_f(target)}")
    nxt = round(min(hi, c + 0.1) if increase else max(lo, c - 0.1), 2)
    if (increase and nxt <= c) or (not increase and nxt >= c):
        # At the bound a "change" to the same value would mislead: say this flag has done what it can.
        return Suggestion(cur, None, f"already at {_f(c)} (guide: {_f(target)}), at the bound of this advice "
                                     f"({_f(lo)}-{_f(hi)}): no further step on this flag; see the runbook")
    return Suggestion(cur, nxt, f"already at {_f(c)} (guide: {_f(target)}); one more 0.1 step")


def s_mem_fraction_headroom(check: Check, p: Mapping[str, Any], cur: Any, sig: Signals) -> Suggestion:
    """current + (available - target) / GPU memory, rounded to 0.01 and bounded."""
    target, step = float(p.get("target_gb", 6.5)), float(p.get("step", 0.01))
    lo, hi = float(p.get("min", 0.5)), float(p.get("max", 0.95))
    avail, total = sig.get("available_gpu_mem_gb"), sig.get("gpu_mem_total_gb")
    if avail is None or not total:
        fallback = check.suggest.guide_value
        c = float(cur) if isinstance(cur, (int, float)) and not isinstance(cur, bool) else None
        step_down = p.get("fallback_step")
        if check.action == "decrease" and c is not None and step_down is not None \
                and (fallback is None or float(fallback) >= c):
            # Already at or under the guide's value: a "change" to it would raise the fraction.
            s = round(max(lo, c - float(step_down)), 2)
            return Suggestion(cur, s, f"headroom or GPU memory unknown: lower by {step_down} from {c:g}")
        return Suggestion(cur, fallback, "GPU memory unknown (no `Load weight begin. avail mem` line)"
                          + (f"; the guide's value {fallback}" if fallback is not None else ""))
    delta = (avail - target) / total
    how = (f"headroom {_f(avail)} GB -> {_f(target)} GB target on a ~{_f(total)} GB GPU "
           f"(estimated from the `Load weight` lines): change {delta:+.3f}")
    if not isinstance(cur, (int, float)):
        return Suggestion(cur, None, how + "; current --mem-fraction-static unknown (its default None is computed "
                          "at start-up; /server_info or the start-up memory lines state it): apply the change to it")
    raw = float(cur) + delta
    # Rounding down is the safe side both ways: a raise stays under the target, a cut leaves more headroom.
    s = _round_step(raw, step, up=False)
    s = round(min(hi, max(lo, s)), 2)
    # The current value in full (0.758, not 0.76), so that the sum shown adds up.
    return Suggestion(cur, s, f"{how}: {float(cur):g} {delta:+.3f} = {raw:.3f}, rounded to {s:.2f}"
                      f" (bounded {lo}-{hi})")


def s_mem_fraction_for_weights(check: Check, p: Mapping[str, Any], cur: Any, sig: Signals) -> Suggestion:
    """At least weights / GPU memory plus a margin (startup `Not enough memory`)."""
    margin, step = float(p.get("margin", 0.1)), float(p.get("step", 0.01))
    lo, hi = float(p.get("min", 0.5)), float(p.get("max", 0.95))
    w, total = sig.get("weights_gb"), sig.get("gpu_mem_total_gb")
    c = float(cur) if isinstance(cur, (int, float)) else None
    # SGLang's own minimum viable fraction (`Raise --mem-fraction-static above X`): never suggest less than it
    # plus the margin for a KV cache.
    floor = sig.get("mem_fraction_floor")
    least = min(hi, _round_step(floor + margin, step, up=True)) if floor is not None else None
    said = f"; SGLang's own minimum {_f(floor)} + {margin} margin = {least:.2f} is the floor" if least else ""
    if w is not None and total:
        need = w / total + margin
        s = min(hi, max(lo, _round_step(need, step, up=True), least or 0.0))
        if c is not None and s <= c:
            s = min(hi, round(c + 0.05, 2))
        return Suggestion(cur, round(s, 2), f"weights {_f(w)} GB on a ~{_f(total)} GB GPU = {w / total:.3f}"
                          f" of memory, + {margin} margin for the KV cache -> {s:.2f}{said}"
                          + (" (at the 0.95 cap: consider more GPUs or quantization)" if s >= hi else ""))
    if least is not None:
        return Suggestion(cur, round(max(least, lo), 2), "weights size unknown" + said)
    if c is not None:
        return Suggestion(cur, round(min(hi, c + 0.05), 2), "weights size unknown: raise by 0.05 and retry")
    return Suggestion(cur, check.suggest.guide_value, "weights size unknown: the guide's offline value")


def s_chunked_prefill_halve(check: Check, p: Mapping[str, Any], cur: Any, sig: Signals) -> Suggestion:
    """The guide's 4096 then 2048; below that halve, never under `min`."""
    steps = sorted((int(x) for x in p.get("steps", [4096, 2048])), reverse=True)
    lo = int(p.get("min", 512))
    off = sig.get("chunked_prefill_off")
    if off and int(off) != SERVER_ARGS:
        # SGLang itself turned chunked prefill off because of another setting: the flag cannot bring it back.
        return Suggestion(cur, None, f"{disabled_text('chunked_prefill_off', off)}: SGLang keeps it off whatever "
                          "--chunked-prefill-size says, so lowering it cannot help; lower --mem-fraction-static "
                          "(0.8 or 0.7) or the longest prompts instead")
    if off or (isinstance(cur, (int, float)) and not isinstance(cur, bool) and cur <= 0):
        return Suggestion(cur, steps[0], f"chunked prefill is off (--chunked-prefill-size "
                          f"{_f(cur) if isinstance(cur, (int, float)) and cur else cur or -1}):"
                          f" {steps[0]} turns it on, so a long prompt is prefilled in chunks")
    if not isinstance(cur, (int, float)) or cur <= 0:
        return Suggestion(cur, steps[0], f"current size unknown: the guide's first step {steps[0]}")
    for s in steps:
        if cur > s:
            return Suggestion(cur, s, f"{int(cur)} -> {s} (the guide: 4096, then 2048)")
    s = max(lo, int(cur) // 2)
    return Suggestion(cur, s, f"already at or below the guide's 2048: halve to {s}")


def s_chunked_prefill_double(check: Check, p: Mapping[str, Any], cur: Any, sig: Signals) -> Suggestion:
    """Double the chunk (long prompts take fewer steps to their first token), at most `max`."""
    hi = int(p.get("max", 16384))
    if not isinstance(cur, (int, float)) or isinstance(cur, bool) or cur <= 0:
        return Suggestion(cur, check.suggest.guide_value, "current size unknown or chunking off: the guide's 8192")
    if cur >= hi:
        return Suggestion(cur, None, f"already at {_f(cur)}, the ceiling of this advice ({hi}): shorten the prompts or "
                          "enable Piecewise CUDA Graph")
    return Suggestion(cur, min(hi, int(cur) * 2), f"double {_f(cur)}, at most {hi}")


def s_scale_down_running(check: Check, p: Mapping[str, Any], cur: Any, sig: Signals) -> Suggestion:
    """A fraction of the batch that ran out of memory (the cap, or the largest batch seen if lower)."""
    factor, mult, lo = float(p.get("factor", 0.75)), int(p.get("multiple", 8)), int(p.get("min", 8))
    cap = float(cur) if isinstance(cur, (int, float)) and cur > 0 else None
    seen = sig.get("running_max")
    base, why = cap, "the current cap"
    if seen is not None and (base is None or seen < base):
        base, why = seen, "the largest decode batch seen"
    if base is None:
        return Suggestion(cur, None, "neither the cap nor the batch size is known: lower it in steps of 25 %")
    s = max(lo, int(_round_step(base * factor, mult, up=False)))
    return Suggestion(cur, s, f"{factor:.0%} of {why} ({_f(base)}), rounded down to a multiple of {mult}")


def s_cuda_graph_cover(check: Check, p: Mapping[str, Any], cur: Any, sig: Signals) -> Suggestion:
    """Cover the p90 of the decode batch sizes that missed, rounded up to the capture step."""
    step, hi = int(p.get("step", 8)), int(p.get("max", 768))
    cap = sig.get("max_running_requests")
    p90 = sig.get("cuda_graph_miss_batch_p90")
    c = float(cur) if isinstance(cur, (int, float)) else None
    if p90 is None:
        base = max(float(check.suggest.guide_value or 512), 2 * c if c else 0.0)
        why = "batch sizes of the misses unknown (counters only)"
    else:
        base = p90
        why = f"p90 of the decode batch sizes that ran without a graph = {_f(p90)}"
    s = int(_round_step(base, step, up=True))
    bound = hi if not cap else min(hi, int(cap))
    s = min(s, bound)
    if c is not None and s <= c:
        s = min(bound, int(_round_step(c + step, step, up=True)))
    return Suggestion(cur, s, f"{why}; rounded up to a multiple of {step}, bounded by "
                      f"{'max_running_requests ' + _f(cap) if cap else 'the guide'} and {hi}")


def s_cuda_graph_ceiling(check: Check, p: Mapping[str, Any], cur: Any, sig: Signals) -> Suggestion:
    """min(max_running_requests, the guide's typical 256), rounded to the capture step."""
    target, step = int(p.get("default_target", 256)), int(p.get("step", 8))
    cap = sig.get("max_running_requests")
    s = target if not cap else min(target, int(cap))
    s = int(_round_step(s, step, up=True))
    return Suggestion(cur, s, f"the guide's typical default {target}, bounded by max_running_requests {_f(cap)}")


def s_cuda_graph_ceiling_down(check: Check, p: Mapping[str, Any], cur: Any, sig: Signals) -> Suggestion:
    """A graph that failed to capture: its batch ceiling down (a fraction, rounded down to the capture step),
    with the static fraction's step computed from torch's free/total figures named as the alternative."""
    factor, step, lo = float(p.get("factor", 0.5)), int(p.get("step", 8)), int(p.get("min", 8))
    target = float(p.get("target_gb", 6.5))
    free, total = sig.get("oom_gpu_free_gb"), sig.get("gpu_mem_total_gb")
    alt = ""
    if free is not None and total and free < target:
        delta = _round_step((target - free) / total, 0.01, up=True)
        alt = (f"; alternative: lower --mem-fraction-static by {delta:.2f} ({_f(free)} GB free of ~{_f(total)} GB "
               f"at the failure -> {_f(target)} GB)")
    c = float(cur) if isinstance(cur, (int, float)) and not isinstance(cur, bool) and cur > 0 else None
    if c is None:
        return Suggestion(cur, None, f"current ceiling unknown: lower it (SGLang's own example: {p.get('example')})"
                          + alt)
    s = max(lo, int(_round_step(c * factor, step, up=False)))
    if s >= c:
        return Suggestion(cur, None, f"already at {_f(c)}, the floor of this advice ({lo}): lower --mem-fraction-static"
                          " instead" + alt)
    return Suggestion(cur, s, f"{factor:.0%} of {_f(c)}, rounded down to a multiple of {step}" + alt)


def s_running_to_kv_target(check: Check, p: Mapping[str, Any], cur: Any, sig: Signals) -> Suggestion:
    """Scale the cap so KV usage reaches the target: cap * target / mean usage, at most max_factor x."""
    target, mf = float(p.get("usage_target", 0.9)), float(p.get("max_factor", 2.0))
    hi, mult = int(p.get("max", 4096)), int(p.get("multiple", 8))
    usage = sig.get("token_usage_mean")
    if not isinstance(cur, (int, float)) or cur <= 0:
        return Suggestion(cur, check.suggest.guide_value, "current cap unknown: the guide's offline value")
    c = float(cur)
    if not usage:
        s = min(hi, int(c * mf))
        return Suggestion(cur, s, f"token usage unknown: x{mf}")
    raw = min(c * mf, c * target / usage)
    s = max(int(c) + mult, int(_round_step(raw, mult, up=True)))
    s = min(max(hi, int(c)), s)
    return Suggestion(cur, s, f"{_f(c)} x {target} / mean token usage {usage:.2f} = {c * target / usage:.0f},"
                      f" at most x{mf}, rounded to a multiple of {mult}")


def _number(cur: Any) -> float | None:
    return float(cur) if isinstance(cur, (int, float)) and not isinstance(cur, bool) and cur > 0 else None


def s_mamba_cache_for_wanted(check: Check, p: Mapping[str, Any], cur: Any, sig: Signals) -> Suggestion:
    """State slots for the requests wanted: (running cap + median queue) x slots per request, bounded."""
    mf, mult = float(p.get("max_factor", 4.0)), int(p.get("multiple", 8))
    size = _number(cur) or sig.get("mamba_cache_size_seen")  # else `mamba num / mamba usage` of Decode lines
    base = sig.get("mamba_running_cap") or sig.get("running_max")
    if not base:
        return Suggestion(cur, None, "neither the running cap nor the batch size is known")
    queue = sig.get("queue_p50") or 0.0
    wanted, why = base + queue, f"wanted = the running cap {_f(base)} + the median queue {_f(queue)}"
    asked = sig.get("max_running_requests_arg")
    bound, bound_why = base * mf, f"{mf:g}x the cap"
    if asked and asked > base and asked < bound:
        bound, bound_why = asked, f"the --max-running-requests asked for ({_f(asked)})"
    if wanted > bound:
        wanted, why = bound, why + f", bounded by {bound_why}"
    wanted = math.ceil(wanted)
    slots = sig.get("mamba_slots_per_request")
    if slots:
        raw, how = wanted * slots, f"{wanted} requests x {_f(slots)} state slots per request"
    elif size:
        raw, how = size * wanted / base, f"the pool {_f(size)} x {wanted} / {_f(base)} running"
    else:
        return Suggestion(cur, None, f"{why}; the state pool's size is unknown (no `Mamba Cache is allocated` line): "
                                     f"scale it by {wanted / base:.2f}")
    out = int(_round_step(raw, mult, up=True))
    if size is not None and out <= size:
        out = int(_round_step(size + mult, mult, up=True))
    return Suggestion(cur, out, f"{why}; {how} = {raw:.0f}, rounded up to a multiple of {mult}")


def s_kv_pool_for_cap(check: Check, p: Mapping[str, Any], cur: Any, sig: Signals) -> Suggestion:
    """Grow the KV pool by requested / granted requests, within the headroom SGLang leaves above the floor."""
    step, hi = float(p.get("step", 0.01)), float(p.get("max", 0.95))
    floor_gb = float(p.get("min_headroom_gb", 5.0))
    asked, cap = sig.get("max_running_requested"), sig.get("max_running_requests")
    kv, total, avail = sig.get("kv_cache_gb"), sig.get("gpu_mem_total_gb"), sig.get("available_gpu_mem_gb")
    alternatives = "; or --kv-cache-dtype fp8_e4m3 (half the bytes per token), or a lower --context-length"
    c = _number(cur)
    if not (asked and cap and total and avail is not None):
        return Suggestion(cur, None, "the requested cap, GPU memory or headroom is unknown" + alternatives)
    need = (kv * (asked / cap - 1.0)) if kv else None
    room = avail - floor_gb
    if room <= 0:
        return Suggestion(cur, None, f"headroom {_f(avail)} GB leaves nothing above {_f(floor_gb)} GB for a larger "
                                     f"static fraction" + alternatives)
    add = room if need is None else min(need, room)
    why = (f"KV pool {_f(kv)} GB x ({_f(asked)} requested / {_f(cap)} granted - 1) = {_f(need)} GB" if need is not None
           else "KV pool size unknown")
    why += f", within the headroom above {_f(floor_gb)} GB ({_f(room)} GB): +{add / total:.3f} of ~{_f(total)} GB"
    if c is None:
        return Suggestion(cur, None, why + "; current --mem-fraction-static unknown: apply the change to it" + alternatives)
    s = round(min(hi, _round_step(c + add / total, step, up=False)), 2)
    if s <= c:
        return Suggestion(cur, None, why + ": less than one 0.01 step" + alternatives)
    return Suggestion(cur, s, why + f" = {s:.2f}" + alternatives)


def s_swa_ratio_balance(check: Check, p: Mapping[str, Any], cur: Any, sig: Signals) -> Suggestion:
    """current x mean SWA usage / mean full usage, at most max_factor x, rounded up to the step."""
    mf, step = float(p.get("max_factor", 2.0)), float(p.get("step", 0.05))
    c = _number(cur)
    swa_t, full_t = sig.get("swa_pool_tokens"), sig.get("full_pool_tokens")
    if c is None and swa_t and full_t:
        c = swa_t / full_t  # the start-up `Use sliding window memory pool` line
    if c is None:
        c = float(p.get("default", 0.8))  # SGLang's default --swa-full-tokens-ratio
    swa, full = sig.get("swa_usage_mean"), sig.get("full_usage_mean")
    factor = min(mf, swa / full) if swa and full else mf
    why = (f"mean swa token usage {swa:.2f} / mean full token usage {full:.2f}" if swa and full
           else "pool usages unknown") + f" -> x{factor:.2f} (at most x{mf:g})"
    s = round(_round_step(c * factor, step, up=True), 2)
    if s <= c:
        s = round(_round_step(c + step, step, up=True), 2)
    return Suggestion(cur, s, f"{_f(c)} {why} = {s:.2f}")


def s_context_to_pool(check: Check, p: Mapping[str, Any], cur: Any, sig: Signals) -> Suggestion:
    """The tokens the KV pool holds, rounded down to a multiple."""
    mult = int(p.get("multiple", 1024))
    tokens = sig.get("kv_pool_tokens") or sig.get("max_total_num_tokens")
    if not tokens:
        return Suggestion(cur, None, "the KV pool's size is unknown")
    if tokens < mult:  # a pool this small wants more memory rather than a shorter context
        return Suggestion(cur, None, f"the KV pool holds only {_f(tokens)} tokens: no useful context length fits; "
                                     "raise --mem-fraction-static instead")
    s = int(_round_step(tokens, mult, up=False))
    return Suggestion(cur, s, f"the KV pool holds {_f(tokens)} tokens, rounded down to a multiple of {mult}")


METHODS: dict[str, Callable[[Check, Mapping[str, Any], Any, Signals], Suggestion]] = {
    "none": s_none, "constant": s_constant, "toward_target": s_toward_target,
    "mem_fraction_headroom": s_mem_fraction_headroom, "mem_fraction_for_weights": s_mem_fraction_for_weights,
    "chunked_prefill_halve": s_chunked_prefill_halve, "scale_down_running": s_scale_down_running,
    "chunked_prefill_double": s_chunked_prefill_double,
    "cuda_graph_cover": s_cuda_graph_cover, "cuda_graph_ceiling": s_cuda_graph_ceiling,
    "running_to_kv_target": s_running_to_kv_target, "cuda_graph_ceiling_down": s_cuda_graph_ceiling_down,
    "mamba_cache_for_wanted": s_mamba_cache_for_wanted, "kv_pool_for_cap": s_kv_pool_for_cap,
    "swa_ratio_balance": s_swa_ratio_balance, "context_to_pool": s_context_to_pool,
}


def suggest(check: Check, sig: Signals, args: Mapping[str, Any], version: str | None,
            workload: str | None = None) -> tuple[str | None, Suggestion]:
    """(flag the server accepts, suggestion) for a check that fires on a rank with signals `sig`."""
    flag = flag_name(check, version, args)
    cur, source = current_value(flag, args, sig, version)
    result = METHODS[check.suggest.method](check, check.suggest_params(workload), cur, sig)
    if source and cur is not None:
        result = Suggestion(result.current, result.suggested,
                            f"current {_f(cur) if isinstance(cur, (int, float)) and not isinstance(cur, bool) else cur}"
                            f" from {source}" + (f"; {result.reasoning}" if result.reasoning else ""))
    return flag, result
