"""Tensor-parallel serving: one server over N ranks of torch.distributed, the model split by transformers' `tp_plan`.

Every rank loads the model with `DistributedConfig(tp_plan="auto")`, so each holds a slice of every layer's heads
and columns and a forward is a collective: all ranks must run it, on the same inputs, in the same order. Rank 0
serves HTTP, schedules, and makes every decoding choice; the others only follow. Its decoder talks to its KV cache
through `DecodingCache`, whose calls carry host data or tensors the decoder built and never read a tensor back; so
`MirroredCache` sends each call to the other ranks, which apply it to their own cache (their slice of the heads)
and run the same forwards. Calls without a collective (rows joining and leaving, columns kept) are queued and go
with the next forward, so a step costs one broadcast (vLLM's driver worker sends its plan the same way). Logits come
out whole on every rank (the plan gathers the head's output); only rank 0's are read. The prefix cache lives on
rank 0 with whole heads: a row's K/V is gathered there when it is stored, and each rank's heads are scattered back
when a prompt reuses it.

`wedlm-hf serve --tensor-parallel-size N` starts N ranks on this machine with torchrun's launcher (gloo on CPUs,
NCCL on GPUs); on several machines each runs `torchrun ... -m wedlm_hf.cli serve --tensor-parallel-size N`. A
rank that dies ends the server (the launcher stops the others; rank 0 stops at the first failed collective);
SIGTERM and SIGINT drain on rank 0 while the others keep following until it says stop.
"""

import datetime
import os
import signal
import sys
import threading
import time
import uuid

import torch
import torch.distributed as dist

from ..modeling.ragged_cache import RaggedCache
from .log_probabilities import prompt_logits

# How long a follower waits for rank 0's next message: an idle server sends none, so the wait is long. Messages go
# over gloo (CPU sockets), so an idle follower does not spin on a GPU, and a rank that dies closes its sockets, which
# ends a wait at once. NCCL's own collectives (the forwards, on GPUs) keep torch's default timeout.
IDLE_WAIT = datetime.timedelta(days=365)
PARENT_POLL = 1.0  # seconds between a rank's checks that its launcher is still alive
RANK_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


class RanksLost(RuntimeError):
    """A collective failed: a rank is gone, and the ranks can no longer be trusted to run the same forwards."""


def launched_world() -> int | None:
    """The world size when this process is a rank started by torchrun (or its launcher), else None."""
    return int(os.environ["WORLD_SIZE"]) if all(name in os.environ for name in RANK_ENV) else None


