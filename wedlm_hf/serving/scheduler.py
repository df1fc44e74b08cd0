"""The one decoding loop that owns the model: continuous batching of every request's rows on one `StreamingDecoder`.

A background thread repeats: admit waiting rows (up to `max_batch_size` live rows, fairly across requests and
within the step's token budget, see `limits`; they join at the next step and their prompts are prefilled in that
step's forward, or over several steps when long), drop the rows of cancelled jobs (a client that went away),
`step()` once for the whole batch, and turn each changed row's new tokens into text events for its job. Handlers
on the asyncio side talk to it only through `submit` / `cancel` (thread-safe) and the job's `emit` callback (which
hands events to the event loop with `call_soon_threadsafe`).

Failures stay local: an exception while delivering one job's tokens fails that job alone; an exception inside
`step()` fails the jobs of that batch (their rows shared the forward) and the decoder is rebuilt, so the loop and
the requests that arrive later carry on.

Compiled decoding (`compile_config`, `wedlm-hf serve --compile`): the decoder runs on a `SlotCache` of
`max_batch_size` fixed slots (a joining row takes a free one; admission never has more live rows than slots), and
its decoding steps go through one `torch.compile`d model call, shared by every decoder the loop builds; prefill
steps run eagerly. Each row's tokens are the ones the eager loop commits.

Batch-invariant decoding (`batch_invariant`, `wedlm-hf serve --batch-invariant`): the loop thread runs inside
`batch_invariant()`, so a row's logits, and with them its answer, do not depend on the rows that share its steps, on
how its prompt was split into chunks, or on whether its prefix came from the prefix cache.
"""

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..modeling.batch_invariant import batch_invariant as batch_invariance
from ..modeling.decoding_state import DecodingRow, DecodingSettings
from ..modeling.ragged_cache import RaggedCache
from ..modeling.slot_cache import SlotCache, static_decoding_refusal
from ..modeling.streaming_decoder import StreamingDecoder
from .contained_grammar import ContainedGrammar
from .incremental_text import IncrementalText
from .limits import ServingLimits
from .log_probabilities import token_log_probabilities
from .prefix_cache import PrefixCache
from .tensor_parallel import MirroredCache

DEFAULT_PREFIX_CACHE_TOKENS = 16384  # `--prefix-cache-tokens`: prompt and answer tokens whose K/V are kept


@dataclass
class Delta:
    """New text of one choice, `tokens` tokens settled by that row's `forward`-th forward (committed, or certain to
    commit in the next: `DecodingRow.settled`). `logprobs` (when the request asked; then only committed tokens):
    per new token (token id, log-probability, [(id, log-probability)] of the k most likely)."""

    choice: int
    text: str
    forward: int
    tokens: int
    logprobs: list | None = None


@dataclass
class Finish:
    """A choice ended; `reason` is OpenAI's finish_reason ("stop" or "length"). `accepted_drafts` (None outside
    lossless mode): the row's drafts accepted by verification, `accepted_context_drafts` of them from the context."""

    choice: int
    reason: str
    prompt_tokens: int
    completion_tokens: int
    forwards: int
    accepted_drafts: int | None = None
    accepted_context_drafts: int = 0
    cached_tokens: int = 0  # prompt tokens whose K/V came from the prefix cache


@dataclass
class Failure:
    """The whole job failed; no more events follow. `param` / `code`: what the error body names, if anything."""

    status: int
    message: str
    param: str | None = None
    code: str | None = None


@dataclass(eq=False)
class Choice:
    """One row of a job: its prompt, settings, text state and (once admitted) its decoder row."""

    index: int
    prompt: list[int]
    settings: DecodingSettings
    text: IncrementalText
    row: DecodingRow | None = None
    sent: int = 0  # committed tokens already turned into events
    finished: bool = False
    logprobs: int | None = None  # None: no log-probabilities; k: each token's and its k most likely alternatives
    cached_tokens: int = 0  # prompt tokens found in the prefix cache when the row joined
    prompt_stored: bool = False  # its prompt's K/V went into the prefix cache
    grammar: object | None = None  # the compiled schema or tools' grammar its text follows (a state per row)
    grammar_param: str = "response_format"  # the request field the grammar came from, as its client named it
    cache_salt: object = None  # prefix-cache blocks are shared only between choices with equal salts


@dataclass(eq=False)
class Job:
    """A request: its choices and where its events go. `emit` must be safe to call from the loop thread."""

    choices: list[Choice]
    emit: Callable[[object], None]
    cancelled: bool = False
    ended: bool = False
    submitted: float = field(default_factory=time.monotonic)
    live: int = 0  # rows in the batch now

    def waiting(self) -> bool:
        return any(c.row is None and not c.finished for c in self.choices)

    def unadmitted(self) -> int:
        return sum(c.row is None and not c.finished for c in self.choices)


