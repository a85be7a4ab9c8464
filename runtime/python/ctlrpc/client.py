"""The client: call, call_many and notify over a per-address pool of DEALER sockets.

The semantics are the C runtime's (runtime/src/client.c, pool.c, call.c; docs/API.md, "Client"):

- One request in flight per socket. A call borrows a socket from the pool of its address (the
  most recently returned, so a notify and a following call from one thread ride one connection
  and arrive in order), sends `[op, id, args]` with a fresh id (12 hex digits, '@' and the
  call's deadline on the wall clock, which the unit honours: docs/PROTOCOL.md, "Deadlines"), and
  waits for the reply carrying that id.
- The socket goes back to the pool only after that complete, matching reply (a result or an
  error map). After a timeout, a bad reply, or a transport failure, it is retired: never lent
  again, kept for `late_grace` seconds while anything arriving on it is drained and counted as
  a late reply, then closed. A reply for another id seen during a call is counted as late and
  skipped; the call goes on waiting for its own until its deadline, and its socket is retired
  afterwards. So a late reply can never reach a later call.
- Nothing waits without a deadline. `call_many` sends every request before it reads any reply,
  then collects replies until the one deadline of the batch.
- Failing fast: every pooled socket has a ZeroMQ socket monitor, read by a call that has waited
  100 ms without its reply (and every 100 ms after). A connection refused or a host that does not
  resolve on two attempts in a row, a CURVE handshake the unit did not accept, or a connection
  this side dropped for a reply over `max_msg_bytes` ends the call with Transfer, cause
  "refused", "unresolved", "auth" or "too-large", well before its deadline (the C client's rules,
  docs/API.md "Failures that end a call early"). A request over `max_msg_bytes` is not sent.
- Nothing runs that was reported not sent: the sockets are ZMQ_IMMEDIATE, so a request is
  handed to ZeroMQ only once a connection is up, and waits (unsent, its monitor read) until
  then; one that never left is dropped with its socket and its error says "nothing was sent"
  (Transfer.unsent). `calls` counts requests that left, `attempts` every try.
- Retries (retry.RetryPolicy): a pooled socket found without its connection is swapped for a
  fresh one before anything leaves (the transparent retry); the policy sends a failed attempt
  again after a backoff, within the call's one deadline, by the rules of docs/PYTHON.md
  "Retries" (_settle). call_many retries each target on its own.
- Thread-safe: several threads may share one Client; the pool's lock is the only shared state,
  and a socket is used by one thread at a time. `close()` must not run while another thread is
  still calling.
"""

from __future__ import annotations

import errno
import ipaddress
import itertools
import logging
import math
import os
import re
import secrets
import select
import threading
import time
import types
import weakref
from collections import deque
from dataclasses import dataclass
from typing import (Any, Callable, Deque, Dict, List, Mapping, Optional, Sequence, Set, Tuple,
                    Type, cast, overload)

import zmq

from . import _loglimit, _threads, _wire, curve, errors, net
from .net import ZMQ_EVENTS, ZMQ_NOBLOCK, ZMQ_POLLIN, ZMQ_RCVMORE
from .retry import NO_RETRY, RetryPolicy, seconds

DEFAULT_TIMEOUT = 30.0
DEFAULT_LATE_GRACE = 1.0
DEFAULT_MAX_IDLE_PER_ADDRESS = 16
DEFAULT_MAX_RETIRED = 64
IDLE_LINGER_MS = 100
CHECK_S = 0.100  # a call reads its connection's monitor after this long without a reply
FAILS_TO_END = 2  # failed connection attempts in a row that end a call
BROKEN_SETTLE_S = 0.300  # a broken handshake not retried within this has been given up
DROP_SETTLE_S = 0.050  # a drop not followed by a reconnect within this is this side's own
RECONNECT_IVL_MAX_MS = 1000
IDLE_DRAIN_S = 1.0  # on a lend or a return, idle sockets' monitors are read at most this often
JANITOR_S = 0.5  # the janitor tidies every open client's pool this often
DEFAULT_IDLE_TIMEOUT = 30.0  # an idle socket unused this long is closed
DEFAULT_MAX_ADDRESSES = 4096  # addresses whose counters a client keeps (those with sockets: all)
_ID_LEN = 26  # request ids: 12 hex digits, "@", 13 digits of deadline (_wire.format_id)
_MONITOR_EVENTS = (zmq.EVENT_CONNECT_DELAYED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_CLOSED
                   | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
                   | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                   | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
_MECHANISM_MISMATCH = 0x11000001  # ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
_CRYPTOGRAPHIC = 0x11000002  # ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC

log = logging.getLogger("ctlrpc")

_NO_KINDS: Mapping[str, Type[errors.DeclaredError]] = types.MappingProxyType({})

# The counters kept per address (Client.stats); sockets, retired, sockets_idle, errors and
# retries_by_cause (by cause) are computed. calls, timeouts, late_replies, sockets, retired,
# errors.<cause>, attempts, retries, retries_busy, retries_by_cause.<cause> and
# retries_throttled are the C client's names (ctl_address_stats).
COUNTERS = ("calls", "notifies", "timeouts", "late_replies", "sockets_opened",
            "sockets_retired", "sockets_closed", "attempts", "retries", "retries_busy",
            "retries_throttled")


class _Watch:
    """What the monitor of one socket has said so far (the C client's ctl_conn_state). ZeroMQ's
    sequences (libzmq 4.3):
      refused:     CONNECT_DELAYED, CLOSED, CONNECT_RETRIED (every ~100 ms)
      unresolved:  CONNECT_RETRIED alone (no TCP socket was ever opened)
      handshake broken off by the peer (CURVE, wrong server key):
                   HANDSHAKE_FAILED_NO_DETAIL, DISCONNECTED, CONNECT_RETRIED
      refused by ZAP / mechanism mismatch: HANDSHAKE_FAILED_AUTH (value: the ZAP status) or
                   _PROTOCOL (value: the protocol error), DISCONNECTED, no reconnect
      up:          HANDSHAKE_SUCCEEDED
      closed by the peer: DISCONNECTED, CONNECT_RETRIED at once
      closed by this side (a message over MAXMSGSIZE): DISCONNECTED, no reconnect"""

    __slots__ = ("mon", "fd", "fails", "fail", "hs_no_detail", "closed", "up", "after_drop",
                 "dropped_at", "broken", "broken_at", "verdict_event", "verdict_value", "lost",
                 "lost_since_send")

    def __init__(self, mon: zmq.Socket[Any]) -> None:
        self.mon = mon
        self.fd = cast(int, mon.getsockopt(zmq.FD))  # readable while commands wait for it
        self.fails = 0
        self.fail = ""
        self.hs_no_detail = False
        self.closed = False
        self.up = False
        self.after_drop = False
        self.dropped_at = 0.0
        self.broken = False  # connected, then closed before the handshake completed
        self.broken_at = 0.0
        self.verdict_event = 0
        self.verdict_value = 0
        self.lost = False  # was up, then dropped, and not up again since
        self.lost_since_send = False  # a connection that was up dropped since the last send
        # A pipe's reader starts awake: until a read finds it empty, the monitor's events do
        # not make its descriptor readable (_Pool._monitors_waiting).
        self.drain()

    def fold(self, ev: int, value: int) -> None:
        if ev == zmq.EVENT_CONNECT_DELAYED:
            self.closed = False
        elif ev == zmq.EVENT_CLOSED:
            self.closed = True
        elif ev == zmq.EVENT_CONNECT_RETRIED:
            if self.after_drop:  # the reconnect after a drop by the peer: not a failure
                self.after_drop = False
                self.dropped_at = 0.0
            else:
                self.fails += 1
                self.fail = ("handshake" if self.hs_no_detail or self.broken else
                             "refused" if self.closed else "unresolved")
            self.closed = self.hs_no_detail = self.broken = False
            self.broken_at = 0.0
        elif ev == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.fails = 0
            self.up = True
            self.lost = False
            self.verdict_event = 0
        elif ev == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            self.hs_no_detail = True
        elif ev in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_AUTH):
            self.verdict_event = ev
            self.verdict_value = value
        elif ev == zmq.EVENT_DISCONNECTED and self.up:
            self.up = False
            self.lost = True
            self.lost_since_send = True
            self.after_drop = True
            self.dropped_at = 0.0
        elif ev == zmq.EVENT_DISCONNECTED:
            # The peer broke the handshake off, whether or not an event said so.
            self.broken = True
            self.broken_at = 0.0

    def drain(self) -> None:
        if not cast(int, self.mon.getsockopt(ZMQ_EVENTS)) & ZMQ_POLLIN:
            return  # the usual case, and a call asks before every send on a pooled socket
        for ev, value in net.monitor_events(self.mon):
            self.fold(ev, value)

    def gone(self) -> bool:
        """Whether the unit of an idle socket has gone: its connection dropped, failed or was
        refused, and has not come back (what was read so far: drain() first)."""
        return not self.up and (self.lost or self.fails > 0 or self.broken
                                or self.verdict_event != 0)

    def verdict(self, now: float) -> str:
        """What ends a call: "" (nothing), "refused", "unresolved", "handshake", "denied",
        "capped" (ZAP status 500: the unit's connection caps), "mechanism", "protocol",
        "dropped" or "lost" (the connection dropped since the request was sent and is up again:
        the unit restarted in place; see _Engine._conn_failure)."""
        self.drain()
        if self.verdict_event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return "capped" if self.verdict_value == 500 else "denied"
        if self.verdict_event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            return ("mechanism" if self.verdict_value == _MECHANISM_MISMATCH else
                    "handshake" if self.verdict_value == _CRYPTOGRAPHIC else "protocol")
        if self.fails >= FAILS_TO_END:
            return self.fail
        if self.broken:  # not retried: libzmq has given up on the peer
            if not self.broken_at:
                self.broken_at = now
            elif now - self.broken_at >= BROKEN_SETTLE_S:
                return "handshake"
        if self.after_drop:
            if not self.dropped_at:
                self.dropped_at = now
            elif now - self.dropped_at >= DROP_SETTLE_S:
                return "dropped"
        if self.lost_since_send and self.up:
            return "lost"
        return ""


