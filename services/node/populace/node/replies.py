"""A node's memory of the replies it gave, by request id: a request re-sent after a timeout
(the same `request_id`) is answered with the first reply and does nothing again. A repeat that
arrives while the first is still being handled waits for that first reply. The same id on a
different request is refused. Only the last `size` ids are kept (in memory: a restarted node
has no children from before anyway)."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable

REMEMBERED = 512


class ReusedRequestId(ValueError):
    """A request id already seen on a different request."""


class Replies:
    def __init__(self, size: int = REMEMBERED) -> None:
        self.size = size
        self._seen: OrderedDict[str, tuple[str, asyncio.Future[bytes]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    async def once(self, request_id: str | None, body: str, answer: Callable[[], Awaitable[bytes]]
                   ) -> tuple[bytes, bool]:
        """(the reply, whether it is a repeat): `answer()` runs once per request id; without an
        id, every time. `body` is the request as it was (a repeat must be the same request)."""
        if request_id is None:
            return await answer(), False
        seen = self._seen.get(request_id)
        if seen is not None:
            first_body, reply = seen
            if first_body != body:
                raise ReusedRequestId(f"request id {request_id!r} was already used for another request")
            self._seen.move_to_end(request_id)
            return await asyncio.shield(reply), True
        reply = asyncio.get_running_loop().create_future()
        self._seen[request_id] = (body, reply)
        while len(self._seen) > self.size:
            self._seen.popitem(last=False)
        try:
            reply.set_result(await answer())
        except BaseException:
            # not answered (the node is stopping): forget the id, and let any waiting repeat go
            if self._seen.get(request_id, (None, None))[1] is reply:
                del self._seen[request_id]
            reply.cancel()
            raise
        return reply.result(), False
