"""`loop_mailbox`: the decoding thread's events reach each request's queue in order, with one wake-up of the event
loop for the events posted before it runs, not one an event."""

import asyncio
import threading

from wedlm_hf.serving.loop_mailbox import LoopMailbox, mailbox_for


def test_events_posted_before_the_loop_runs_take_one_wake_up():
    async def main():
        loop = asyncio.get_running_loop()
        wake_ups = []
        real = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *args: wake_ups.append(1) or real(*args)
        queues = [asyncio.Queue() for _ in range(8)]
        box = LoopMailbox(loop)
        for step in range(5):  # a step delivers to every row's request, the loop busy meanwhile
            for queue in queues:
                box.post(queue, step)
        assert [[await queue.get() for _ in range(5)] for queue in queues] == [list(range(5))] * 8
        assert len(wake_ups) == 1
        box.post(queues[0], "next")  # the box emptied: the next post wakes the loop again
        assert await queues[0].get() == "next" and len(wake_ups) == 2

    asyncio.run(main())


def test_events_from_the_decoding_thread_arrive_in_order():
    async def main():
        loop = asyncio.get_running_loop()
        assert mailbox_for(loop) is mailbox_for(loop)
        queues = [asyncio.Queue() for _ in range(8)]

        def decoding_thread():
            for step in range(50):
                for queue in queues:
                    mailbox_for(loop).post(queue, step)

        thread = threading.Thread(target=decoding_thread)
        thread.start()
        received = [[await queue.get() for _ in range(50)] for queue in queues]
        thread.join()
        assert received == [list(range(50))] * 8 and all(queue.empty() for queue in queues)

    asyncio.run(main())