@dataclass
class Outcome:
    """One target's outcome in call_many: its result (`ok`), or the error its call raised."""

    address: str
    ok: bool
    result: Any
    error: Optional[errors.Error]


class _Entry:
    """One address: its idle sockets (a stack of (socket, when it was returned)) and its
    counters."""

    __slots__ = ("idle", "counters", "errors", "retries_by_cause", "tokens")

    def __init__(self, tokens: float) -> None:
        self.idle: List[Tuple[zmq.Socket[Any], float]] = []
        self.counters: Dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self.errors: Dict[str, int] = dict.fromkeys(errors.CAUSES, 0)
        self.retries_by_cause: Dict[str, int] = dict.fromkeys(errors.CAUSES, 0)
        self.tokens = tokens  # the retry budget (RetryPolicy.budget_tokens)

    def open_sockets(self) -> int:
        return self.counters["sockets_opened"] - self.counters["sockets_closed"]


class _Janitor:
    """The one thread of the process that tidies every open client's pool every JANITOR_S
    seconds, whether or not the client makes calls (_Pool.sweep): idle sockets past their idle
    time or whose unit has gone are closed, retired ones past their grace period too, and the
    monitors of all of them are read, so a quiet client holds nothing it does not need and its
    monitor queues never grow. It runs while some pool is open and ends when none is; pools
    are held weakly (a client dropped without close() is not kept alive by it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pools: "weakref.WeakSet[_Pool]" = weakref.WeakSet()
        self.running = False

    def add(self, pool: _Pool) -> None:
        with self.lock:
            self.pools.add(pool)
            if not self.running:
                self.running = True
                _threads.start(self._run, "ctlrpc-janitor")

    def remove(self, pool: _Pool) -> None:
        with self.lock:
            self.pools.discard(pool)

    def _run(self) -> None:
        wake = threading.Event()
        while True:
            wake.wait(JANITOR_S)  # a period, not a wait for anything: nothing sets it
            with self.lock:
                pools = list(self.pools)
                if not pools:
                    self.running = False
                    return
            for pool in pools:
                try:
                    pool.tidy()
                except Exception:  # a bug here must not end the tidying of the others
                    log.exception("ctlrpc client: tidying a pool failed")
            del pools

    def after_fork(self) -> None:
        """In a forked child: the parent's thread did not come along, and its clients' sockets
        are not the child's to touch (ZeroMQ sockets do not survive a fork): start afresh."""
        self.lock = threading.Lock()
        self.pools = weakref.WeakSet()
        self.running = False


_JANITOR = _Janitor()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_JANITOR.after_fork)