def launch(size: int, argv: list[str], drain: float, device: str | None = None) -> int:
    """Runs `wedlm-hf <argv>` as `size` ranks on this machine with torchrun's launcher; returns the exit status.
    A rank that fails stops the others (no restarts), and the failure is one line, not the launcher's report.
    `drain`: the seconds the ranks may take to stop after a signal before the launcher kills them. On `device`
    cpu the ranks see no GPU (transformers would place a split model on one)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=size,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",  # torchrun --standalone: a free port on this machine
        max_restarts=0,
        monitor_interval=0.5,
        shutdown_timeout=int(drain) + 60,  # --shutdown-timeout, uvicorn's own 5 s, the loop's stop
    )
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // size)))
    if device is not None and torch.device(device).type == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        elastic_launch(config, sys.executable)("-m", "wedlm_hf.cli", *argv)
    except ChildFailedError as failed:
        # the rank that failed first, not one that the failure stopped (SIGTERM: rank 0 stops itself, the launcher
        # the rest)
        rank, failure = min(
            failed.failures.items(), key=lambda item: (item[1].exitcode == -signal.SIGTERM, item[1].timestamp)
        )
        print(
            f"wedlm-hf serve: rank {rank} of {size} ended with exit code {failure.exitcode}; the server stopped "
            "(see the ranks' output above).",
            file=sys.stderr,
        )
        return 1
    except SignalException as signalled:  # the ranks got the signal too and have drained
        return 128 + int(signalled.sigval)
    return 0


def check_devices(size: int, device: str | None) -> None:
    """Refuses, before any rank starts, a --device the ranks cannot each have one of."""
    if device is None or torch.device(device).type == "cpu":
        return
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        raise ValueError(f"--device {device}: --tensor-parallel-size runs on CUDA GPUs (one per rank) or on cpu.")
    if torch.device(device).index is not None:
        raise ValueError(f"--device {device}: each rank takes the GPU of its local rank; give --device cuda.")
    if torch.cuda.device_count() < size:
        raise ValueError(
            f"--tensor-parallel-size {size} needs {size} GPUs on this machine, and {torch.cuda.device_count()} are "
            "visible: lower it, or start ranks on several machines with torchrun (docs/serving.md)."
        )


def init_ranks(device: str | None) -> torch.device:
    """Joins the process group (NCCL on GPUs, gloo on CPUs) and returns this rank's device; the rank exits if its
    launcher dies (a second Ctrl+C, a kill), so that no rank is left serving or waiting alone."""
    cuda = torch.cuda.is_available() and (device is None or device.startswith("cuda"))
    here = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(here)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", timeout=None if cuda else IDLE_WAIT)
    parent = os.getppid()
    threading.Thread(target=_exit_with_parent, args=(parent,), name="wedlm-launcher-watch", daemon=True).start()
    return here


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL)
    print("wedlm-hf serve: the launcher is gone; this rank stops.", file=sys.stderr, flush=True)
    os._exit(1)


class RankChannel:
    """Rank 0's messages to the other ranks: each message is a list of calls, broadcast in one collective. Rank 0
    holds `lock` from sending a call until it ran it, so that calls (and their collectives) reach every rank in the
    order rank 0 ran them, whichever thread made them."""

    def __init__(self):
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.lock = threading.RLock()
        self.lost: str | None = None  # why the ranks no longer run together
        self.serving = False  # rank 0's server is up: losing the ranks then stops it with a signal
        self._queued: list = []
        gloo = dist.get_backend() == "gloo"
        self._group = None if gloo else dist.new_group(backend="gloo", timeout=IDLE_WAIT)

    def queue(self, *call) -> None:
        """A call without a collective: it goes with the next `send`."""
        self._queued.append(_to_host(call))

    def send(self, *call) -> None:
        """Broadcasts the queued calls and this one (hold `lock`)."""
        if self.lost is not None:
            raise RanksLost(self.lost)
        message, self._queued = [*self._queued, _to_host(call)], []
        try:
            dist.broadcast_object_list([message], src=0, group=self._group)
        except Exception as exc:
            raise self.fail(exc) from exc

    def fail(self, exc: BaseException) -> RanksLost:
        """Records that the ranks lost each other, tells rank 0's server to stop, and returns the error to raise."""
        if self.lost is None:
            self.lost = "The tensor-parallel ranks lost contact; the server is stopping."
            print(f"wedlm-hf serve: {self.lost} ({type(exc).__name__}: {exc})", file=sys.stderr, flush=True)
            if self.serving:
                os.kill(os.getpid(), signal.SIGTERM)  # uvicorn drains: open requests end with an error
        return RanksLost(self.lost)

    def receive(self) -> list:
        box = [None]
        dist.broadcast_object_list(box, src=0, group=self._group)
        return box[0]

    def close(self) -> None:
        """Tells the other ranks to stop following (rank 0, once its decoding loop stopped); once only."""
        with self.lock:
            if self.lost is None:
                try:
                    self.send("stop")
                except RanksLost:
                    pass
                self.lost = "The server stopped."


class MirroredCache:
    """Rank 0's `DecodingCache`: each call runs here and on every other rank's own cache (module docstring)."""

    def __init__(self, cache, channel: RankChannel):
        self.__dict__.update(_cache=cache, _channel=channel)
        with channel.lock:
            channel.queue("new_cache")

    def __getattr__(self, name):
        return getattr(self._cache, name)

    def __setattr__(self, name, value):
        with self._channel.lock:
            setattr(self._cache, name, value)
            self._channel.queue("set", name, value)

    def _queued(self, method: str, *args):
        """A call without a collective, run here first and sent only if it succeeded: one that fails leaves this
        cache to be replaced (the scheduler starts a fresh decoder), and the others never run it."""
        with self._channel.lock:
            result = getattr(self._cache, method)(*args)
            self._channel.queue("call", method, *args)
            return result

    def add_rows(self, count):
        return self._queued("add_rows", count)

    def keep_leading(self, fed, keep):
        return self._queued("keep_leading", fed, keep)

    def select_rows(self, rows):
        return self._queued("select_rows", rows)

    def compact_if_needed(self):
        return self._queued("compact_if_needed")

    def load_prefixes(self, prefixes):
        """Each rank loads its heads of the whole-head K/V rank 0's prefix cache holds (see `row_kv`)."""
        with self._channel.lock:
            stacked = {b: _stacked(kv) for b, kv in prefixes.items()}
            self._channel.send("load_prefixes", {b: whole.shape for b, whole in stacked.items()})
            try:
                mine = {b: _scatter_heads(whole, whole.shape, self._channel) for b, whole in stacked.items()}
            except Exception as exc:
                raise self._channel.fail(exc) from exc
            return self._cache.load_prefixes(mine)

    def row_kv(self, row):
        """A row's K/V with every rank's heads, gathered on rank 0: its prefix cache holds whole heads, as one
        process's does, and `load_prefixes` hands each rank its share back."""
        with self._channel.lock:
            self._channel.send("row_kv", row)
            try:
                return _gather_heads(self._cache.row_kv(row), self._channel)
            except Exception as exc:
                raise self._channel.fail(exc) from exc

    def forward(self, *args):
        with self._channel.lock:
            self._channel.send("call", "forward", *args)
            try:
                return self._cache.forward(*args)
            except Exception as exc:  # the other ranks may wait in a collective this rank never reaches
                raise self._channel.fail(exc) from exc


