"""The sidecar's engine: one `tick(now, mono)` reads the log, scrapes SGLang, refreshes server info and
re-evaluates the guide. No threads and no clock here; `serve.py` calls `tick` from its loop. The HTTP
sources' requests (and the parsing of what they answer) run as `Jobs` (sidecar/jobs.py): in threads
under `serve`, so one slow source never holds the loop; their outcomes are applied on the loop.

The parser and advisor layers are reached through small Protocols so tests hand in fakes and the
sidecar degrades (no findings, still serving) when one of them is unavailable.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sglang_tuning_exporter.core import durations, limits
from sglang_tuning_exporter.core.events import Event
from sglang_tuning_exporter.core.model import Finding, Observation, Rank, Sample, ServerState
from sglang_tuning_exporter.core.redact import redact_text
from sglang_tuning_exporter.core.timeparse import plausible_seconds
from sglang_tuning_exporter.core.versions import merge_version
from sglang_tuning_exporter.pipeline.observations import SERVER_EVENT_KINDS, scraped_pool_pairs, server_update
from sglang_tuning_exporter.sidecar.change_tracker import ChangeTracker
from sglang_tuning_exporter.sidecar.jobs import InlineJobs, Jobs, Outcome
from sglang_tuning_exporter.sidecar.outlierwarn import OutlierWarning
from sglang_tuning_exporter.sidecar.ranknames import RankNames
from sglang_tuning_exporter.sidecar.state import LiveState
from sglang_tuning_exporter.sources.scrape import (
    COUNTED,
    ScrapeInterpreter,
    ScrapeResult,
    parse_exposition,
    wanted,
)
from sglang_tuning_exporter.sources.serverinfo import FetchResult, HttpError, HttpGet, ServerInfoClient

log = logging.getLogger("sglang_tuning_exporter.sidecar.engine")


class LineSource(Protocol):
    """`tail.Follower`: complete new lines on each poll, plus rotation/truncation counters."""

    rotations: int
    truncations: int

    def poll(self) -> list[str]: ...


class EventFeed(Protocol):
    """`logreader.EventReader`: lines in, events out (multi-line aware)."""

    def feed(self, line: str) -> list[Event]: ...


class SignalWindow(Protocol):
    """`signals.Window`."""

    def add(self, obs: Observation) -> None: ...

    def add_items(self, items: Iterable[Observation | Sample]) -> None: ...  # what to_samples feeds

    def prune(self, now: float) -> None: ...

    def signals(self, now: float) -> Mapping[Rank, Mapping[str, float | None]]: ...

    def set_server_facts(self, by_dp: Sequence[Mapping[str, float]]) -> None: ...


ToObservations = Callable[[list[Event], float], list[Observation]]  # events read at `now`
# The same, with each Decode/Prefill line's batch values as one Sample (cheaper per line).
ToSamples = Callable[[list[Event], float], list[Observation | Sample]]
Evaluate = Callable[[Mapping[Rank, Mapping[str, float | None]], ServerState], list[Finding]]
Document = Callable[[list[Finding], Mapping[Rank, Mapping[str, float | None]], ServerState, float],
                    Mapping[str, Any]]


@dataclass(slots=True)
class Advisor:
    """The guide layer as the sidecar uses it (bound to table, profile, workload and config)."""

    window: SignalWindow | None
    evaluate: Evaluate | None
    document: Document | None
    to_observations: ToObservations | None
    window_s: float | None = None  # the window actually used (a --config file may set it)
    exported_signals: frozenset[str] | None = None  # signals put on /metrics (None: all)
    to_samples: ToSamples | None = None  # preferred over to_observations when set
    # The release the log's line formats reveal (`>=X.Y.Z`): flag names and defaults follow it until
    # a version line or the server info names the release.
    version_floor: Callable[[], str | None] | None = None
    # The current log time for a wall time (docs/signals.md, "Clocks"): windows are evaluated at it
    # and scrapes are timed by it, so replayed history is judged as `diagnose` judges it.
    log_now: Callable[[float], float] | None = None
    implausible_times: Callable[[], int] | None = None  # stamps the log clock took at a neighbour's time
    implausible_example: Callable[[], str | None] | None = None  # the first of them, as written


@dataclass(slots=True)
class LogInput:
    """The log source: follower + reader (+ how to read unparsed/oversized counts from the reader)."""

    follower: LineSource
    reader: EventFeed
    exists: Callable[[], bool]
    unparsed: Callable[[], int] = lambda: 0
    oversized: Callable[[], int] = lambda: 0
    idle_flush_s: float = 5.0
    # `--from-start`: the file's history is replayed on the log's clock; once it is read to its end and
    # nothing new arrives, the clock stops there (the figures stay the log's; docs/signals.md, "Clocks").
    replay: bool = False


@dataclass(slots=True)
class MetricsInput:
    """The SGLang HTTP source."""

    base_url: str
    timeout: float
    interval: float
    get: HttpGet
    server_info_interval: float = 300.0
    info_get: HttpGet | None = None  # server info's own getter (a smaller body cap); None: `get`


def _internal(exc: BaseException) -> str:
    """A source's detail for an unforeseen exception (redacted before the cut: a cut secret escapes it)."""
    return f"internal error: {type(exc).__name__}: {redact_text(str(exc))[:200]}"