class _Pool:
    """Sockets per address, lent and returned under one lock, and the retired ones in their
    grace period; swept, without blocking, at every lend and return and by the janitor."""

    def __init__(self, ctx: zmq.Context[Any], max_idle: int, max_retired: int, late_grace: float,
                 max_msg_bytes: int, keys: Optional[Tuple[str, str, str]],
                 idle_timeout: float, max_addresses: int,
                 retry: RetryPolicy = NO_RETRY) -> None:
        self.ctx = ctx
        self.retry = retry
        self.max_idle = max_idle
        self.max_retired = max_retired
        self.late_grace = late_grace
        self.max_msg_bytes = max_msg_bytes
        self.keys = keys  # (server public, own public, own secret)
        self.idle_timeout = idle_timeout
        self.max_addresses = max_addresses
        self.lock = threading.Lock()
        self.entries: Dict[str, _Entry] = {}
        self.retired: Deque[Tuple[zmq.Socket[Any], float, str]] = deque()
        self.closed = False
        self.watches: Dict[zmq.Socket[Any], _Watch] = {}  # each socket's monitor
        self.idle_drained = time.monotonic()
        # Sockets an event loop watches (the asyncio client keeps a socket's descriptor with
        # its loop while the socket idles here): only the loop's thread (owner_thread) may stop
        # watching one, so one the pool closes on another thread waits in to_close until that
        # thread takes it (close_owned); on_to_close asks it to, and unwatch stops the
        # watching (both: the owner's).
        self.owned: Set[zmq.Socket[Any]] = set()
        self.owner_thread = 0
        self.to_close: List[Tuple[str, zmq.Socket[Any], int]] = []
        self.on_to_close: Optional[Callable[[], None]] = None
        self.unwatch: Optional[Callable[[zmq.Socket[Any]], None]] = None
        _JANITOR.add(self)

    def _entry(self, address: str) -> _Entry:
        """Find or create an address's entry, validating the address on creation. Called with
        the lock held."""
        e = self.entries.get(address)
        if e is None:
            net.dialable(address)
            if len(self.entries) >= self.max_addresses:
                self._forget()
            e = self.entries[address] = _Entry(float(self.retry.budget_tokens))
        return e

    def _forget(self) -> None:
        """Drop the counters of the oldest addresses that hold no socket, down to 7/8 of
        max_addresses, so a client calling ever new units stays bounded."""
        keep = self.max_addresses * 7 // 8
        for a in [a for a, e in self.entries.items() if e.open_sockets() == 0]:
            if len(self.entries) <= keep:
                break
            del self.entries[a]

    def count(self, address: str, counter: str, n: int = 1) -> None:
        with self.lock:
            self._entry(address).counters[counter] += n

    def count_error(self, address: str, cause: str) -> None:
        """A call (or notify) that ended in Transfer of `cause`; one that timed out counts in
        `timeouts` too (calls, not attempts: the same as errors["timeout"])."""
        with self.lock:
            e = self._entry(address)
            e.errors[cause] = e.errors.get(cause, 0) + 1
            if cause == "timeout":
                e.counters["timeouts"] += 1

    def count_retry(self, address: str, cause: str) -> None:
        """A retry after a failure of `cause` ("busy": after Busy; "": the transparent retry,
        counted in retries alone, as the C client counts it)."""
        with self.lock:
            c = self._entry(address)
            c.counters["retries"] += 1
            if cause == "busy":
                c.counters["retries_busy"] += 1
            elif cause:
                c.retries_by_cause[cause] = c.retries_by_cause.get(cause, 0) + 1

    def budget_credit(self, address: str) -> None:
        """A result came: the address's retry budget gets budget_ratio back (capped)."""
        e = self.entries.get(address)
        if e is not None and e.tokens >= self.retry.budget_tokens:
            return  # full, as it mostly is: nothing to take the lock for
        with self.lock:
            e = self._entry(address)
            e.tokens = min(float(self.retry.budget_tokens), e.tokens + self.retry.budget_ratio)

    def budget_debit(self, address: str) -> bool:
        """An attempt failed as the policy would retry: it takes a token. Whether a retry is
        still allowed (more than half the tokens left)."""
        with self.lock:
            e = self._entry(address)
            e.tokens = max(0.0, e.tokens - 1.0)
            return e.tokens > self.retry.budget_tokens / 2

    def check(self, sock: zmq.Socket[Any]) -> Tuple[str, int]:
        """What the monitor of a lent socket says (_Watch.verdict) and the value of the event
        behind it. Called by the thread holding the socket."""
        w = self.watches.get(sock)
        if w is None:
            return "", 0
        return w.verdict(time.monotonic()), w.verdict_value

    def sent(self, sock: zmq.Socket[Any]) -> None:
        """A request was handed to lent socket `sock`: a drop from now on is its own."""
        w = self.watches.get(sock)
        if w is not None:
            w.lost_since_send = False

    def connected(self, sock: zmq.Socket[Any]) -> bool:
        """Whether the monitor of a lent socket says its connection is up. Called by the
        thread holding the socket."""
        w = self.watches.get(sock)
        if w is None:
            return False
        w.drain()
        return w.up

    def own(self, sock: zmq.Socket[Any]) -> None:
        """A lent socket is now watched by an event loop (its owner), until it is retired or
        closed: called by the owner's thread."""
        with self.lock:
            self.owned.add(sock)

    def close_owned(self) -> None:
        """On the owner's thread: stop watching, and close, the owned sockets the pool has
        closed since (idle too long, unit gone, no room, the client closed)."""
        with self.lock:
            self._close_owned()

    def _close_owned(self) -> None:
        items, self.to_close = self.to_close, []
        for address, sock, linger_ms in items:
            self._disown(sock)
            self._close(address, sock, linger_ms)

    def _disown(self, sock: zmq.Socket[Any]) -> None:
        """Called with the lock held, on the owner's thread."""
        self.owned.discard(sock)
        if self.unwatch is not None:
            self.unwatch(sock)

    def _close(self, address: str, sock: zmq.Socket[Any], linger_ms: int) -> None:
        if sock in self.owned:
            # It waits for its owner's thread; but a closing pool closes everything (close()
            # belongs on the owner's thread: from another, ZeroMQ would wait for it for ever).
            if threading.get_ident() != self.owner_thread and not self.closed:
                self.to_close.append((address, sock, linger_ms))
                if len(self.to_close) == 1 and self.on_to_close is not None:
                    self.on_to_close()
                return
            self._disown(sock)
        w = self.watches.pop(sock, None)
        if w is not None:
            net.close_monitor(sock, w.mon)
        sock.close(linger=linger_ms)
        e = self.entries.get(address)
        if e is not None:
            e.counters["sockets_closed"] += 1

    def tidy(self) -> None:
        """The janitor's round: sweep, reading every idle socket's monitor."""
        with self.lock:
            if not self.closed:
                self.idle_drained = 0.0
                self.sweep()

    def sweep(self, everything: bool = False) -> None:
        """Drain every retired socket, counting late replies, and close those whose grace
        period is over (all of them with `everything`); at most every IDLE_DRAIN_S, read the
        idle sockets' monitors and close those idle longer than idle_timeout or whose unit has
        gone (_Watch.gone). Called with the lock held."""
        now = time.monotonic()
        if now - self.idle_drained >= IDLE_DRAIN_S:
            self.idle_drained = now
            waiting = self._monitors_waiting()
            for address, e in self.entries.items():
                if e.idle:
                    self._sweep_idle(address, e, now, waiting)
        for _ in range(len(self.retired)):
            sock, close_at, address = self.retired.popleft()
            late = 0
            try:
                while True:
                    sock.recv(ZMQ_NOBLOCK)
                    if not sock.getsockopt(ZMQ_RCVMORE):
                        late += 1
            except zmq.ZMQError:
                pass  # nothing more (EAGAIN), or a broken socket: closed below in any case
            if late:
                self._entry(address).counters["late_replies"] += late
            w = self.watches.get(sock)
            if w is not None:
                w.drain()
            if everything or close_at <= now:
                self._close(address, sock, 0)
            else:
                self.retired.append((sock, close_at, address))

    def _monitors_waiting(self) -> Optional[Set[int]]:
        """The descriptors of the idle sockets' monitors that have something to read, from one
        poll(2) over them all, where asking each monitor costs a few system calls inside
        libzmq even when it has nothing. A monitor is always read until it has nothing more
        (_Watch.drain), after which its next event makes its descriptor readable. None when
        the poll fails: then every monitor is read. Called with the lock held."""
        poller = select.poll()
        for e in self.entries.values():
            for sock, _ in e.idle:
                w = self.watches.get(sock)
                if w is not None:
                    poller.register(w.fd, select.POLLIN)
        try:
            return {fd for fd, _ in poller.poll(0)}
        except OSError:
            return None

    def _sweep_idle(self, address: str, e: _Entry, now: float,
                    waiting: Optional[Set[int]]) -> None:
        keep: List[Tuple[zmq.Socket[Any], float]] = []
        for sock, since in e.idle:
            w = self.watches.get(sock)
            if w is not None and (waiting is None or w.fd in waiting):
                w.drain()
            if w is not None and w.gone():
                self._close(address, sock, 0)  # nothing listens any more: nothing to deliver
            elif now - since >= self.idle_timeout:
                self._close(address, sock, IDLE_LINGER_MS)
            else:
                keep.append((sock, since))
        e.idle[:] = keep

    def _dial(self, address: str) -> zmq.Socket[Any]:
        """A new socket connected to `address`, with its monitor. On failure nothing stays
        open: ValueError when ZeroMQ refuses the address itself, zmq.ZMQError otherwise."""
        # A plain socket whatever the context's class (a zmq.asyncio context makes sockets
        # whose receive returns futures): the pool's callers wait on it themselves.
        sock: zmq.Socket[Any] = zmq.Socket(self.ctx, zmq.DEALER)
        mon: Optional[zmq.Socket[Any]] = None
        try:
            sock.setsockopt(zmq.LINGER, 0)
            # A request is handed to ZeroMQ only once a connection is up, never queued for a
            # unit that may appear on the address later: so "nothing was sent" is exact.
            sock.setsockopt(zmq.IMMEDIATE, 1)
            sock.setsockopt(zmq.MAXMSGSIZE, self.max_msg_bytes)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
            if net.wants_ipv6(net.parse_endpoint(address).host):
                sock.setsockopt(zmq.IPV6, 1)
            if self.keys:
                server, public, secret = self.keys
                sock.setsockopt(zmq.CURVE_SERVERKEY, server.encode("ascii"))
                sock.setsockopt(zmq.CURVE_PUBLICKEY, public.encode("ascii"))
                sock.setsockopt(zmq.CURVE_SECRETKEY, secret.encode("ascii"))
            mon = net.open_monitor(self.ctx, sock, _MONITOR_EVENTS, "client-monitor")
            try:
                sock.connect(address)
            except zmq.ZMQError as e:
                if e.errno == errno.EINVAL:
                    raise ValueError(f"address '{address}' is not dialable: ZeroMQ refuses it "
                                     f"({e.strerror})") from None
                raise
        except BaseException:
            if mon is not None:
                net.close_monitor(sock, mon)
            sock.close(linger=0)
            raise
        with self.lock:
            self.watches[sock] = _Watch(mon)
        return sock

    def lend(self, address: str, fresh: bool = False,
             attempt: bool = False) -> Tuple[zmq.Socket[Any], bool]:
        """A socket to `address`: an idle one (unless `fresh`), or a new one; and whether it
        came from the pool. `attempt`: count an attempt of a call on it. ValueError for an
        address that is not tcp://host:port; zmq.ZMQError when a socket cannot be made."""
        with self.lock:
            if self.closed:
                raise RuntimeError("the client is closed")
            self.sweep()
            e = self._entry(address)
            if e.idle and not fresh:
                if attempt:
                    e.counters["attempts"] += 1
                return e.idle.pop()[0], True
        # Dialing needs no lock: the new socket is not in the pool yet.
        sock = self._dial(address)
        with self.lock:
            c = self._entry(address).counters
            c["sockets_opened"] += 1
            if attempt:
                c["attempts"] += 1
        return sock, False

    def give_back(self, address: str, sock: zmq.Socket[Any]) -> None:
        """Return a socket after a complete reply with its request's id (or a sent notify)."""
        with self.lock:
            self.sweep()
            e = self._entry(address)
            if not self.closed and len(e.idle) < self.max_idle:
                e.idle.append((sock, time.monotonic()))
                return
            self._close(address, sock, IDLE_LINGER_MS)

    def retire(self, address: str, sock: zmq.Socket[Any]) -> None:
        """Take a socket out of use: closed after its grace period, late replies counted.
        Called by the thread holding it (an owner stops watching it: any thread may drain it
        now)."""
        with self.lock:
            if sock in self.owned:
                self._disown(sock)
            e = self._entry(address)
            e.counters["sockets_retired"] += 1
            if self.late_grace <= 0 or self.closed:
                self._close(address, sock, 0)
                return
            if len(self.retired) >= self.max_retired:
                old, _, old_address = self.retired.popleft()  # full: the oldest leaves early
                self._close(old_address, old, 0)
            self.retired.append((sock, time.monotonic() + self.late_grace, address))

    def stats(self, address: Optional[str]) -> Dict[str, Dict[str, Any]]:
        with self.lock:
            self.sweep()
            out = {}
            for a, e in self.entries.items():
                if address is None or a == address:
                    out[a] = _address_stats(e.counters, e.errors, len(e.idle),
                                            e.retries_by_cause)
            return out

    def close(self) -> None:
        _JANITOR.remove(self)
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self.sweep(everything=True)
            for address, e in self.entries.items():
                while e.idle:
                    self._close(address, e.idle.pop()[0], IDLE_LINGER_MS)
            self._close_owned()  # close() runs on the owner's thread


