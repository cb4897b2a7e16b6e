"""An asyncio event loop running in a daemon thread, one per name, for the asyncio client
libraries (asyncssh, labgrid's grpc) that the synchronous host code calls into from any thread."""

from __future__ import annotations

import asyncio
import threading

_loops: dict[str, asyncio.AbstractEventLoop] = {}
_lock = threading.Lock()


def background_loop(name: str) -> asyncio.AbstractEventLoop:
    """The loop called `name`, started on first use; it runs until the process exits."""
    with _lock:
        if name not in _loops:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name=f"edgebench-{name}", daemon=True).start()
            _loops[name] = loop
        return _loops[name]
