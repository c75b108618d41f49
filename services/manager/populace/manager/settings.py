"""What `create_app` is given: the stack to manage and how the pages behave."""

from __future__ import annotations

from dataclasses import dataclass, field

from populace.manager.access import MIN_TOKEN_CHARS, LoginLimits


@dataclass(frozen=True)
class ManagerSettings:
    nats_url: str
    sample_s: float = 1.0  # live updates: at most one per open page per this many seconds
    cancel_reason: str = "cancelled from the manager"
    title: str = "Populace manager"
    jaeger_url: str | None = None  # e.g. http://localhost:16686: the run page links its trace
    token: str | None = field(default=None, repr=False)  # every route asks for it (populace.manager.access)
    read_timeout_s: float = 10.0  # the run page's reads of the recorder (agents, distribution)
    login_limits: LoginLimits = field(default_factory=LoginLimits)  # wrong tokens: how late, how many

    def __post_init__(self) -> None:
        if self.token and len(self.token) < MIN_TOKEN_CHARS:
            raise ValueError(f"token: at least {MIN_TOKEN_CHARS} characters (a right token always passes: its "
                             "length is what keeps guessing hopeless)")