def _address_stats(counters: Mapping[str, int], errs: Mapping[str, int],
                   idle: int, by_cause: Mapping[str, int]) -> Dict[str, Any]:
    """An address's counters as Client.stats shows them."""
    c = dict(counters)
    return dict(c, sockets=c["sockets_opened"] - c["sockets_closed"],
                retired=c["sockets_retired"], sockets_idle=idle, errors=dict(errs),
                retries_by_cause=dict(by_cause))


class _Pending:
    """One request of a call or a fan-out, through its attempts."""

    __slots__ = ("address", "request", "idempotent", "sock", "pooled", "id", "data", "unsent",
                 "dirty", "done", "settled", "ok", "result", "error", "attempts", "tries",
                 "retry_at", "attempt_end", "deadline_wall", "reg", "waiter", "ever_left")

    def __init__(self, address: str, request: Tuple[bytes, bytes],
                 idempotent: bool = False) -> None:
        self.address = address
        self.request = request  # the packed request around its id (see _request)
        self.idempotent = idempotent  # may run twice: retried after a timeout too
        self.sock: Optional[zmq.Socket[Any]] = None
        self.pooled = False  # the socket came from the pool (it had a connection)
        self.id = ""
        self.data: Optional[bytes] = None  # the request, while it has not left (unsent)
        self.unsent = False  # lent a socket, not handed to a connection yet
        self.dirty = False  # saw a reply for another id: never back to the pool
        self.done = False
        self.settled = False  # done, and the retry policy has judged the outcome
        self.ok = False
        self.result: Any = None
        self.error: Optional[errors.Error] = None
        self.attempts = 0  # attempts made, transparent retries included
        self.tries = 0  # attempts the policy counts (max_attempts)
        self.retry_at: Optional[float] = None  # waiting out a backoff until then
        self.attempt_end: Optional[float] = None  # this attempt's own limit (attempt_timeout)
        self.deadline_wall = 0.0  # the call's deadline in its ids (every attempt's the same)
        self.reg: Any = None  # the asyncio client: its socket's watch on the loop (ctlrpc.aio)
        self.waiter: Any = None  # and what its call waits on
        self.ever_left = False  # some attempt was handed to a connection (it may have run)

    def again(self) -> None:
        """Ready for another attempt (with the same id: see _prepare)."""
        self.sock, self.pooled, self.data = None, False, None
        self.unsent = self.dirty = self.done = self.settled = self.ok = False
        self.result, self.error, self.retry_at, self.attempt_end = None, None, None, None


