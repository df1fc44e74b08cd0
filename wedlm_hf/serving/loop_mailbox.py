"""Events from the decoding thread to an event loop's queues, with one wake-up of the loop for many events.

A step delivers to every live row's request, each through the asyncio queue its route reads. Handing each event to
the loop on its own (`call_soon_threadsafe`) wakes the loop once an event, a write to its self-pipe from the
decoding thread each time, while the device waits for the next step. A mailbox keeps the events posted since the
loop last emptied it and wakes the loop only for the first: one wake-up for the events of a step, each queue's in
the order they were posted.
"""

import threading
import weakref


class LoopMailbox:
    """Events posted from any thread, put into their asyncio queues on `loop`, in order."""

    def __init__(self, loop):
        self.loop = loop
        self._lock = threading.Lock()
        self._pending: list = []

    def post(self, queue, event) -> None:
        with self._lock:
            self._pending.append((queue, event))
            first = len(self._pending) == 1
        if first:  # later posts ride on this wake-up until the loop empties the box
            self.loop.call_soon_threadsafe(self._empty)

    def _empty(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for queue, event in pending:
            queue.put_nowait(event)


_MAILBOXES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_MAILBOXES_LOCK = threading.Lock()


def mailbox_for(loop) -> LoopMailbox:
    """The one mailbox of an event loop."""
    with _MAILBOXES_LOCK:
        box = _MAILBOXES.get(loop)
        if box is None:
            box = _MAILBOXES[loop] = LoopMailbox(loop)
        return box