def mirrored_prompt_logits(model, channel: RankChannel | None, prompt: list[int], rows: int, take) -> None:
    """Calls `take(start, logits)` for each chunk of `log_probabilities.prompt_logits` of `prompt`, run on every
    rank when there are several. Each chunk's head is a collective, so every chunk runs even when `take` raises (its
    error is raised after the last), and the lock is held in this one call, never across a caller's code."""
    if channel is None:
        for start, logits in prompt_logits(model, prompt, rows):
            take(start, logits)
        return
    failed = None
    with channel.lock:
        channel.send("prompt_logits", prompt, rows)
        try:
            for start, logits in prompt_logits(model, prompt, rows):
                if failed is None:
                    try:
                        take(start, logits)
                    except Exception as exc:
                        failed = exc
        except Exception as exc:
            raise channel.fail(exc) from exc
    if failed is not None:
        raise failed


def follow(model, channel: RankChannel) -> None:
    """The other ranks' loop: applies rank 0's calls to this rank's model and cache until it says stop. Signals are
    ignored: rank 0 drains on them and then says stop, and a rank 0 that died ends the wait with an error."""
    for sig in (signal.SIGINT, signal.SIGTERM):  # a launcher that dies ends this rank anyway (`init_ranks`)
        signal.signal(sig, signal.SIG_IGN)
    cache = None
    with torch.no_grad():
        while True:
            for call in channel.receive():
                call = _to_device(call, model.device)
                kind, args = call[0], call[1:]
                if kind == "stop":
                    return
                if kind == "new_cache":
                    cache = RaggedCache(model, 0, max_dead=16)
                elif kind == "set":
                    setattr(cache, *args)
                elif kind == "call":
                    getattr(cache, args[0])(*args[1:])
                elif kind == "row_kv":
                    _gather_heads(cache.row_kv(*args), channel)
                elif kind == "load_prefixes":
                    (shapes,) = args
                    cache.load_prefixes({b: _scatter_heads(None, shape, channel, model) for b, shape in shapes.items()})
                elif kind == "prompt_logits":
                    for _ in prompt_logits(model, *args):
                        pass
                else:
                    raise RuntimeError(f"rank {channel.rank}: unknown call {kind!r} from rank 0")


def _stacked(kv: list) -> torch.Tensor:
    """Per-layer (K, V), each (heads, tokens, dim), as one (layers, 2, heads, tokens, dim) tensor."""
    return torch.stack([torch.stack([k, v]) for k, v in kv])


def _gather_heads(kv: list, channel: RankChannel) -> list | None:
    """Every rank's heads of a row's K/V, in rank order, on rank 0 (None elsewhere)."""
    mine = _stacked(kv).contiguous()
    if channel.rank != 0:
        dist.gather(mine, None, dst=0)
        return None
    parts = [torch.empty_like(mine) for _ in range(channel.size)]
    dist.gather(mine, parts, dst=0)
    whole = torch.cat(parts, dim=2)
    return [(layer[0], layer[1]) for layer in whole]


def _scatter_heads(whole: torch.Tensor | None, shape, channel: RankChannel, model=None) -> list:
    """This rank's share (in rank order) of whole-head K/V stacked as `_stacked` stacks them, sent by rank 0."""
    layers, two, heads, tokens, dim = shape
    if channel.rank == 0:
        parts = [part.contiguous() for part in whole.chunk(channel.size, dim=2)]
        mine = torch.empty_like(parts[0])
    else:
        parts = None
        mine = torch.empty((layers, two, heads // channel.size, tokens, dim), dtype=model.dtype, device=model.device)
    dist.scatter(mine, parts, src=0)
    return [(layer[0], layer[1]) for layer in mine]


def _to_host(value):
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(_to_host(v) for v in value)
    return value


def _to_device(value, device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to_device(v, device) for v in value)
    return value
