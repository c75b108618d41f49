"""What a process makes from an object named by its digest (a personas file parsed into a cast,
a recorder's profile rows), kept so that it is fetched and parsed once per process: a second run
or spawn of the same personas uses it again, and callers asking at the same time wait for the
one making it. Bounded: the least recently used goes beyond `limit` entries or `max_bytes`."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class ByDigest(Generic[T]):
    def __init__(self, limit: int = 1, max_bytes: int | None = None,
                 size: Callable[[T], int] | None = None) -> None:
        self.limit, self.max_bytes, self.size = limit, max_bytes, size
        self._kept: OrderedDict[str, asyncio.Future[T]] = OrderedDict()
        self._bytes: dict[str, int] = {}
        self.made = 0  # values made (fetched and parsed): a test counts them

    async def get(self, digest: str, make: Callable[[], Awaitable[T]]) -> T:
        """The value for `digest`, made by `make()` only if it is not kept (or being made)."""
        kept = self._kept.get(digest)
        if kept is not None:  # kept, or being made (a failed making is not kept)
            self._kept.move_to_end(digest)
            return await asyncio.shield(kept)
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._kept[digest] = future
        self._kept.move_to_end(digest)
        try:
            value = await make()
        except BaseException as err:
            if self._kept.get(digest) is future:
                del self._kept[digest]  # not kept: the next asker tries again
            if isinstance(err, asyncio.CancelledError):
                future.cancel()
            else:
                future.set_exception(err)
                future.exception()  # retrieved: a failure nobody else awaited is not logged as lost
            raise
        self.made += 1
        future.set_result(value)
        if self._kept.get(digest) is future:
            self._bytes[digest] = self.size(value) if self.size is not None else 0
            self._trim(keep=digest)
        return value

    def _trim(self, keep: str) -> None:
        while len(self._kept) > 1 and (len(self._kept) > self.limit or self._over_budget()):
            oldest = next(iter(self._kept))
            if oldest == keep:
                break
            del self._kept[oldest]
            self._bytes.pop(oldest, None)
        if self._over_budget():  # alone and still too big: used once, not kept
            self._kept.pop(keep, None)
            self._bytes.pop(keep, None)

    def _over_budget(self) -> bool:
        return self.max_bytes is not None and sum(self._bytes.values()) > self.max_bytes

    def __contains__(self, digest: str) -> bool:
        return digest in self._kept

    def clear(self) -> None:
        self._kept.clear()
        self._bytes.clear()