class _Engine:
    """What the blocking Client and the asyncio one (ctlrpc.aio.Client) share: the options,
    the pool, the ids, and every step of a call that does not wait (lend and send, judge a
    reply, read a monitor, time out, give back or retire); each subclass only waits its own
    way. See the module's docstring for the rules.

    timeout: the default deadline of a call, in seconds. context: a ZeroMQ context to make the
    sockets in (borrowed; default: the client's own). curve_server_key: the units' CURVE public
    key (its text, or a key file); curve_secret: this client's secret key (text, or a key file
    that its group and others cannot read), for units with an allowlist; without it, a key pair
    for the client's lifetime. max_msg_bytes: the largest reply accepted (ZMQ_MAXMSGSIZE).
    late_grace, max_idle_per_address, max_retired: the pool's knobs, as in the C client.
    idle_timeout: seconds an idle socket is kept unused before it is closed (an idle socket
    whose unit has gone is closed within about a second). max_addresses: how many addresses'
    counters are kept; beyond it, those of the oldest addresses holding no socket are
    forgotten. retry: a RetryPolicy (default: none but the transparent retry; docs/PYTHON.md,
    "Retries").
    """
    def __init__(self, timeout: float = DEFAULT_TIMEOUT, *,
                 context: Optional[zmq.Context[Any]] = None,
                 curve_server_key: Optional[str] = None, curve_secret: Optional[str] = None,
                 max_msg_bytes: int = _wire.DEFAULT_MAX_MSG_BYTES,
                 late_grace: float = DEFAULT_LATE_GRACE,
                 max_idle_per_address: int = DEFAULT_MAX_IDLE_PER_ADDRESS,
                 max_retired: int = DEFAULT_MAX_RETIRED,
                 idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
                 max_addresses: int = DEFAULT_MAX_ADDRESSES,
                 retry: Optional[RetryPolicy] = None) -> None:
        if retry is None:
            retry = NO_RETRY
        elif not isinstance(retry, RetryPolicy):
            raise TypeError(f"client: retry must be a ctlrpc.RetryPolicy, not "
                            f"{type(retry).__name__}")
        self.retry = retry
        self._now = retry.now_fn()
        self._retry_sleep = self._sleeper(retry)
        timeout = seconds("client: timeout", timeout)
        late_grace = seconds("client: late_grace", late_grace)
        idle_timeout = seconds("client: idle_timeout", idle_timeout)
        for name, value, most in (("max_msg_bytes", max_msg_bytes, 2 ** 63 - 1),
                                  ("max_idle_per_address", max_idle_per_address, 2 ** 31 - 1),
                                  ("max_retired", max_retired, 2 ** 31 - 1),
                                  ("max_addresses", max_addresses, 2 ** 63 - 1)):
            if type(value) is not int:  # (a bool is no count either)
                raise TypeError(f"client: {name} must be an int, not {type(value).__name__}")
            if value > most:
                raise ValueError(f"client: {name} {value} is more than {most}")
        if max_msg_bytes <= 0:
            raise ValueError(f"client: max_msg_bytes {max_msg_bytes} is not positive")
        if not idle_timeout > 0:
            raise ValueError(f"client: idle_timeout {idle_timeout} is not positive")
        if context is not None and not isinstance(context, zmq.Context):
            raise TypeError(f"client: context must be a zmq.Context, not "
                            f"{type(context).__name__}")
        self.timeout = float(timeout)
        self.limits = _wire.Limits(max_msg_bytes=max_msg_bytes)
        keys: Optional[Tuple[str, str, str]] = None
        if curve_server_key is not None:
            server = curve.load_key(curve_server_key, False, "curve_server_key")
            if curve_secret is not None:
                secret = curve.load_key(curve_secret, True, "curve_secret")
                public = curve.public_of(secret)
            else:
                public, secret = curve.keypair()
            keys = (server, public, secret)
        elif curve_secret is not None:
            raise ValueError("client: a CURVE secret key needs the units' public key "
                             "(curve_server_key)")
        self._own_ctx = context is None
        self._ctx = zmq.Context() if context is None else context
        _threads.start_zmq(self._ctx)
        self._pool = _Pool(self._ctx, max(1, max_idle_per_address), max(1, max_retired),
                           late_grace, max_msg_bytes, keys, float(idle_timeout),
                           max(1, max_addresses), retry)
        self._ids = itertools.count(secrets.randbits(48))
        self._ids_lock = threading.Lock()
        self._closed = False
        self._limiter = _loglimit.LogLimiter(log)  # size-limit lines, per cause
        self._setup()

    def _setup(self) -> None:
        """What a subclass adds to a new client (its own state), called at the end of
        __init__."""

    def _sleeper(self, retry: RetryPolicy) -> Any:
        """How this client waits out a backoff (the policy's sleep, checked for its kind)."""
        return retry.sync_sleep()

    # ---- state ---------------------------------------------------------------------------

    @overload
    def stats(self, address: str) -> Dict[str, Any]: ...

    @overload
    def stats(self, address: None = None) -> Dict[str, Dict[str, Any]]: ...

    def stats(self, address: Optional[str] = None) -> Any:
        """Counters per address, named as the C client names them (ctl_address_stats): calls
        (requests sent expecting a reply), timeouts, late_replies, sockets (open now), retired,
        errors (a dict: calls and notifies that ended in Transfer, by cause: "refused",
        "unresolved", "auth", "too-large", "timeout", "remote", ...); and notifies,
        sockets_opened, sockets_retired (= retired), sockets_closed, sockets_idle. For one
        address a dict (all zero for an address never called); without one, a dict of those
        dicts by address."""
        got = self._pool.stats(address)
        if address is None:
            return got
        return got.get(address, _address_stats(dict.fromkeys(COUNTERS, 0),
                                               dict.fromkeys(errors.CAUSES, 0), 0,
                                               dict.fromkeys(errors.CAUSES, 0)))

    def address_stats(self, address: str) -> Dict[str, Any]:
        """One address's counters, as stats(address) (the C client's
        ctl_client_address_stats): calls, attempts, retries, retries_busy, retries_by_cause,
        retries_throttled, timeouts, errors, ..."""
        return self.stats(address)

    def close(self) -> None:
        """Close every socket (idle ones linger up to 100 ms so queued notifies can leave) and
        the client's own context. Idempotent; must not run while another thread is calling."""
        if self._closed:
            return
        self._closed = True
        self._pool.close()
        if self._own_ctx:
            self._ctx.term()

    # ---- the steps every call shares --------------------------------------------------------

    def _timeout(self, timeout: Optional[float]) -> float:
        if timeout is None:
            return self.timeout
        return seconds("timeout", timeout)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the client is closed")

    def _new_id(self, deadline_wall: float) -> str:
        """A fresh id carrying the call's deadline (`deadline_wall`: seconds since the Unix
        epoch)."""
        with self._ids_lock:
            n = next(self._ids)
        return _wire.format_id(n, math.ceil(deadline_wall * 1000))

    def _lend(self, p: _Pending, op: str, fresh: bool = False) -> None:
        """Lend p a socket (counting an attempt); on failure `p` is done with its error."""
        try:
            p.sock, p.pooled = self._pool.lend(p.address, fresh, attempt=True)
        except zmq.ZMQError as e:
            failure = errors.Transfer(f"cannot make a socket: {e.strerror}; nothing was sent",
                                      cause="transport", address=p.address, op=op)
            failure.unsent = True
            p.error, p.done = failure, True
            return
        p.attempts += 1
        self._attach(p)

    def _result(self, p: _Pending, kinds: Mapping[str, Type[errors.DeclaredError]],
                op: str) -> Any:
        """The result of a finished request, or raise its error (saying how many attempts it
        took when more than one); a Transfer is counted in its address's errors by cause."""
        try:
            return _outcome(p, kinds, op)
        except errors.Error as e:
            if p.attempts > 1:
                e.attempts = p.attempts
                if isinstance(e, errors.Transfer) and e.unsent and p.ever_left:
                    # The last attempt was not sent, but an earlier one was: the call as a
                    # whole may have run, so its message must not say it was not sent.
                    e.unsent = False
                    msg = re.sub(r"nothing was sent|not sent|not queued",
                                 "the last attempt was not sent", e.msg, count=1)
                    e.msg = (f"{msg} (after {p.attempts} attempts; an earlier one was sent: "
                             "the unit may have run it)")
                else:
                    e.msg = f"{e.msg} (after {p.attempts} attempts)"
                e.args = (e.msg,)
            if isinstance(e, errors.Transfer):
                self._pool.count_error(p.address, e.cause)
            raise

    def _too_large(self, address: str, op: str, size: int) -> errors.Transfer:
        e = errors.Transfer(f"the request is {size} bytes, larger than this client's limit of "
                            f"{self.limits.max_msg_bytes} bytes (max_msg_bytes); not sent",
                            cause="too-large", address=address, op=op)
        e.unsent = True
        self._limiter.log("too-large", logging.WARNING, "ctlrpc client: %s", e)
        return e

    def _prepare(self, p: _Pending, op: str, deadline: float) -> Optional[bytes]:
        """Lend a socket for `p` and give it an id; the request to send, or None when `p` is
        done already (with its error: no time, too large, no socket)."""
        self._check_open()
        now = self._now()
        if deadline <= now:  # timeout 0: no time at all, nothing is sent
            e = errors.Timeout("a timeout of 0 leaves no time for a reply; nothing was sent",
                               address=p.address, op=op)
            e.unsent = True
            p.error, p.done = e, True
            return None
        # The deadline goes to the unit on the wall clock (the engine's are monotonic): every
        # attempt of a call carries its one deadline.
        if not p.deadline_wall:
            p.deadline_wall = time.time() + (deadline - now)
        size = len(p.request[0]) + len(p.request[1]) + 1 + _ID_LEN  # the id's str header
        if size > self.limits.max_msg_bytes:
            p.error, p.done = self._too_large(p.address, op, size), True
            return None
        self._lend(p, op)
        if p.done:
            return None
        if not p.id:  # every attempt of a call carries its one id
            p.id = self._new_id(p.deadline_wall)
        head, args = p.request
        return head + _wire.pack(p.id) + args

    def _begin(self, p: _Pending, op: str, deadline: float) -> None:
        """Start an attempt of `p`: lend a socket and hand the request to its connection if
        one is up (else it waits, unsent, for one: _try_send again). On failure `p` is done
        with its error."""
        if p.tries and deadline <= self._now():
            # A retry with no time left: the last attempt's error stands.
            p.retry_at = None
            p.done = p.settled = True
            return
        p.again()
        p.tries += 1
        p.attempt_end = self._attempt_end(p, deadline)
        data = self._prepare(p, op, deadline)
        if data is None:
            return
        p.data, p.unsent = data, True
        self._try_send(p, op)

    def _attempt_end(self, p: _Pending, deadline: float) -> Optional[float]:
        """When the attempt of `p` just begun ends without a reply, if before the deadline:
        an idempotent call with an attempt left after this one, and time for the retry's
        shortest backoff after RetryPolicy.attempt_timeout; else None (the time left)."""
        pol = self.retry
        limit = pol.attempt_timeout
        if not limit or not p.idempotent or p.tries >= max(1, pol.max_attempts):
            return None
        end = self._now() + limit
        if end + pol.base_backoff(p.tries) * (1.0 - pol.jitter) >= deadline:
            return None
        return end

    def _attempts_due(self, live: List[_Pending], op: str, now: float) -> bool:
        """End the attempts of `live` whose own limit has passed, as timeouts the policy may
        retry. Whether any ended."""
        ended = False
        for p in live:
            if p.attempt_end is not None and now >= p.attempt_end and not p.done:
                self._time_out(p, op, _ms(cast(float, self.retry.attempt_timeout)),
                               attempt=True)
                ended = True
        return ended

    def _pass(self, ps: List[_Pending], op: str, deadline: float, now: float,
              begun: Optional[List[_Pending]] = None) -> Tuple[List[_Pending], float]:
        """One pass over the requests of a call, the same for the blocking and the asyncio
        client: settle those done (a retry the policy asks for waits out its backoff), begin
        the attempts whose backoff is over (listed in `begun` when given: their sockets are
        to be looked at), and end a backoff the deadline leaves no time for (its last error
        stands). Returns the requests waiting for a reply, and when the soonest backoff ends
        (inf: none)."""
        live: List[_Pending] = []
        backoff = math.inf
        for p in ps:
            if p.retry_at is not None and not p.done:
                if now >= deadline:  # no time left for it: its last error stands
                    p.retry_at = None
                    p.done = p.settled = True
                    continue
                if p.retry_at > now:
                    backoff = min(backoff, p.retry_at)
                    continue
                self._begin(p, op, deadline)
                if begun is not None:
                    begun.append(p)
            if p.done:
                if not p.settled:
                    self._settle(p, op, deadline)
                    if not p.done:
                        backoff = min(backoff, cast(float, p.retry_at))
                continue
            live.append(p)
        return live, backoff

    def _expire(self, ps: List[_Pending], live: List[_Pending], op: str,
                timeout_ms: int) -> None:
        """The call's deadline has come: whoever still waits for a reply times out, and a
        request waiting out a backoff keeps its last error."""
        for p in live:
            self._time_out(p, op, timeout_ms)
        for p in ps:
            if p.retry_at is not None and not p.done:
                p.retry_at = None
                p.done = p.settled = True

    def _check_all(self, live: List[_Pending], op: str) -> None:
        """Every 100 ms of waiting: send what can go now, and read the monitors of those that
        wait (the fail-fast causes)."""
        for p in live:
            if p.unsent:
                self._try_send(p, op)
            if not p.done:
                self._check(p, op)

    @staticmethod
    def _soonest(live: List[_Pending], until: float) -> float:
        """`until`, or the soonest attempt limit of `live` before it."""
        for p in live:
            if p.attempt_end is not None and p.attempt_end < until:
                until = p.attempt_end
        return until

    def _try_send(self, p: _Pending, op: str) -> bool:
        """Hand p's unsent request to its socket without waiting. The sockets are
        ZMQ_IMMEDIATE: it goes only to a connection that is up, and one that finds none is
        never queued. A pooled socket that finds none has lost its connection since it was
        last used: the request goes on a fresh socket (the transparent retry; nothing had
        left). Returns whether `p` has left (or is done)."""
        while p.unsent and not p.done:
            assert p.sock is not None and p.data is not None
            if p.pooled and self.retry.transparent and not self._pool.connected(p.sock):
                # Its connection dropped since its last use: a message handed to it now
                # would go nowhere (the pipe of a dead connection), so it goes on a fresh one.
                self._swap(p, op)
                continue
            try:
                _send_frame(p.sock, p.data)
                self._pool.sent(p.sock)
            except zmq.Again:
                # Up, but its queue is full (notifies a unit does not read): it waits.
                if not (p.pooled and self.retry.transparent) or self._pool.connected(p.sock):
                    return False
                self._swap(p, op)
                continue
            except zmq.ZMQError as e:
                if e.errno == errno.EINTR:
                    continue
                failure = errors.Transfer(f"send failed: {e.strerror}; nothing was sent",
                                          cause="transport", address=p.address, op=op)
                failure.unsent = True
                p.error = failure
                self._finish(p, False)
                return True
            p.unsent, p.data, p.ever_left = False, None, True
            self._pool.count(p.address, "calls")
        return True

    def _swap(self, p: _Pending, op: str) -> None:
        """The transparent retry: p's pooled socket has lost its connection and nothing of
        p's request left on it; p goes on a fresh socket (an attempt, and a retry, of its
        own; not one of the policy's max_attempts, nor of its budget)."""
        assert p.sock is not None
        self._release(p)
        self._pool.retire(p.address, p.sock)  # nothing was queued on it
        p.sock = None
        self._pool.count_retry(p.address, "")
        self._lend(p, op, fresh=True)

    def _retry_cause(self, p: _Pending, op: str) -> Optional[str]:
        """What a failed attempt of `p` is, to the retry policy: "busy", a cause ("refused",
        "timeout", "transport"), or None (never retried)."""
        pol = self.retry
        e = p.error
        if e is None:
            if p.ok or not pol.retry_busy:
                return None
            err = _wire.error_from_body(p.result, p.address, op, _NO_KINDS)
            if isinstance(err, errors.Busy) and err.reason != "draining":
                return "busy"
            return None
        if not isinstance(e, errors.Transfer):
            return None
        if e.unsent:
            # Nothing left: safe for any op. A timeout before a connection came up leaves no
            # time for another attempt; the other causes (unresolved, auth) would fail again.
            if e.cause == "refused":
                return "refused"
            # Cut short by its own limit before a connection came up: time is left.
            return "timeout" if e.cause == "timeout" and p.attempt_end is not None else None
        # It left (it may have run): a timeout, a connection lost mid-call (its reconnect
        # refused, or a transport failure) only for an idempotent call.
        if p.idempotent and e.cause in ("timeout", "transport", "refused"):
            return e.cause
        return None

    def _settle(self, p: _Pending, op: str, deadline: float) -> None:
        """Judge a finished attempt of `p` by the retry policy: it stays done, or waits for a
        retry (p.retry_at, not done). Counts the budget and the retries."""
        p.settled = True
        if p.ok:
            self._pool.budget_credit(p.address)
            return
        cause = self._retry_cause(p, op)
        if cause is None:
            return
        allowed = self._pool.budget_debit(p.address)
        pol = self.retry
        if p.tries >= max(1, pol.max_attempts):
            return
        d = pol.backoff(p.tries)
        now = self._now()
        if now + d >= deadline:  # the retry could not end in time: the last error stands
            return
        if not allowed:
            self._pool.count(p.address, "retries_throttled")
            return
        self._pool.count_retry(p.address, cause)
        p.retry_at = now + d
        p.done = False

    def _abandon(self, ps: Sequence[_Pending], failure: errors.Error) -> None:
        """End every unfinished request of `ps` with `failure`, their sockets retired (a
        batch interrupted by an exception, or cancelled)."""
        for p in ps:
            if not p.done:
                p.error = failure
                p.retry_at = None
                self._finish(p, False)
            p.settled = True  # final: never retried

    def _attach(self, p: _Pending) -> None:
        """Called when p is lent a socket: a subclass sets up its waiting on it here."""

    def _release(self, p: _Pending) -> None:
        """Called before p's socket leaves the call (given back or retired): what a subclass
        set up to wait on it is undone here."""

    def _notify_prepare(self, address: str, op: str,
                        args: Optional[Mapping[str, Any]]) -> Tuple[zmq.Socket[Any], bytes]:
        """A socket and the payload of a notify (checked, not too large). A pooled socket
        whose connection has gone is swapped for a fresh one (the transparent retry)."""
        net.dialable(address)
        head, packed_args = _request(address, op, args)
        payload = head + _wire.pack("") + packed_args
        self._check_open()
        if len(payload) > self.limits.max_msg_bytes:
            e = self._too_large(address, op, len(payload))
            self._pool.count_error(address, e.cause)
            raise e
        try:
            # Each try at sending counts in `attempts`, as in the C client.
            sock, pooled = self._pool.lend(address, attempt=True)
            if pooled and self.retry.transparent and not self._pool.connected(sock):
                self._pool.retire(address, sock)  # its connection has gone: nothing queued
                sock, _ = self._pool.lend(address, fresh=True, attempt=True)
        except zmq.ZMQError as e:
            raise errors.Transfer(f"cannot make a socket: {e.strerror}; nothing was sent",
                                  cause="transport", address=address, op=op) from None
        return sock, payload

    def _notify_sent(self, address: str, sock: zmq.Socket[Any],
                     failure: Optional[errors.Transfer]) -> None:
        """A notify was queued (the socket goes back), or could not be (it is retired and
        `failure` is raised)."""
        if failure is not None:
            self._pool.retire(address, sock)
            self._pool.count_error(address, failure.cause)
            raise failure
        self._pool.count(address, "notifies")
        self._pool.give_back(address, sock)

    def _finish(self, p: _Pending, clean: bool) -> None:
        """End `p`: its socket goes back only after a clean, matching reply."""
        p.unsent, p.data = False, None  # a request never sent is dropped with its socket
        if p.sock is not None:
            self._release(p)
            if clean and not p.dirty:
                self._pool.give_back(p.address, p.sock)
            else:
                self._pool.retire(p.address, p.sock)
            p.sock = None
        p.done = True

    def _recv_one(self, p: _Pending, op: str, ask: bool = True) -> bool:
        """Receive one message on p.sock without waiting and judge it. Ends `p` when its own
        reply came (result or error) or the socket failed; a reply for another id is counted
        and skipped. Returns False when nothing was there. `ask`: ask the socket first, when
        nothing is the likelier (without, a receive that finds nothing costs more)."""
        assert p.sock is not None
        try:
            # Asking first is cheaper than the zmq.Again a receive would raise (pyzmq builds
            # its message with an import and a strerror each time).
            sock = p.sock
            if ask and not cast(int, sock.getsockopt(ZMQ_EVENTS)) & ZMQ_POLLIN:
                return False
            data = sock.recv(ZMQ_NOBLOCK)
            frames = 1
            while sock.getsockopt(ZMQ_RCVMORE):
                sock.recv()
                frames += 1
        except zmq.Again:
            return False
        except zmq.ZMQError as e:
            p.error = errors.Transfer(f"receive failed: {e.strerror}", cause="transport",
                                      address=p.address, op=op)
            self._finish(p, False)
            return True
        if frames != 1:
            p.error = errors.Transfer("reply has more than one frame", cause="bad-reply",
                                      address=p.address, op=op)
            self._finish(p, False)
            return True
        try:
            reply = _wire.decode_reply(data, self.limits)
        except _wire.BadReply as e:
            p.error = errors.Transfer(f"bad reply: {e.why}", cause="bad-reply",
                                      address=p.address, op=op)
            self._finish(p, False)
            return True
        if reply.id != p.id:
            # A reply to something else: an earlier notify the unit answered, or a peer that
            # mixes ids up.
            self._pool.count(p.address, "late_replies")
            p.dirty = True
            return True
        p.ok, p.result = reply.ok, reply.body
        self._finish(p, True)  # its own reply, result or error: the socket is clean
        return True

    def _conn_failure(self, sock: zmq.Socket[Any], address: str, op: str,
                      unsent: bool, may_run_twice: bool = False) -> Optional[errors.Transfer]:
        """What the monitor of a lent socket says, as the error that ends its call, or None
        (the C client's messages, docs/API.md "Failures that end a call early"). A request
        that never left says "nothing was sent" (it never will: ZMQ_IMMEDIATE); one that
        left and then lost its connection is a transport failure: it may have run."""
        verdict, value = self._pool.check(sock)
        if not verdict:
            return None
        curve = self._pool.keys is not None
        cause = "auth"
        if verdict == "lost":
            # The unit restarted in place under the request: no reply will come, unless the
            # drop came before the send (its events unread then). Only a call that may run
            # twice and has an attempt left acts on it (`may_run_twice`), as in C.
            if not may_run_twice or unsent:
                return None
            cause, msg = "transport", "the connection dropped and came back (the unit restarted?)"
        elif verdict == "refused":
            cause, msg = "refused", "connection refused (nothing listens there?)"
        elif verdict == "capped":
            cause, msg = "refused", ("the unit refused the connection: it holds as many as it "
                                     "allows (max_connections or max_connections_per_address; "
                                     "ZAP status 500): retry later or elsewhere")
        elif verdict == "unresolved":
            host = net.parse_endpoint(address).host
            if _literal(host):
                cause, msg = "transport", ("cannot open a connection (out of file "
                                           "descriptors?)")
            else:
                cause, msg = "unresolved", f"host '{host}' does not resolve"
        elif verdict == "handshake":
            msg = ("authentication failed: the unit did not accept this client's CURVE "
                   "handshake (wrong server key, or this client is not on its allowlist; or "
                   "the unit does not speak CURVE)" if curve else
                   "authentication failed: the unit broke off the handshake (it speaks CURVE? "
                   "this client has no server key, curve_server_key)")
        elif verdict == "denied" and value == 500:  # a cap of the unit's, as the C client
            cause, msg = "refused", ("the unit refused the connection: it holds as many as it "
                                     "allows (max_connections or max_connections_per_address; "
                                     "ZAP status 500): retry later or elsewhere")
        elif verdict == "denied":
            msg = ("authentication failed: the unit refused this client's CURVE key (not on "
                   f"its allowlist; ZAP status {value})")
        elif verdict == "mechanism":
            msg = ("authentication failed: this client speaks CURVE (curve_server_key is set) "
                   "and the unit does not speak CURVE" if curve else
                   "authentication failed: the unit speaks CURVE and this client has no "
                   "server key (curve_server_key)")
        elif verdict == "protocol":
            cause, msg = "transport", f"the ZeroMQ handshake failed (protocol error 0x{value:08x})"
        else:  # dropped
            cause = "too-large"
            msg = (f"reply dropped: larger than this client's limit of "
                   f"{self.limits.max_msg_bytes} bytes (max_msg_bytes), so ZeroMQ closed the "
                   "connection")
            self._limiter.log("too-large", logging.WARNING, "ctlrpc client: %s at %s: %s", op,
                              address, msg)
        if unsent:
            e = errors.Transfer(f"{msg}; nothing was sent", cause=cause, address=address,
                                op=op)
            e.unsent = True
            return e
        if cause != "too-large":
            # It was sent on a connection that was up, which has gone since (what its
            # reconnects meet is the cause, as in the C client): the op may have run.
            msg = f"{msg}; the request was sent before the connection was lost: it may have run"
        return errors.Transfer(msg, cause=cause, address=address, op=op)

    def _check(self, p: _Pending, op: str) -> None:
        """Read the monitor of p's socket; end `p` when what it says means no reply can come
        (or, for a request still unsent, that no connection will come up)."""
        assert p.sock is not None
        pol = self.retry
        failure = self._conn_failure(p.sock, p.address, op, p.unsent,
                                     p.idempotent and p.tries < max(1, pol.max_attempts))
        if failure is not None:
            p.error = failure
            self._finish(p, False)

    def _time_out(self, p: _Pending, op: str, timeout_ms: int, attempt: bool = False) -> None:
        """End p's attempt as a timeout: at the call's deadline, or (`attempt`) at the
        attempt's own limit, RetryPolicy.attempt_timeout."""
        within = (f"this attempt's {timeout_ms} ms (attempt_timeout)" if attempt
                  else f"{timeout_ms} ms")
        if p.unsent:
            e = errors.Timeout(f"no connection to the unit within {within}; nothing was sent",
                               address=p.address, op=op)
            e.unsent = True
            p.error = e
        else:
            p.error = errors.Timeout(f"no reply within {within}", address=p.address, op=op)
        self._finish(p, False)


