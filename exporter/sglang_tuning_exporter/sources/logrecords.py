"""Multi-line records of a log: Python tracebacks (`Scheduler hit an exception: Traceback ...`,
`Exception in ControllerSingle:` ...) and SGLang's multi-line KV-pool OOM message (`Prefill out of
memory. Try to lower your batch size.` / `Try to allocate N tokens.` / ...), collected line by line
(`Block`) and resolved into ONE event numbered by their first line (`resolve`). A traceback that ends
in an out-of-memory exception becomes an `oom` event whose phase comes from the message or, failing
that, from the frames (`forward_extend` vs `forward_decode`, ...). Pure: logreader.EventReader feeds it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from sglang_tuning_exporter.core import events as ev
from sglang_tuning_exporter.core.events import Event
from sglang_tuning_exporter.core.redact import redact_text
from sglang_tuning_exporter.sources.logmessages import (
    HEADROOM_TOO_SMALL,
    POOL_TOO_SMALL,
    graph_from_text,
    oom_detail_fields,
    oom_phase_from_text,
)

MAX_BLOCK_LINES = 2000  # a runaway "traceback" stops being collected (the event is still emitted)
_MAX_KEPT_LINES = 200
DEDUP_DISTANCE = 5000  # lines within which a re-raised OOM repeats an already reported one

_FRAME = re.compile(r'^\s*File "([^"]*)", line \d+, in (\S+)')
_EXC_LINE = re.compile(
    r"^((?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*)?(?:Error|Exception|Exit|Interrupt|Failure|Fault))(?:: ?(.*))?$")
_RANK_TAG = re.compile(r"^\[rank\d+\]:\s?")
_OOM_CONT = re.compile(
    r"^(?:Try to allocate|Ava(?:li|il)able (?:full |swa )?tokens|[\w.]*(?:available|evictable)_size\(\)"
    r"|(?:Full|SWA) LRU list|Possible solutions:|\d\. |Open an issue|\w+_size=|num_reqs="
    # the radix tree SGLang prints after the page-size-1 OOM (`tree_cache.pretty_print()`)
    r"|\s+\d+ \[[\d, ]*\] r=\d+$|#tokens: \d+$)")
_CHAIN = ("During handling of the above exception", "The above exception was the direct cause",
          "Traceback (most recent call last)")
# ... and every pool-too-small wording (the hybrid state and SWA pools' failures are raised, so reach the log
# as a traceback's last line), the headroom's too.
_OOM_TEXT = re.compile(r"(?i)out of memory|OutOfMemoryError|Not enough memory|leave no GPU memory"
                       r"|Capture (?:prefill )?(?:cuda |CUDA )?graph failed|" + POOL_TOO_SMALL.pattern
                       + "|" + HEADROOM_TOO_SMALL.pattern)

# Frames that tell the phase of a failure; the innermost frame that matches decides.
_PREFILL_FRAMES = ("forward_extend", "_execute_extend", "prepare_for_extend", "alloc_for_extend",
                   "alloc_paged_token_slots_extend", "get_new_batch_prefill", "process_batch_result_prefill",
                   "forward_prefill", "run_prefill", "prefill_cuda_graph_runner", "forward_fill_batch")
_DECODE_FRAMES = ("forward_decode", "_execute_decode", "prepare_for_decode", "alloc_for_decode",
                  "alloc_paged_token_slots_decode", "update_running_batch", "process_batch_result_decode",
                  "decode_cuda_graph_runner", "replay", "forward_decode_batch", "retract_decode")
_STARTUP_FRAMES = ("capture", "init_cuda_graphs", "load_model", "init_memory_pool", "profile_max_num_token",
                   "init_torch_distributed", "initialize", "capture_one_batch_size", "init_device_graphs",
                   "init_piecewise_cuda_graphs", "init_attention_backend", "init_cublas",
                   # 0.5.2x model runner (model_executor/model_runner.py and its components)
                   "init_decode_cuda_graph", "init_prefill_cuda_graph", "alloc_memory_pool",
                   "init_attention_backends", "init_kv_cache_configurator", "start_startup_weight_load",
                   "finalize_startup_weight_load", "_init_post_memory_pool_components", "capture_one")
# Graph runners: a failure inside one at start-up is that graph's capture.
_GRAPH_INIT = {"init_prefill_cuda_graph": "prefill", "init_decode_cuda_graph": "decode", "init_cuda_graphs": "decode",
               "capture_one_batch_size": "decode"}
# SGLang's own sizing failure: the pool does not fit after the weights (raise the fraction). Any other
# out-of-memory at start-up failed in the headroom the fraction leaves (lower it).


def phase_from_frames(frames: list[tuple[str, str]]) -> str | None:
    """prefill / decode / startup from traceback frames (file, function), innermost first wins; a
    traceback that never passes the event loop while the server is built is start-up whatever it ran
    (capturing a prefill graph runs prefill code: still start-up)."""
    funcs = [func for _, func in frames]
    in_loop = any(f.startswith("event_loop") for f in funcs)
    if not in_loop and any(f in _STARTUP_FRAMES for f in funcs):
        return "startup"
    for path, func in reversed(frames):
        if func in _PREFILL_FRAMES or "prefill_cuda_graph" in path:
            return "prefill"
        if func in _DECODE_FRAMES or func.startswith("alloc_for_decode") or "decode_cuda_graph" in path:
            return "decode"
        if func in _STARTUP_FRAMES:
            return "startup"
    # Before the first batch the scheduler is still being built: constructors (a workspace or buffer
    # allocated in some `__init__`) and no event-loop frame. At run time every traceback passes the loop.
    if not in_loop and ("__init__" in funcs or "run_scheduler_process" in funcs):
        return "startup"  # the scheduler process died before its loop started
    return None


def graph_from_frames(frames: list[tuple[str, str]]) -> str | None:
    """prefill / decode when a start-up traceback ran inside a CUDA-graph runner, else None."""
    for path, func in reversed(frames):
        if "prefill_cuda_graph" in path:
            return "prefill"
        if "cuda_graph_runner" in path:
            return "decode"
        if func in _GRAPH_INIT:
            return _GRAPH_INIT[func]
    return None


@dataclass
class Block:
    """A multi-line record being collected."""

    head: Event
    traceback: bool
    lines: list[str] = field(default_factory=list)
    frames: list[tuple[str, str]] = field(default_factory=list)
    count: int = 0
    exception: str | None = None
    exc_message: list[str] = field(default_factory=list)
    in_exc_message: bool = False

    def accepts(self, line: str) -> bool:
        """True when `line` continues this record."""
        if not line.strip():
            return self.traceback  # blank lines separate chained tracebacks
        s = _RANK_TAG.sub("", line)
        if _OOM_CONT.match(s):
            return True
        if not self.traceback:
            return False
        if s[0] in " \t" or s.startswith(_CHAIN) or _EXC_LINE.match(s):
            return True
        # Text right after the exception line continues a multi-line exception message.
        return self.in_exc_message and not s.startswith("[") and _looks_like_message(s)

    def add(self, line: str) -> None:
        """Take a continuation line."""
        self.count += 1
        s = _RANK_TAG.sub("", line.rstrip("\n"))
        if len(self.lines) < _MAX_KEPT_LINES:
            self.lines.append(s)
        f = _FRAME.match(s)
        if f:
            self.in_exc_message = False
            if len(self.frames) < _MAX_KEPT_LINES:
                self.frames.append((f.group(1), f.group(2)))
            return
        x = _EXC_LINE.match(s)
        if x and s[0] not in " \t":
            self.exception = x.group(1)
            self.exc_message = [x.group(2) or ""]
            self.in_exc_message = True
            return
        if s.startswith(_CHAIN):
            self.in_exc_message = False
            return
        if self.in_exc_message and s.strip() and len(self.exc_message) < 20:
            self.exc_message.append(s.strip())


def _looks_like_message(s: str) -> bool:
    # Lines of an exception message are prose, not another tool's log record.
    return not re.match(r"^(?:[IWEF]\d{4} |\d{4}-\d\d-\d\d |INFO|WARN|ERROR|DEBUG)", s)


def startup_oom(fields: dict[str, Any], frames: list[tuple[str, str]] | None = None) -> None:
    """Tell the start-up failures apart: `reason` mem_fraction_static_too_small (the pool does not fit
    after the weights: raise), cuda_graph_capture with the `graph` (prefill / decode) whose capture failed
    (its batch ceiling first), or init_headroom (a workspace or pool preallocation failed in the headroom:
    lower the fraction)."""
    if fields.get("phase") != "startup":
        return
    message = str(fields.get("message", ""))
    if POOL_TOO_SMALL.search(message):
        fields["reason"] = "mem_fraction_static_too_small"
        return
    graph = graph_from_text(message) or graph_from_frames(frames or [])
    if graph is not None:
        fields["reason"] = "cuda_graph_capture"
        fields["graph"] = graph
    elif fields.get("reason") in (None, "mem_fraction_static_too_small"):
        fields["reason"] = "init_headroom"


def resolve(b: Block, last_oom: tuple[int, str] | None) -> tuple[Event, bool]:
    """The one event a finished record becomes, given the last OOM the reader saw (line, first message
    line); True when it checked for a re-raised OOM while none was known (a reader started mid-file
    cannot know the lines before it: its caller re-checks)."""
    head = b.head
    blind = False
    fields: dict[str, Any] = dict(head.fields)
    if head.kind == ev.OOM:
        # SGLang's own multi-line OOM message: join the detail lines into the message.
        if b.lines:
            fields["message"] = "\n".join([str(fields.get("message", "")), *map(redact_text, b.lines)])
        oom_detail_fields(str(fields["message"]), fields)
        if fields.get("phase") == "unknown":
            fields["phase"] = phase_from_frames(b.frames) or "unknown"
        startup_oom(fields, b.frames)
        return Event(head.line, ev.OOM, head.time, dict(head.rank), fields), blind
    # A traceback-carrying error.
    frame_phase = phase_from_frames(b.frames)
    if b.frames:
        fields["frames"] = len(b.frames)
        fields["last_frame"] = b.frames[-1][1]
    if b.exception:
        fields["exception"] = b.exception
        fields["exception_message"] = "\n".join(b.exc_message).strip()
    text = "\n".join(b.exc_message) if b.exception else str(fields.get("message", ""))
    if b.exception and _OOM_TEXT.search(text + " " + b.exception):
        phase = oom_phase_from_text(text)
        if phase == "unknown":
            phase = frame_phase or "unknown"
        first = text.split("\n", 1)[0].strip()
        last = last_oom
        blind = last is None
        if last is not None and last[1] and last[1] == first and head.line - last[0] < DEDUP_DISTANCE:
            # The scheduler re-raises the OOM it has just logged: one incident, not two.
            fields["phase"] = phase
            fields["same_as_line"] = last[0]
            return Event(head.line, ev.ERROR, head.time, dict(head.rank), fields), blind
        oom_fields: dict[str, Any] = {"phase": phase, "message": text.strip(), "exception": b.exception,
                                      "error": fields.get("error")}
        oom_detail_fields(text, oom_fields)
        if b.frames:
            oom_fields["last_frame"] = b.frames[-1][1]
        startup_oom(oom_fields, b.frames)
        return Event(head.line, ev.OOM, head.time, dict(head.rank), oom_fields), blind
    if frame_phase:
        fields["phase"] = frame_phase
    return Event(head.line, ev.ERROR, head.time, dict(head.rank), fields), blind