class QueueFull(Exception):
    pass


class ShuttingDown(Exception):
    pass


def serving_limits(limits: ServingLimits | None = None, **kwargs) -> ServingLimits:
    """`limits`, or limits made from keyword overrides (a small `max_queue` also bounds rows per request)."""
    if limits is not None:
        if kwargs:
            raise ValueError("Give either limits or keyword limits, not both.")
        return limits
    if "max_queue" in kwargs and "max_request_rows" not in kwargs:
        kwargs["max_request_rows"] = min(ServingLimits.max_request_rows, kwargs["max_queue"])
    return ServingLimits(**kwargs)


def slot_length(model) -> int:
    """Tokens one fixed slot must hold: the model's context (a feed's padding goes to the slot's sink column, so a
    row needs room for its own tokens only, even beside a long prompt's prefill)."""
    text = model.config.get_text_config()
    context = getattr(text, "max_position_embeddings", None)
    if not context:
        raise ValueError(
            "--compile sizes its fixed slots from the model's max_position_embeddings, which this model's config "
            "does not set: set it in config.json or serve without --compile."
        )
    reason = static_decoding_refusal(model)
    if reason is not None:
        raise ValueError(f"--compile decodes on fixed slots, and {reason}, or serve without --compile.")
    return context


class Scheduler:
    """The decoding loop; `compile_config` (a transformers `CompileConfig`, None: eager) turns on compiled
    decoding on fixed slots, `batch_invariant` batch-invariant decoding (see the module docstring)."""

    def __init__(
        self,
        model,
        mask_token_id: int,
        limits: ServingLimits | None = None,
        compile_config=None,
        prefix_cache_tokens: int = DEFAULT_PREFIX_CACHE_TOKENS,
        ranks=None,
        batch_invariant: bool = False,
        **kwargs,
    ):
        if ranks is not None and compile_config is not None:
            raise ValueError(
                "Compiled decoding is not available under tensor parallelism yet: serve without --compile."
            )
        if batch_invariant and (compile_config is not None or ranks is not None):
            given = "--compile" if compile_config is not None else "--tensor-parallel-size"
            raise ValueError(f"--batch-invariant does not cover {given} yet: leave one of them out.")
        self.batch_invariant = batch_invariant
        self.ranks = ranks  # `tensor_parallel.RankChannel`: every cache call also runs on the other ranks
        self.limits = serving_limits(limits, **kwargs)
        self.prefix_cache = PrefixCache(prefix_cache_tokens)
        self.model = model
        self.mask_token_id = mask_token_id
        self.vocab_size = model.config.get_text_config().vocab_size
        self.max_batch_size = self.limits.max_batch_size
        self.max_queue = self.limits.max_queue  # rows, of all requests together
        self.compiled = None  # the compiled model call of decoding steps, None when decoding is eager
        self.slot_length = 0  # tokens each fixed slot holds (compiled decoding only)
        if compile_config is not None:
            self.slot_length = slot_length(model)
            self.compiled = model.get_compiled_call(compile_config)
        self.decoder = self._new_decoder()
        self.counters = {"steps": 0, "completed": 0, "cancelled": 0, "failed": 0, "step_failures": 0}
        self._lock = threading.Condition()
        self._waiting: deque[Job] = deque()  # jobs with rows not yet admitted, in arrival order
        self._queued_rows = 0  # their rows not yet admitted
        self._jobs: set[Job] = set()  # every job not ended
        self._live: dict[DecodingRow, tuple[Job, Choice]] = {}
        self._closing_at: float | None = None  # shutdown: rows still live at this time are cancelled
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="wedlm-decoding-loop", daemon=True)

    # ---- asyncio side (any thread) -------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        with self._lock:
            if self._closing_at is not None or self._stop:
                raise ShuttingDown()
            rows = job.unadmitted()
            if self._queued_rows + rows > self.max_queue:
                raise QueueFull()
            self._queued_rows += rows
            self._waiting.append(job)
            self._jobs.add(job)
            self._lock.notify()

    def cancel(self, job: Job) -> None:
        """The client went away: the job's rows are dropped before the next step (no-op once it ended)."""
        if not job.ended:
            job.cancelled = True
            with self._lock:
                self._lock.notify()

    def begin_shutdown(self, grace: float) -> None:
        """No new jobs; jobs not started yet fail now (503); live rows get `grace` seconds to finish."""
        with self._lock:
            deadline = time.monotonic() + grace
            self._closing_at = deadline if self._closing_at is None else min(self._closing_at, deadline)
            self._lock.notify()

    def stop(self, timeout: float = 30.0) -> None:
        """Ends the loop thread; any job still open fails with 503."""
        self.begin_shutdown(0.0)
        with self._lock:
            self._stop = True
            self._lock.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "live_rows": len(self._live),
                "waiting_requests": len(self._waiting),
                "waiting_rows": self._queued_rows,
                "open_requests": len(self._jobs),
                "batch_invariant": self.batch_invariant,
                **self.counters,
                "prefix_cache": self.prefix_cache.stats(),
            }

    # ---- the loop thread -----------------------------------------------------------------------------------

    def _run(self) -> None:
        invariance = batch_invariance() if self.batch_invariant else contextlib.nullcontext()
        with invariance, torch.no_grad():
            while True:
                with self._lock:
                    while not (self._stop or self._waiting or self._live or self._closing_at is not None):
                        self._lock.wait()
                    if self._closing_at is not None:
                        self._fail_unstarted_locked()
                    if self._stop and not self._live:
                        break
                    self._admit_locked()
                self._drop_cancelled()
                self._cancel_after_grace()
                if self._live:
                    self._step()
                elif self._closing_at is not None and not self._stop:
                    with self._lock:  # idle while shutting down: wait for `stop()`
                        if not self._live and not self._waiting and not self._stop:
                            self._lock.wait(0.1)
        for job in list(self._jobs):
            self._fail(job, 503, "The server shut down before the request finished.")

    def _new_decoder(self) -> StreamingDecoder:
        cache = None
        if self.compiled is not None:  # a decoder's rows own its slots: a new decoder gets fresh ones
            cache = SlotCache(self.model, self.max_batch_size, self.slot_length, compiled=self.compiled)
        if self.ranks is not None:
            cache = MirroredCache(RaggedCache(self.model, 0, max_dead=16), self.ranks)
        return StreamingDecoder(
            self.model,
            self.mask_token_id,
            keep_cache=self.prefix_cache.enabled,  # a finished row's K/V go into the prefix cache
            cache=cache,
            token_budget=self.limits.max_step_tokens,
        )

    def _admit_locked(self) -> None:
        """Admits one row at a time from the waiting request with the fewest live rows (the earliest on ties), up
        to the batch size, a request's share of it, and the step's token budget."""
        share = self.limits.request_share
        widest = max((choice.settings.window_size for _, choice in self._live.values()), default=0)
        while len(self._live) < self.max_batch_size:
            candidates = [job for job in self._waiting if not job.cancelled and job.live < share]
            if not candidates:
                return
            job = min(candidates, key=lambda j: j.live)  # min keeps the first of equals: arrival order
            choice = next(c for c in job.choices if c.row is None and not c.finished)
            window = max(widest, choice.settings.window_size)
            if self._live and self.limits.step_cost(len(self._live) + 1, window) > self.limits.max_step_tokens:
                return
            widest = window
            prefix, choice.cached_tokens = self.prefix_cache.lookup(choice.prompt, choice.cache_salt)
            state = None if choice.grammar is None else ContainedGrammar(choice.grammar.matcher(), self.vocab_size)
            choice.row = self.decoder.add(choice.prompt, choice.settings, prefix=prefix, grammar=state)
            self._live[choice.row] = (job, choice)
            job.live += 1
            self._queued_rows -= 1
            if not job.waiting():
                self._waiting.remove(job)

    def _unqueue_locked(self, job: Job) -> None:
        if job in self._waiting:
            self._waiting.remove(job)
            self._queued_rows -= job.unadmitted()

    def _fail_unstarted_locked(self) -> None:
        for job in list(self._waiting):
            if all(c.row is None for c in job.choices):
                self._unqueue_locked(job)
                self._fail(job, 503, "The server is shutting down; the request was not started. Retry later.")

    def _drop_cancelled(self) -> None:
        with self._lock:  # `submit` adds jobs from the event loop's thread
            cancelled = [job for job in self._jobs if job.cancelled]
        for job in cancelled:
            self._end(job, "cancelled")

    def _cancel_after_grace(self) -> None:
        if self._closing_at is not None and time.monotonic() >= self._closing_at:
            for job in {job for job, _ in self._live.values()}:
                self._fail(job, 503, "The server shut down before the request finished.")

    def _step(self) -> None:
        failure = None
        try:
            changed = self.decoder.step()
            self._store_prompts()  # under tensor parallelism a collective too: its failure fails the batch
        except Exception as exc:  # the whole batch shared this forward: fail its jobs, start a fresh decoder
            failure = f"Decoding failed for the batch this request was in ({type(exc).__name__}: {exc})."
            self.decoder = None
        if failure is not None:  # outside the except: its traceback no longer holds the old decoder's cache
            self.counters["step_failures"] += 1
            jobs = {job for job, _ in self._live.values()}
            self._live.clear()
            self.decoder = self._new_decoder()
            for job in jobs:
                self._fail(job, 500, failure)
            return
        self.counters["steps"] += 1
        self._fail_broken_grammars()
        changed = set(changed)
        for row, (job, choice) in list(self._live.items()):
            if row in changed or (choice.logprobs is None and len(row.generated) + len(row.settled()) > choice.sent):
                try:
                    self._deliver(job, choice)
                except Exception as exc:
                    self._fail(
                        job, 500, f"The request failed while its tokens were delivered ({type(exc).__name__}: {exc})."
                    )

    def _fail_broken_grammars(self) -> None:
        """Ends the requests whose grammar failed in this step (`ContainedGrammar`): theirs alone, with a 400."""
        for row, (job, choice) in list(self._live.items()):
            error = getattr(row.grammar, "error", None)
            if error is not None and not job.ended:
                param = choice.grammar_param
                self._fail(
                    job,
                    400,
                    f"The grammar of {param} failed while decoding this request ({error}); simplify the schema "
                    "(a property whose schema contains itself, or very long forced text, exhausts the grammar "
                    "library's limits).",
                    param=param,
                    code="grammar_failed",
                )

    def _store_prompts(self) -> None:
        """Puts the K/V of prompts prefilled by this step into the prefix cache, so that requests arriving while
        these rows still decode share them (a finished row adds its answer)."""
        if not self.prefix_cache.enabled:
            return
        block = self.prefix_cache.block
        for row, (_, choice) in self._live.items():
            if choice.prompt_stored or not row.prefilled:
                continue
            choice.prompt_stored = True
            if len(row.prompt) // block * block > choice.cached_tokens and not row.done:
                kv = self.decoder.row_cache(row, len(row.prompt))
                self.prefix_cache.insert(row.prompt, kv, choice.cache_salt)

    def _logprobs(self, row: DecodingRow, start: int, top: int) -> list:
        """(token, log-probability, top alternatives) of the row's tokens from `start` on, from the model's AR
        logits at each position (`log_probabilities`); the logits are dropped once delivered."""
        raw = row.logits[start:]
        if not raw:
            return []
        row.logits[start:] = [None] * len(raw)
        tokens = row.generated[start : start + len(raw)]
        return token_log_probabilities(torch.stack(raw), tokens, self.mask_token_id, top)

    def _deliver(self, job: Job, choice: Choice) -> None:
        row = choice.row
        # Tokens the next step commits whatever happens are streamed now (not with log-probabilities: those of the
        # tokens after the first come from the committing forward). Only the tokens after those sent are copied.
        settled = row.settled() if choice.logprobs is None else []
        committed = len(row.generated)
        total = committed + len(settled)
        text = choice.text.add(row.generated[choice.sent :] + settled[max(0, choice.sent - committed) :])
        if choice.text.stopped:  # the choice ends with the token that completes the stop string
            total = min(total, choice.text.stop_tokens)
            if committed >= choice.text.stop_tokens:
                self.decoder.finish(row, keep=choice.text.stop_tokens, reason="stop")
        new_tokens = max(0, total - choice.sent)
        logprobs = None if choice.logprobs is None else self._logprobs(row, choice.sent, choice.logprobs)
        choice.sent = max(choice.sent, total)
        if row.done:
            text += choice.text.flush()
        if new_tokens or text:
            job.emit(Delta(choice.index, text, row.stats.forwards, new_tokens, logprobs))
        if row.done:
            self._live.pop(row, None)
            job.live -= 1
            choice.finished = True
            reason = "stop" if choice.text.stopped or row.finish_reason == "stop" else "length"
            stats, lossless = row.stats, choice.settings.lossless
            if row.kv is not None:  # its prompt and answer, for the requests (and chat turns) that start the same
                self.prefix_cache.insert(row.prompt + row.generated, row.kv, choice.cache_salt)
                row.kv = None
            job.emit(
                Finish(
                    choice.index,
                    reason,
                    len(row.prompt),
                    len(row.generated),
                    stats.forwards,
                    stats.accepted_drafts if lossless else None,
                    stats.accepted_context_drafts,
                    choice.cached_tokens,
                )
            )
            if all(c.finished for c in job.choices):
                job.ended = True
                self._jobs.discard(job)
                self.counters["completed"] += 1

    def _end(self, job: Job, reason: str) -> None:
        """Drops every row of `job` from the decoder and forgets the job."""
        with self._lock:
            self._unqueue_locked(job)
        for choice in job.choices:
            if choice.row is not None and choice.row in self._live:
                del self._live[choice.row]
                try:
                    self.decoder.finish(choice.row, reason=reason)
                except Exception:  # a broken row must not take the loop down; a step failure rebuilds if needed
                    pass
                choice.row.kv = None
            choice.finished = True
        job.ended = True
        job.live = 0
        self._jobs.discard(job)
        self.counters["cancelled" if reason == "cancelled" else "failed"] += 1

    def _fail(self, job: Job, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        if job.ended:
            return
        self._end(job, "error")
        try:
            job.emit(Failure(status, message, param, code))
        except Exception:
            pass
