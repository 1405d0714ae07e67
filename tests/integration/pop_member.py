"""A PopConsumer process for tests/integration/test_pop.py: prints each message's body on a line
(flushed) before its listener answers CONSUME_SUCCESS, so the lines of a member killed -9 hold
everything it consumed, acked or not."""

from __future__ import annotations

import signal
import sys
import threading

from node.client.pop_consumer import CONSUME_SUCCESS, PopConsumer
from node.server.signals import StopSignals


def main() -> None:
    endpoint, group, topic = sys.argv[1:4]
    lock = threading.Lock()

    def listener(messages) -> str:
        with lock:
            sys.stdout.write("".join(m.body.decode() + "\n" for m in messages))
            sys.stdout.flush()
        return CONSUME_SUCCESS

    consumer = PopConsumer(endpoint, group, invisible_ms=3000, wait_ms=500, max_count=16, pops_in_flight=2)
    consumer.subscribe(topic)
    consumer.register_listener(listener)
    stops = StopSignals((signal.SIGTERM,))
    consumer.start()
    print("started", file=sys.stderr, flush=True)
    while not stops.wait(0.2):
        pass
    consumer.shutdown()


if __name__ == "__main__":
    main()
