"""RetryPolicy: when a client sends a call again, and how long it waits first (docs/PYTHON.md,
"Retries"). The C client's ctl_retry_policy under Python names, in seconds.

What a policy retries, each within the call's one deadline (any op unless said):

- a request that never left: the connection was refused (a unit's connection cap too);
- Busy, with `retry_busy`, unless its reason is "draining" (that unit is going away);
- a timeout, or the connection lost after the request left: only for a call made with
  `idempotent=True` (it may have run);
- never: UnitFull, Missing, Protocol, declared kinds, auth, unresolved, too large, a bad
  reply, a cancelled call; a notify is never retried.

Apart from the policy, a request is sent again on a fresh connection when the pooled socket it
was given finds its connection gone (nothing left: the transparent retry), unless
`transparent=False`; that costs no attempt of `max_attempts` and nothing of the budget.
"""

from __future__ import annotations

import asyncio
import inspect
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

# The defaults, as the C client's (CTL_DEFAULT_RETRY_*).
DEFAULT_INITIAL_BACKOFF = 0.05
DEFAULT_MAX_BACKOFF = 1.0
DEFAULT_MULTIPLIER = 2.0
DEFAULT_JITTER = 0.2
DEFAULT_BUDGET_TOKENS = 10
DEFAULT_BUDGET_RATIO = 0.1


def seconds(name: str, v: Any) -> float:
    """A time in seconds, `name`d in the message when it is not a finite number >= 0
    (ValueError): timeouts, backoffs."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < float("inf"):
        raise ValueError(f"{name} {v!r} is not a number of seconds >= 0")
    return float(v)


@dataclass(frozen=True)
class RetryPolicy:
    """How a client retries a failed call (off by default: max_attempts 1).

    max_attempts: attempts in all, the first included (0 or 1: no retries but the transparent
    one). Before retry n (1, 2, ...) the client waits min(initial_backoff *
    multiplier ** (n - 1), max_backoff) seconds, drawn uniformly from [d * (1 - jitter),
    d * (1 + jitter)]; a retry whose wait would end at or after the call's deadline is not
    started (the call ends with the last attempt's error). retry_busy: retry Busy (not
    "draining"). budget_tokens, budget_ratio: the per-address retry budget (gRPC's retry
    throttling): every failed attempt of a kind the policy retries takes a token, every result
    gives budget_ratio back, and a retry is allowed only while more than budget_tokens / 2 are
    left. transparent: send a request again on a fresh connection when its pooled one has gone
    (nothing was sent). attempt_timeout: how long one attempt of an idempotent call waits for
    its reply before it ends as a timeout and is retried (seconds; None or 0: the time left to
    the deadline, so a timeout ends the call); only an attempt that a retry can follow is cut
    short (not the last, not when the retry's shortest backoff would end at the deadline).

    For tests: clock (monotonic seconds; default time.monotonic: every deadline of the client's
    calls is measured with it), sleep (how the blocking client waits a backoff: default
    time.sleep; for ctlrpc.aio.Client an async function, default asyncio.sleep), rng (a
    function returning a float in [0, 1), or a random.Random; default random.random).
    """

    max_attempts: int = 1
    initial_backoff: float = DEFAULT_INITIAL_BACKOFF
    max_backoff: float = DEFAULT_MAX_BACKOFF
    multiplier: float = DEFAULT_MULTIPLIER
    jitter: float = DEFAULT_JITTER
    retry_busy: bool = False
    budget_tokens: int = DEFAULT_BUDGET_TOKENS
    budget_ratio: float = DEFAULT_BUDGET_RATIO
    transparent: bool = True
    attempt_timeout: Optional[float] = None
    clock: Optional[Callable[[], float]] = field(default=None, compare=False)
    sleep: Optional[Callable[[float], Any]] = field(default=None, compare=False)
    rng: Optional[Any] = field(default=None, compare=False)

    def __post_init__(self) -> None:
        def bad(what: str) -> ValueError:
            return ValueError(f"RetryPolicy: {what}")
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) \
                or self.max_attempts < 0:
            raise bad(f"max_attempts {self.max_attempts!r} is not a whole number >= 0")
        for name in ("initial_backoff", "max_backoff"):
            seconds(f"RetryPolicy: {name}", getattr(self, name))
        if self.max_backoff < self.initial_backoff:
            raise bad(f"max_backoff {self.max_backoff!r} is below initial_backoff "
                      f"{self.initial_backoff!r}")
        # The bounds the C client's ctl_retry_policy has.
        if not isinstance(self.multiplier, (int, float)) or isinstance(self.multiplier, bool) \
                or not 1.0 <= self.multiplier <= 1e6:
            raise bad(f"multiplier {self.multiplier!r} is not between 1 and 1e6")
        if not isinstance(self.jitter, (int, float)) or isinstance(self.jitter, bool) or \
                not 0.0 <= self.jitter <= 1.0:
            raise bad(f"jitter {self.jitter!r} is not between 0 and 1")
        if isinstance(self.budget_tokens, bool) or not isinstance(self.budget_tokens, int) \
                or not 1 <= self.budget_tokens <= 1000000:
            raise bad(f"budget_tokens {self.budget_tokens!r} is not a whole number between 1 "
                      f"and 1000000")
        if not isinstance(self.budget_ratio, (int, float)) or isinstance(self.budget_ratio, bool) \
                or not 0.0 <= self.budget_ratio <= 1e6:
            raise bad(f"budget_ratio {self.budget_ratio!r} is not between 0 and 1000000")
        if self.attempt_timeout is not None:
            seconds("RetryPolicy: attempt_timeout", self.attempt_timeout)
        for name in ("retry_busy", "transparent"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"RetryPolicy: {name} must be True or False, not "
                                f"{type(getattr(self, name)).__name__}")
        for name in ("clock", "sleep"):
            v = getattr(self, name)
            if v is not None and not callable(v):
                raise bad(f"{name} must be a function, not {type(v).__name__}")
        if self.rng is not None and not callable(self.rng) and \
                not callable(getattr(self.rng, "random", None)):
            raise bad(f"rng must be a function or a random.Random, not "
                      f"{type(self.rng).__name__}")

    def base_backoff(self, n: int) -> float:
        """The wait before retry `n` (1, 2, ...) before its jitter."""
        try:
            grown = self.initial_backoff * self.multiplier ** (n - 1)
        except OverflowError:
            grown = float("inf")
        return min(grown, self.max_backoff)

    def backoff(self, n: int) -> float:
        """The wait before retry `n` (1, 2, ...), jittered."""
        d = self.base_backoff(n)
        if self.jitter:
            r = self.rng if self.rng is not None else random.random
            draw = r.random if not callable(r) else r
            d *= 1.0 - self.jitter + 2.0 * self.jitter * float(draw())
        return max(0.0, d)

    def now_fn(self) -> Callable[[], float]:
        return self.clock if self.clock is not None else time.monotonic

    def sync_sleep(self) -> Callable[[float], Any]:
        if self.sleep is None:
            return time.sleep
        if inspect.iscoroutinefunction(self.sleep):
            raise ValueError("RetryPolicy: sleep is an async function; the blocking "
                             "ctlrpc.Client needs a plain one (time.sleep)")
        return self.sleep

    def async_sleep(self) -> Callable[[float], Any]:
        if self.sleep is None:
            return asyncio.sleep
        if not inspect.iscoroutinefunction(self.sleep):
            raise ValueError("RetryPolicy: ctlrpc.aio.Client needs an async sleep "
                             "(asyncio.sleep), not a blocking one")
        return self.sleep


NO_RETRY = RetryPolicy()