@dataclass(frozen=True, slots=True)
class _Scraped:
    """What a scrape job hands back to the loop: a failure, or the interpreted exposition (observations
    within the rank cap) and what the limits cut, by limit."""

    duration_s: float
    result: ScrapeResult | None = None
    cuts: tuple[tuple[str, int], ...] = ()
    detail: str = ""
    reason: str | None = None


@dataclass(slots=True)
class Sidecar:
    """Wires sources -> state -> advisor; `tick(now)` does one round of work."""

    state: LiveState
    advisor: Advisor
    log_input: LogInput | None = None
    metrics: MetricsInput | None = None
    timer: Callable[[], float] = field(default=lambda: 0.0)  # monotonic, for durations
    evaluate_every_s: float = 5.0  # signals and checks are windowed: no need to redo them every tick
    on_evaluated: Callable[[], None] | None = None  # e.g. pre-render the evaluation's metric families
    server_overrides: Mapping[str, Any] = field(default_factory=dict)
    changes: ChangeTracker | None = None  # flag changes and their verdicts (issue 16)
    jobs: Jobs = field(default_factory=InlineJobs)  # where the HTTP sources' requests run
    _interp: ScrapeInterpreter = field(default_factory=ScrapeInterpreter)
    _info: ServerInfoClient | None = None
    _next_scrape: float = float("-inf")
    _next_info: float = float("-inf")
    _start_marker: str | None = None
    _version: str | None = None
    _last_line_at: float | None = None
    _next_eval: float = float("-inf")
    _floor_noted: str | None = None  # the last release floor the log's line formats gave
    _replay_wall: float | None = None  # `--from-start`: the tick that last read lines of the replay
    _replay_end: float | None = None  # the log time the replay ended at (the clock stops there)
    evaluations: int = 0
    _wall: float = 0.0  # the current tick's time (config events carry no clock of their own)
    _mono: float = 0.0  # the current tick's monotonic time: what schedules and ages
    _started: dict[str, float] = field(default_factory=dict)  # source -> mono start of its running job
    _overdue: set[str] = field(default_factory=set)  # sources whose running job was already failed as late
    _fetched: set[str] = field(default_factory=set)  # running jobs past their request (parsing: not late)
    _info_tried: bool = False  # the first scrape waits for the first server-info answer (rank sizes)
    _outliers: OutlierWarning = field(default_factory=OutlierWarning)  # says so when stamps are outliers
    _rank_names: RankNames = field(default_factory=RankNames)  # scraped ranks named as the log names them

    def __post_init__(self) -> None:
        if self.metrics is not None:
            self._info = ServerInfoClient(self.metrics.base_url, self.metrics.timeout,
                                          get=self.metrics.info_get or self.metrics.get, timer=self.timer)
        if self.server_overrides:
            self.state.set_server(args=self.server_overrides)

    @property
    def ready(self) -> bool:
        """True once the first evaluation ran."""
        return self.evaluations > 0

    def tick(self, now: float, mono: float | None = None) -> None:
        """One round: log, start the HTTP sources' jobs when due, apply the finished ones, expiry,
        evaluation. `now` is wall time (what data is stamped with); `mono` (default: `now`) is the
        monotonic clock that schedules: a wall clock stepped back stops nothing.

        Each source runs guarded: whatever it raises marks that source down (reason `internal`), is
        counted, and the other sources and the evaluation still run."""
        self._wall = now
        self._mono = mono = now if mono is None else mono
        if self.log_input is not None:
            self._guarded("log", now, self._read_log)
        if self.metrics is not None:
            m = self.metrics
            if mono >= self._next_info and self._idle("server_info"):
                self._next_info = mono + m.interval  # retry soon unless it works (then: later)
                self._start("server_info", self._fetch_info)
            # The first scrape waits for the first server info: ranks need the tp/pp/ep sizes.
            if mono >= self._next_scrape and self._idle("metrics") and (self._info_tried or self._idle("server_info")):
                self._next_scrape = mono + m.interval
                self._start("metrics", self._scrape_work(now))
            for outcome in self.jobs.take():
                self._finish(outcome, now)
            self._check_overdue(now)
        self.state.expire(now)
        if mono >= self._next_eval:
            self._next_eval = mono + self.evaluate_every_s
            self._evaluate(now)

    # --- the HTTP sources' jobs ---------------------------------------------------------------
    def _idle(self, source: str) -> bool:
        return not self.jobs.busy(source)

    def _start(self, source: str, work: Callable[[], Any]) -> None:
        self._started[source] = self._mono
        self._overdue.discard(source)
        self._fetched.discard(source)
        self.jobs.start(source, work)

    def _finish(self, outcome: Outcome, now: float) -> None:
        """Apply a finished job on the loop (a late one's answer is dropped: it was failed already)."""
        source = outcome.source
        started = self._started.pop(source, self._mono)
        if source in self._overdue:
            self._overdue.discard(source)
            return
        if source == "server_info":
            self._info_tried = True
        if outcome.error is not None:  # a bug or an input nobody foresaw: this source is down
            exc = outcome.error
            log.debug("source %s failed", source, exc_info=exc)
            self._record(source, ok=False, duration_s=self._mono - started, now=now, reason="internal",
                         detail=_internal(exc))
            return
        step = self._apply_server_info if source == "server_info" else self._apply_scrape
        self._guarded(source, now, functools.partial(step, outcome.value))

    def _check_overdue(self, now: float) -> None:
        """A job still in its request at twice the timeout (a getter without a deadline of its own) fails
        its source as a timeout now; its answer, if it ever comes, is dropped. Parsing a large answer
        is not late: the loop does not wait for it either."""
        assert self.metrics is not None
        limit = 2 * self.metrics.timeout
        for source, started in self._started.items():
            if (source not in self._overdue and source not in self._fetched and self._mono - started > limit
                    and self.jobs.busy(source)):
                self._overdue.add(source)
                if source == "server_info":
                    self._info_tried = True
                self._record(source, ok=False, duration_s=self._mono - started, now=now, reason="timeout",
                             detail=f"no answer within {durations.duration_text(limit)} (twice --sglang.scrape-timeout); still waiting")

    def _guarded(self, source: str, now: float, step: Callable[[float], None]) -> None:
        start = self.timer()
        try:
            step(now)
        except Exception as exc:  # a bug or an input nobody foresaw: this source is down, the rest go on
            log.debug("source %s failed", source, exc_info=True)
            self._record(source, ok=False, duration_s=self.timer() - start, now=now, detail=_internal(exc),
                         reason="internal")

    def _record(self, source: str, *, ok: bool, duration_s: float | None, now: float, detail: str = "",
                reason: str | None = None) -> None:
        """Record a source attempt (a failure counted under `reason`); log only when its health changes."""
        detail = redact_text(detail)  # an error may quote a URL with credentials
        before = self.state.source_up(source)
        self.state.record_source(source, ok=ok, duration_s=duration_s, now=now, detail=detail, reason=reason)
        if before is None and ok:
            log.info("source %s up%s", source, f" ({detail})" if detail else "")
        elif before is not False and not ok:
            log.warning("source %s down: %s", source, detail or "no data")
        elif before is False and ok:
            log.info("source %s recovered", source)

    # --- log ----------------------------------------------------------------------------------
    def _warn_outliers(self) -> None:
        a = self.advisor
        self._outliers.note(a.implausible_times() if a.implausible_times else 0,
                            a.implausible_example() if a.implausible_example else None, self._mono)

    def _read_log(self, now: float) -> None:
        assert self.log_input is not None
        src = self.log_input
        start = self.timer()
        try:
            lines = src.follower.poll()
        except Exception as exc:  # unreadable file, permissions...: report it, keep scraping
            reason = "permission_denied" if isinstance(exc, PermissionError) else "read_error"
            self._record("log", ok=False, duration_s=self.timer() - start, now=now,
                         detail=f"read failed: {exc}", reason=reason)
            return
        events = self._parse(src.reader, lines)
        self._note_replay(src, bool(lines), now)
        if lines:
            self._last_line_at = self._mono
        elif self._last_line_at is not None and self._mono - self._last_line_at >= src.idle_flush_s:
            # A multi-line record (traceback, OOM) is held until the next line; a crashed
            # server writes none, so close the record once the log has been quiet a while.
            flush = getattr(src.reader, "flush", None)
            if callable(flush):
                events.extend(flush())
            self._last_line_at = None
        kinds = Counter(e.kind for e in events)
        self.state.count_log_lines(len(lines), kinds, now)
        self.state.set_log_totals(unparsed=src.unparsed(), rotations=src.follower.rotations,
                                  truncations=src.follower.truncations, oversized=src.oversized(),
                                  unread_bytes=getattr(src.follower, "unread_bytes", 0),
                                  implausible=self.advisor.implausible_times() if self.advisor.implausible_times else 0)
        self._apply_config_events(events)
        self.state.add_events(events, now)
        if events:
            self._rank_names.note_events(events)
            self._observe(events, now)
            self._note_version_floor()
            self._warn_outliers()  # the log clock judged these lines' stamps while converting them
        exists = src.exists()
        problem = getattr(src.follower, "problem", None)  # (reason, detail): e.g. permission denied
        if getattr(src.follower, "eof", False):
            reason, gone = "closed", "input closed by its writer"
        elif isinstance(problem, tuple):
            reason, gone = problem
        else:
            reason, gone = "not_found", "log file not found (waiting for it)"
        self._record("log", ok=exists, duration_s=self.timer() - start, now=now, detail="" if exists else gone,
                     reason=None if exists else reason)

    def _note_replay(self, src: LogInput, got_lines: bool, now: float) -> None:
        """Track a `--from-start` replay: read to the end with nothing new -> judged at its end; a new
        line afterwards -> a live log again, for good."""
        if not src.replay:
            return
        if got_lines:
            self._replay_wall = now
            if self._replay_end is not None:
                src.replay = False  # the file grows: it is a live log now, aged by the wall clock
                self._replay_end = None
                self.state.set_replay_end(None)
        elif self._replay_wall is not None and self._replay_end is None:
            self._replay_end = self._log_now(self._replay_wall)
            self.state.set_replay_end(self._replay_end)

    @staticmethod
    def _parse(reader: EventFeed, lines: list[str]) -> list[Event]:
        events: list[Event] = []
        feed_lines = getattr(reader, "feed_lines", None)
        if feed_lines is not None and lines:
            # One call per poll (same events as line by line, a fraction of the per-line cost).
            try:
                events.extend(feed_lines(lines))
                return events
            except Exception as exc:  # a parser bug must not stop the sidecar
                log.warning("%d log lines not parsed: %s", len(lines), exc)
                return events
        for line in lines:
            try:
                events.extend(reader.feed(line))
            except Exception as exc:  # a parser bug must not stop the sidecar
                log.warning("log line not parsed: %s", exc)
        return events

    def _observe(self, events: list[Event], now: float) -> None:
        """Events -> observations (a Decode line's values as one Sample) -> live state and window."""
        adv = self.advisor
        window = adv.window
        if adv.to_samples is not None:
            items = adv.to_samples(events, now)
            self.state.add_observations(items, now)
            if window is not None:
                window.add_items(items)
            return
        if adv.to_observations is not None:
            obs = adv.to_observations(events, now)
            self.state.add_observations(obs, now)
            if window is not None:
                for o in obs:
                    window.add(o)

    def _note_version_floor(self) -> None:
        floor = self.advisor.version_floor() if self.advisor.version_floor is not None else None
        if floor is None or floor == self._floor_noted:
            return  # most ticks: nothing new
        self._floor_noted = floor
        cur = self.state.server_version()
        known = merge_version(cur, floor)  # a real release (version line, server info) is kept
        if known != cur:
            self.state.set_server(version=known)

    def _apply_config_events(self, events: Iterable[Event]) -> None:
        for e in events:
            if e.kind not in SERVER_EVENT_KINDS:
                continue  # Decode/Prefill lines: no copy of the server's args per line
            upd = server_update(e, self.state.server_state().args)  # diagnose's rule too
            if upd is None:
                continue
            if "args" in upd:
                args: dict[str, Any] = {}
                cut = 0
                for k, v in upd["args"].items():
                    if isinstance(v, (dict, list)):
                        continue  # nested values are no gauge or label
                    if isinstance(v, str):
                        v, was_cut = limits.clip_text(v)  # label values and page text: bounded
                        cut += was_cut
                    args[k] = v
                self.state.count_truncations("log", "string", cut)
                model = upd.get("model_name")
                self.state.set_server(args=args, model_name=limits.clip_text(model)[0] if model else None)
                if e.kind in ("server_args", "server_args_update") and self.changes is not None:
                    # a new startup section, or arguments changed without a restart (POST /set_internal_state)
                    t = plausible_seconds(e.time)
                    self.changes.note_args({**args, **self.server_overrides}, "log",
                                           t if t is not None else self._log_now(self._wall))
                if self.server_overrides:
                    self.state.set_server(args=self.server_overrides)
            if upd.get("version"):
                self.state.set_server(version=upd["version"])

    # --- SGLang HTTP --------------------------------------------------------------------------
    def _scrape_work(self, now: float) -> Callable[[], _Scraped]:
        """A scrape job, bound on the loop to the log time and the rank cap."""
        return functools.partial(self._scrape_job, self._log_now(now), self.state.max_ranks)

    def _scrape_job(self, at: float, max_ranks: int) -> _Scraped:
        """Off the loop: GET /metrics, parse it and turn it into observations at log time `at` (one
        scrape job at a time: the interpreter's counter baselines are this job's alone). Ranks past
        `max_ranks` in one scrape are dropped here: the state would evict them at once anyway, after
        seconds of work on the loop for an exposition naming thousands."""
        assert self.metrics is not None
        m = self.metrics
        start = self.timer()
        try:
            body = m.get(m.base_url.rstrip("/") + "/metrics", m.timeout)
        except HttpError as exc:
            return _Scraped(self.timer() - start, detail=str(exc), reason=exc.reason)
        self._fetched.add("metrics")  # a set's add is atomic: the loop reads it
        if len(body) > limits.MAX_METRICS_BODY_BYTES:  # an injected getter without the cap
            return _Scraped(self.timer() - start, reason="too_large",
                            detail=f"/metrics body larger than {limits.MAX_METRICS_BODY_BYTES} bytes")
        if body and not body.endswith(b"\n"):  # a close-delimited body has no length to check it by
            return _Scraped(self.timer() - start, reason="invalid",
                            detail="/metrics ends mid-line (no final newline): the answer was cut short")
        # No cyclic garbage comes of parsing, but the collector's full passes over the hundreds of
        # thousands of objects a large exposition makes took seconds, holding every thread (the loop
        # too): it is off until they are gone, and only what the loop needs is kept.
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._interpret(body, at, max_ranks, start)
        finally:
            if collecting:
                gc.enable()

    def _interpret(self, body: bytes, at: float, max_ranks: int, start: float) -> _Scraped:
        exposition = parse_exposition(body.decode("utf-8", errors="replace"), keep=wanted)
        result = self._interp.interpret(exposition, at)
        kept: set[Rank] = set()
        dropped: set[Rank] = set()
        observations: list[Observation] = []
        for o in scraped_pool_pairs(result.observations):  # hybrid pools read as the log's Decode lines
            if o.rank not in kept:
                if len(kept) >= max_ranks:
                    dropped.add(o.rank)
                    continue
                kept.add(o.rank)
            observations.append(o)
        cuts = (("line", exposition.long_lines), ("label_value", exposition.clipped_labels),
                ("samples", exposition.dropped_samples), ("ranks", len(dropped)))
        return _Scraped(self.timer() - start, dataclasses.replace(result, observations=tuple(observations)), cuts)

    def _apply_scrape(self, scraped: _Scraped, now: float) -> None:
        """On the loop: a scrape job's outcome into the state and the window."""
        result = scraped.result
        if result is None:
            self._record("metrics", ok=False, duration_s=scraped.duration_s, now=now, detail=scraped.detail,
                         reason=scraped.reason)
            return
        for limit, n in scraped.cuts:
            self.state.count_truncations("metrics", limit, n)
        self._rank_names.note_ranks(o.rank for o in result.observations)
        norm = self._rank_names.normaliser(self.state.server_state().args)
        # With a working log, counted events come from its lines: the scrape's counter deltas
        # would count the same retractions and batches twice.
        log_up = self.log_input is not None and bool(self.state.source_up("log"))
        normal: dict[Rank, Rank] = {}  # one scrape names each rank in many samples: normalise once

        def normalised(rank: Rank) -> Rank:
            n = normal.get(rank)
            if n is None:
                n = normal[rank] = norm(rank)
            return n

        observations = [o if (r := normalised(o.rank)) is o.rank or r == o.rank else Observation(o.time, o.name, o.value, r, o.source)
                        for o in result.observations if not (log_up and o.name in COUNTED)]
        self.state.add_observations(observations, now)
        if self.advisor.window is not None:
            for o in observations:
                self.advisor.window.add(o)
        self.state.record_scrape(garbage_lines=result.garbage_lines, samples=result.samples,
                                 model_name=result.model_name, restarted=result.restarted)
        ok = result.samples > 0
        self._record("metrics", ok=ok, duration_s=scraped.duration_s, now=now,
                     detail="" if ok else "no samples (is --enable-metrics set?)",
                     reason=None if ok else "invalid")
        if result.restarted:
            self._next_info = self._mono  # re-read args and version of the new process at once

    def _fetch_info(self) -> FetchResult:
        """Off the loop: the server-info request (never raises)."""
        assert self._info is not None
        return self._info.fetch()

    def _apply_server_info(self, res: FetchResult, now: float) -> None:
        assert self.metrics is not None
        if res.info is None:
            self._record("server_info", ok=False, duration_s=res.duration_s, now=now,
                         detail=res.error or "", reason=res.reason or "connection")
            self._next_info = self._mono + self.metrics.interval  # retry soon
            return
        info = res.info
        for limit, n in info.truncated.items():
            self.state.count_truncations("server_info", limit, n)
        restarted = ((self._start_marker is not None and info.start_marker != self._start_marker)
                     or (self._version is not None and info.version != self._version))
        if restarted:
            self.state.count_restart()
        self._start_marker, self._version = info.start_marker, info.version
        # The overrides first in order (the names kept when a document fills MAX_SERVER_ARGS), last in value.
        args = {**self.server_overrides, **info.args}
        if info.max_total_num_tokens is not None:
            args["max_total_num_tokens"] = info.max_total_num_tokens
        args.update(self.server_overrides)
        self.state.set_server(version=info.version, args=args, model_name=info.model_name, endpoint=res.endpoint,
                              source="server_info")
        if self.changes is not None:  # the server answering other values
            self.changes.note_args(args, "server_info", self._log_now(now))
        # Per DP rank, as fallbacks of the ranks' own (log) facts: no rank of their own.
        self.state.set_server_facts(info.rank_facts)
        if self.advisor.window is not None:
            self.advisor.window.set_server_facts(info.rank_facts)
        self._record("server_info", ok=True, duration_s=res.duration_s, now=now,
                                 detail=res.endpoint or "")
        self._next_info = self._mono + self.metrics.server_info_interval

    # --- guide ----------------------------------------------------------------------------------
    def _log_now(self, wall: float) -> float:
        if self._replay_end is not None:
            return self._replay_end  # a replay that ended is judged at its end, not aged by the wall clock
        return self.advisor.log_now(wall) if self.advisor.log_now is not None else wall

    def _evaluate(self, wall: float) -> None:
        adv = self.advisor
        now = self._log_now(wall)
        signals: Mapping[Rank, Mapping[str, float | None]] = {}
        findings: list[Finding] = []
        document: Callable[[], Mapping[str, Any]] | None = None
        server = self.state.server_state()
        try:
            if adv.window is not None:
                adv.window.prune(now)
                signals = adv.window.signals(now)
            if adv.evaluate is not None:
                findings = adv.evaluate(signals, server)
        except Exception:  # an advisor bug must not take /metrics down
            log.exception("evaluation failed")
        make_doc = adv.document
        if make_doc is not None:
            frozen = (list(findings), signals, server)

            def document() -> Mapping[str, Any]:
                return make_doc(frozen[0], frozen[1], frozen[2], now)

        self.state.set_evaluation(signals=signals, findings=findings, document=document, now=wall,
                                  exported=adv.exported_signals)
        if self.changes is not None:
            self.changes.observe(now, signals, findings)
        if self.on_evaluated is not None:
            try:
                self.on_evaluated()
            except Exception:
                log.exception("post-evaluation hook failed")
        self.evaluations += 1