class Client(_Engine):
    """Calls units, blocking the calling thread: `call`, `call_many`, `notify`. See the
    module's docstring for the rules, and _Engine for the options.
    """

    # ---- the calls -----------------------------------------------------------------------

    def call(self, address: str, op: str, args: Optional[Mapping[str, Any]] = None,
             timeout: Optional[float] = None, *,
             kinds: Mapping[str, Type[errors.DeclaredError]] = _NO_KINDS,
             idempotent: bool = False) -> Any:
        """Call `op` at `address` with the named `args`; return the decoded result.

        Raises an errors.Error: UnitFull, Busy, Missing, a class of `kinds` (the declared
        kinds this op lists, by name) for the unit's error replies; Transfer for a Protocol
        error or a kind not in `kinds` (cause "remote"), a bad reply or a transport failure;
        Timeout when no complete reply came within `timeout` seconds (default: the client's).
        ValueError for an address that is not tcp://host:port, TypeError for args msgpack
        cannot pack. `idempotent`: the op may run twice, so the client's retry policy may
        send it again after a timeout or a lost connection (RetryPolicy).
        """
        tmo = self._timeout(timeout)
        deadline = self._now() + tmo
        p = _Pending(net.dialable(address), _request(address, op, args), idempotent)
        self._drive([p], op, deadline, _ms(tmo))
        return self._result(p, kinds, op)

    def call_many(self, op: str, targets: Sequence[Tuple[str, Optional[Mapping[str, Any]]]],
                  timeout: Optional[float] = None, *,
                  kinds: Mapping[str, Type[errors.DeclaredError]] = _NO_KINDS,
                  idempotent: bool = False) -> List[Outcome]:
        """Call `op` at every (address, args) of `targets` under one deadline for the batch.

        Every request goes out before any reply is read (a request whose connection is not up
        yet goes when it is). Returns one Outcome per target, in order: its result, or the
        error its call raised (as `call` would raise it); one unit's failure, slowness or
        death does not affect the others, and each target is retried on its own (the
        client's RetryPolicy, within the batch's deadline). The same address may appear
        twice: each entry is its own request. ValueError / TypeError as for `call`, before
        anything is sent.
        """
        tmo = self._timeout(timeout)
        deadline = self._now() + tmo
        ps = _pending_of(op, targets, idempotent)
        self._drive(ps, op, deadline, _ms(tmo))
        out = []
        for p in ps:
            try:
                out.append(Outcome(p.address, True, self._result(p, kinds, op), None))
            except errors.Error as e:
                out.append(Outcome(p.address, False, None, e))
        return out

    def notify(self, address: str, op: str, args: Optional[Mapping[str, Any]] = None) -> None:
        """Send `[op, "", args]` to a notify op; return once it is handed to a connection
        that is up (waiting for one, and for queue space, no longer than the client's
        timeout). Units send nothing back for notify ops, and a notify is never retried.
        Raises Transfer/Timeout when it cannot be sent, saying "nothing was sent" (the
        connection refused, the host unresolved, the handshake failed, no connection in
        time); ValueError / TypeError as `call`."""
        sock, payload = self._notify_prepare(address, op, args)
        failure: Optional[errors.Transfer] = None
        try:
            self._send_notify(sock, payload, self._now() + self.timeout, address, op)
        except errors.Transfer as e:
            failure = e
        self._notify_sent(address, sock, failure)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- waiting, blocking -------------------------------------------------------------

    def _send_notify(self, sock: zmq.Socket[Any], data: bytes, deadline: float, address: str,
                     op: str) -> None:
        """Send one frame once a connection is up and has queue space, until `deadline`,
        reading the socket's monitor every 100 ms of waiting."""
        while True:
            try:
                _send_frame(sock, data)
                return
            except zmq.Again:
                pass
            except zmq.ZMQError as e:
                if e.errno == errno.EINTR:
                    continue
                raise errors.Transfer(f"send failed: {e.strerror}; nothing was sent",
                                      cause="transport", address=address, op=op) from None
            failure = self._conn_failure(sock, address, op, True)
            if failure is not None:
                raise failure
            left = deadline - self._now()
            if left <= 0:
                raise errors.Timeout(f"no connection to the unit (or no queue space) within "
                                     f"{_ms(self.timeout)} ms; nothing was sent",
                                     address=address, op=op)
            try:
                zmq.zmq_poll([(sock, zmq.POLLOUT)], _ms(min(left, CHECK_S)))
            except zmq.ZMQError as e:
                if e.errno != errno.EINTR:
                    raise errors.Transfer(f"poll failed: {e.strerror}; nothing was sent",
                                          cause="transport", address=address, op=op) from None

    def _drive(self, ps: List[_Pending], op: str, deadline: float, timeout_ms: int) -> None:
        """Run every request of `ps` to its end, retries included, within the one `deadline`.
        However it ends (KeyboardInterrupt too), no socket stays lent."""
        try:
            for p in ps:
                self._begin(p, op, deadline)
            self._wait(ps, op, deadline, timeout_ms)
        except BaseException:  # KeyboardInterrupt, say: no socket stays lent
            self._abandon(ps, errors.Transfer("interrupted", cause="transport", op=op))
            raise

    def _wait(self, ps: List[_Pending], op: str, deadline: float, timeout_ms: int) -> None:
        """Wait until every request of `ps` is done: send those whose connection comes up,
        read replies, read the monitors of those waiting every 100 ms, time out those still
        waiting at `deadline`, and start the retries the policy asks for when their backoff
        is over."""
        checked = self._now()
        while True:
            now = self._now()
            live, backoff = self._pass(ps, op, deadline, now)
            if not live and backoff == math.inf:
                return
            left = deadline - now
            if left <= 0:
                self._expire(ps, live, op, timeout_ms)
                continue
            if not live:  # only backoffs to wait out: the policy's sleep
                self._retry_sleep(max(0.0, min(backoff, deadline) - self._now()))
                continue
            if self._attempts_due(live, op, now):
                continue  # settled (and maybe retried) at the top
            if now - checked >= CHECK_S:
                checked = now
                self._check_all(live, op)
                continue
            wait = min(left, CHECK_S - (now - checked), backoff - now,
                       self._soonest(live, math.inf) - now)
            items = [(p.sock, zmq.POLLOUT if p.unsent else zmq.POLLIN) for p in live]
            try:
                # zmq_poll itself: a Poller would be built for every wait.
                events = zmq.zmq_poll(items, _ms(max(0.0, wait)))
            except zmq.ZMQError as e:
                if e.errno == errno.EINTR:
                    continue
                raise errors.Transfer(f"poll failed: {e.strerror}", cause="transport",
                                      op=op) from None
            if not events:
                continue
            by_sock = {id(p.sock): p for p in live}
            for sock, _ in events:
                p = by_sock[id(sock)]
                if p.unsent:
                    self._try_send(p, op)
                else:
                    while not p.done and self._recv_one(p, op):
                        pass


