"""`populace manager`: the web application to watch, start, steer and clean up runs and the
nodes they run on (server-rendered pages, a little vanilla JavaScript, server-sent events).

    from populace.manager import ManagerSettings, create_app, serve
    serve(ManagerSettings(nats_url="nats://127.0.0.1:4222"), host="127.0.0.1", port=8080)
"""

from __future__ import annotations

from populace.manager.access import is_loopback
from populace.manager.app import create_app
from populace.manager.settings import ManagerSettings

__all__ = ["ManagerSettings", "create_app", "is_loopback", "serve"]


def serve(settings: ManagerSettings, host: str = "127.0.0.1", port: int = 8080) -> None:
    """Serve the manager with uvicorn in the foreground until SIGINT/SIGTERM."""
    import uvicorn

    # open pages hold event streams forever: shutdown waits for them only briefly
    uvicorn.run(create_app(settings), host=host, port=port, log_level="warning", lifespan="on",
                timeout_graceful_shutdown=2)