def _pending_of(op: str, targets: Any, idempotent: bool) -> List[_Pending]:
    """A fan-out's requests, one per (address, args) of `targets`; TypeError naming the target
    that is not such a pair (ValueError / TypeError from _request for its address or args)."""
    if isinstance(targets, (str, bytes)) or not hasattr(targets, "__iter__"):
        raise TypeError(f"call_many {op}: targets must be a sequence of (address, args) "
                        f"pairs, not {type(targets).__name__}")
    ps = []
    for i, t in enumerate(targets):
        if not isinstance(t, (tuple, list)) or len(t) != 2:
            raise TypeError(f"call_many {op}: target #{i} is not an (address, args) pair: "
                            f"{t!r:.60}")
        ps.append(_Pending(net.dialable(t[0]), _request(t[0], op, t[1]), idempotent))
    return ps


def _request(address: str, op: str, args: Optional[Mapping[str, Any]]) -> Tuple[bytes, bytes]:
    """`[op, id, args]` packed once, as the bytes before the id and the bytes after it (the id
    is packed between them when the request is sent)."""
    if not isinstance(op, str) or not op:
        raise ValueError(f"call at {address}: op must be a non-empty string, not {op!r}")
    if args is not None and type(args) is not dict and not isinstance(args, Mapping):
        raise TypeError(f"{op} at {address}: args must be a mapping, not "
                        f"{type(args).__name__}")
    try:
        # A dict packs as it is (the fast path: the generated clients' args maps); any other
        # mapping as a dict of its items.
        packed_args = _wire.pack({} if args is None else
                                 args if type(args) is dict else dict(args))
    except (TypeError, ValueError, OverflowError) as e:
        raise TypeError(f"{op} at {address}: args cannot be packed: {e}") from None
    return b"\x93" + _wire.pack(op), packed_args


def _literal(host: str) -> bool:
    """Whether a host is an IP address (which needs no resolving)."""
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


_ZERO_COPY_MIN = 32 << 10


def _send_frame(sock: "zmq.Socket[Any]", data: bytes) -> None:
    """Send `data` as one message without blocking (zmq.Again when it cannot go now). Small
    ones are copied: a zero-copy Frame costs more than the copy below 32 KiB (as the server
    decides for its replies); larger ones are lent to ZeroMQ, which frees them once sent."""
    if len(data) < _ZERO_COPY_MIN:
        sock.send(data, ZMQ_NOBLOCK)
    else:
        _threads.zero_copy_ready()
        sock.send(data, ZMQ_NOBLOCK, copy=False)


def _ms(seconds: float) -> int:
    """Seconds as whole milliseconds, rounded up (a wait never ends before its deadline)."""
    return max(0, math.ceil(seconds * 1000))


def _outcome(p: _Pending, kinds: Mapping[str, Type[errors.DeclaredError]], op: str) -> Any:
    """The result of a finished request, or raise its error."""
    if p.error is not None:
        raise p.error
    if not p.ok:
        raise _wire.error_from_body(p.result, p.address, op, kinds)
    return p.result
