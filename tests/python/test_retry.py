"""The Python client's failure semantics: nothing runs that was reported not sent, and retries.

- NeverSent: a call (and a notify) to a port where nothing listens fails "refused ... nothing
  was sent"; a unit started on that port at once, within the client's late grace, never runs
  it (waited out by the client's own counters: its retired socket closed). The same promise
  for timeout 0, a request too large and a failed CURVE handshake. `calls` counts requests
  that left, `attempts` every try.
- Policy (blocking client, a clock and sleep of the test's: backoffs take no real time and
  are recorded): Busy retried with retry_busy, with the backoff schedule and "(after N
  attempts)"; "draining" never; no retry_busy, no retry; UnitFull, Missing, Protocol and a
  declared kind never; refused retried for any op; a backoff that would pass the deadline is
  not started; a connection lost after the request left retried only when idempotent; the
  per-address budget throttles; the transparent retry of a pooled socket whose connection has
  gone (and transparent=False); call_many retries each target on its own; a notify never;
  every attempt's id carries the call's one deadline.
- Aio: the same rules through ctlrpc.aio.Client (the transparent retry too); cancelling
  during a backoff raises CancelledError and leaves nothing behind; notifies sent before the
  connection is up, in order before a call.
- RetryPolicy: validation, backoff and jitter bounds; the generated clients pass retry on.
"""

import asyncio
import gc
import sys
import threading
import time
import unittest
import warnings
from unittest import mock

import msgpack
import zmq

import ctlrpc
import ctlrpc.client
import support

CALL_S = 10.0


class FakeTime:
    """A clock that runs with real time plus whatever the client slept: a backoff is recorded
    and takes no real time, and the deadline sees it."""

    def __init__(self):
        self.offset = 0.0
        self.sleeps = []

    def clock(self):
        return time.monotonic() + self.offset

    def sleep(self, d):
        self.sleeps.append(round(d, 9))
        self.offset += d

    async def asleep(self, d):
        self.sleeps.append(round(d, 9))
        self.offset += d
        await asyncio.sleep(0)

    def policy(self, aio=False, **kw):
        kw.setdefault("rng", lambda: 0.5)  # the jitter's midpoint: no change
        return ctlrpc.RetryPolicy(clock=self.clock, sleep=self.asleep if aio else self.sleep,
                                  **kw)


class NotFound(ctlrpc.DeclaredError):
    kind = "NotFound"


class Unit:
    """A Python unit whose ops count their runs; `busy` answers Busy (reason `reason`) until
    it has run `n` times for the key `k`."""

    def __init__(self, bind="tcp://127.0.0.1:0"):
        self.lock = threading.Lock()
        self.runs = {}
        self.seen = {}
        self.server = ctlrpc.Server(
            {"target": self.op("target", lambda a: "ran"),
             "probe": self.op("probe", lambda a: "here"),
             "busy": self.op("busy", self.busy),
             "full": self.op("full", lambda a: self.fail(ctlrpc.UnitFull("no room"))),
             "missing": self.op("missing", lambda a: self.fail(ctlrpc.Missing("gone",
                                                                             blobs=["k"]))),
             "protocol": self.op("protocol", lambda a: self.fail(ctlrpc.Error("bad"))),
             "declared": self.op("declared", lambda a: self.fail(NotFound("no such"))),
             "note": self.op("note", lambda a: None)},
            bind, notify=("note",))
        self.address = self.server.endpoint

    def op(self, name, fn):
        def run(args):
            with self.lock:
                self.runs[name] = self.runs.get(name, 0) + 1
            return fn(args)
        return run

    @staticmethod
    def fail(e):
        raise e

    def busy(self, args):
        k = args.get("k", "")
        with self.lock:
            self.seen[k] = self.seen.get(k, 0) + 1
            n = self.seen[k]
        if n < args.get("n", 1 << 30):
            raise ctlrpc.Busy("try later", reason=args.get("reason", "pinned"))
        return n

    def count(self, name):
        with self.lock:
            return self.runs.get(name, 0)

    def close(self):
        self.server.close()


class Case(unittest.TestCase):
    def assertSleeps(self, t, want):
        """The backoffs slept: each the policy's draw, less the little time that passed
        between the attempt's end and the sleep."""
        self.assertEqual(len(t.sleeps), len(want), t.sleeps)
        for got, d in zip(t.sleeps, want):
            self.assertTrue(d - 0.25 < got <= d + 1e-9, (t.sleeps, want))


class NeverSent(unittest.TestCase):
    """What a client reports as not sent never reaches a handler, even when a unit starts on
    the address within the client's late grace."""

    GRACE = 3.0  # long past the retired socket's reconnects (at most 1 s apart)

    def wait_closed(self, client, address):
        # The retired socket is closed once its grace is over: from then on nothing of this
        # client can reach the unit.
        support.wait_for(lambda: client.stats(address)["sockets"] == 0,
                         "the retired socket closed", self.GRACE + 15)

    def test_refused_then_a_unit_starts(self):
        address = support.dead_address()
        with ctlrpc.Client(timeout=CALL_S, late_grace=self.GRACE) as c:
            t0 = time.monotonic()
            with self.assertRaises(ctlrpc.Transfer) as cm:
                c.call(address, "target")
            self.assertLess(time.monotonic() - t0, CALL_S / 2)
            e = cm.exception
            self.assertEqual(e.cause, "refused", str(e))
            self.assertIn("nothing was sent", str(e))
            self.assertTrue(e.unsent)
            with self.assertRaises(ctlrpc.Transfer) as cm:
                c.notify(address, "note")
            self.assertEqual(cm.exception.cause, "refused", str(cm.exception))
            self.assertIn("nothing was sent", str(cm.exception))
            support.dead_release(address)
            unit = Unit(address)  # at once: the retired sockets still reconnect
            try:
                with ctlrpc.Client(timeout=CALL_S) as other:
                    self.assertEqual(other.call(address, "probe"), "here")
                st = c.stats(address)
                # Nothing left; two tries at sending (the call's and the notify's).
                self.assertEqual((st["calls"], st["notifies"], st["attempts"]), (0, 0, 2))
                self.assertEqual(st["errors"]["refused"], 2)
                self.wait_closed(c, address)
                self.assertEqual(unit.count("target"), 0)
                self.assertEqual(unit.count("note"), 0)
                # The client works there now, and counts what left.
                self.assertEqual(c.call(address, "target"), "ran")
                self.assertEqual(c.stats(address)["calls"], 1)
            finally:
                unit.close()

    def test_aio_refused_then_a_unit_starts(self):
        address = support.dead_address()

        async def go():
            async with ctlrpc.aio.Client(timeout=CALL_S, late_grace=self.GRACE) as c:
                with self.assertRaises(ctlrpc.Transfer) as cm:
                    await c.call(address, "target")
                self.assertEqual(cm.exception.cause, "refused", str(cm.exception))
                self.assertIn("nothing was sent", str(cm.exception))
                outs = await c.call_many("target", [(address, None)])
                self.assertIn("nothing was sent", str(outs[0].error))
                support.dead_release(address)
                unit = Unit(address)
                try:
                    while c.stats(address)["sockets"]:
                        await asyncio.sleep(0.05)  # the grace is the client's, with a bound
                        self.assertLess(time.monotonic() - t0, self.GRACE + 15)
                    self.assertEqual(unit.count("target"), 0)
                    self.assertEqual(c.stats(address)["calls"], 0)
                    self.assertEqual(await c.call(address, "target"), "ran")
                finally:
                    unit.close()
        t0 = time.monotonic()
        run(go)

    def test_too_large_logged_once_a_second(self):
        """A burst of requests over max_msg_bytes is logged once; the next line, a second
        later at the earliest, says how many were left out (the C client's limiter)."""
        with ctlrpc.Client(timeout=CALL_S, max_msg_bytes=1000) as c:
            with self.assertLogs("ctlrpc", level="WARNING") as logs:
                for _ in range(5):
                    with self.assertRaises(ctlrpc.Transfer):
                        c.call("tcp://127.0.0.1:9", "target", {"x": "y" * 2000})
                self.assertEqual(len(logs.output), 1)
                self.assertIn("larger than this client's limit of 1000 bytes", logs.output[0])
                deadline = time.monotonic() + 3.0
                while len(logs.output) < 2 and time.monotonic() < deadline:
                    with self.assertRaises(ctlrpc.Transfer):
                        c.call("tcp://127.0.0.1:9", "target", {"x": "y" * 2000})
                    time.sleep(0.01)
            self.assertEqual(len(logs.output), 2)
            self.assertRegex(logs.output[1], r"\(\d+ more like this since the last such line\)")

    def test_other_causes_not_sent(self):
        unit = Unit()
        try:
            with ctlrpc.Client(timeout=CALL_S, max_msg_bytes=1000) as c:
                with self.assertRaises(ctlrpc.Timeout) as cm:
                    c.call(unit.address, "target", timeout=0)
                self.assertIn("nothing was sent", str(cm.exception))
                self.assertTrue(cm.exception.unsent)
                with self.assertRaises(ctlrpc.Transfer) as cm:
                    c.call(unit.address, "target", {"x": "y" * 2000})
                self.assertEqual(cm.exception.cause, "too-large")
                self.assertIn("not sent", str(cm.exception))
                self.assertTrue(cm.exception.unsent)
                with self.assertRaises(ctlrpc.Transfer) as cm:
                    c.call("tcp://no-such-host.invalid:4100", "target")
                self.assertEqual(cm.exception.cause, "unresolved")
                self.assertIn("nothing was sent", str(cm.exception))
                self.assertEqual(c.call(unit.address, "probe"), "here")
                self.assertEqual(c.stats(unit.address)["calls"], 1)
            self.assertEqual(unit.count("target"), 0)
        finally:
            unit.close()

    def test_auth_not_sent(self):
        public, secret = ctlrpc.curve.keypair()
        other, _ = ctlrpc.curve.keypair()
        server = ctlrpc.Server({"target": lambda a: "ran"}, "tcp://127.0.0.1:0",
                               curve_secret=secret)
        try:
            with ctlrpc.Client(timeout=CALL_S, curve_server_key=other) as c:
                with self.assertRaises(ctlrpc.Transfer) as cm:
                    c.call(server.endpoint, "target")
                self.assertEqual(cm.exception.cause, "auth", str(cm.exception))
                self.assertIn("nothing was sent", str(cm.exception))
                self.assertEqual(c.stats(server.endpoint)["calls"], 0)
            self.assertEqual(server.stats()["requests"], 0)
        finally:
            server.close()


class Policy(Case):

    @classmethod
    def setUpClass(cls):
        cls.unit = Unit()
        cls.a = cls.unit.address

    @classmethod
    def tearDownClass(cls):
        cls.unit.close()

    def client(self, t, **kw):
        return ctlrpc.Client(timeout=CALL_S, retry=t.policy(**kw))

    def test_busy_retried_with_backoff(self):
        t = FakeTime()
        with self.client(t, max_attempts=4, retry_busy=True, initial_backoff=0.1) as c:
            self.assertEqual(c.call(self.a, "busy", {"k": "b1", "n": 3}), 3)
            self.assertSleeps(t, [0.1, 0.2])
            st = c.address_stats(self.a)
            self.assertEqual(st, c.stats(self.a))
            self.assertEqual((st["attempts"], st["retries"], st["retries_busy"], st["calls"]),
                             (3, 2, 2, 3))
            self.assertEqual(st["retries_throttled"], 0)
            self.assertEqual(set(st["retries_by_cause"]), set(ctlrpc.errors.CAUSES))
            self.assertEqual(sum(st["retries_by_cause"].values()), 0)

    def test_busy_gives_up_after_max_attempts(self):
        t = FakeTime()
        with self.client(t, max_attempts=3, retry_busy=True, initial_backoff=0.1,
                         multiplier=3.0, max_backoff=0.25) as c:
            with self.assertRaises(ctlrpc.Busy) as cm:
                c.call(self.a, "busy", {"k": "b2"})
            self.assertTrue(str(cm.exception).endswith("(after 3 attempts)"), str(cm.exception))
            self.assertEqual(cm.exception.attempts, 3)
            self.assertSleeps(t, [0.1, 0.25])  # 0.3 capped by max_backoff

    def test_draining_and_no_retry_busy(self):
        t = FakeTime()
        with self.client(t, max_attempts=5, retry_busy=True) as c:
            with self.assertRaises(ctlrpc.Busy) as cm:
                c.call(self.a, "busy", {"k": "d", "reason": "draining"})
            self.assertEqual(cm.exception.reason, "draining")
            self.assertNotIn("attempts", str(cm.exception))
        with self.client(t, max_attempts=5) as c:
            with self.assertRaises(ctlrpc.Busy):
                c.call(self.a, "busy", {"k": "nb"})
            self.assertEqual(c.stats(self.a)["retries"], 0)
        self.assertEqual(t.sleeps, [])

    def test_never_retried_kinds(self):
        t = FakeTime()
        with self.client(t, max_attempts=5, retry_busy=True) as c:
            for op, cls in (("full", ctlrpc.UnitFull), ("missing", ctlrpc.Missing),
                            ("protocol", ctlrpc.Transfer), ("declared", NotFound)):
                with self.assertRaises(cls):
                    c.call(self.a, op, kinds={"NotFound": NotFound}, idempotent=True)
            st = c.stats(self.a)
            self.assertEqual((st["attempts"], st["retries"]), (4, 0))
        self.assertEqual(t.sleeps, [])

    def test_refused_retried_for_any_op(self):
        t = FakeTime()
        dead = support.dead_address()
        with self.client(t, max_attempts=3, initial_backoff=0.01) as c:
            with self.assertRaises(ctlrpc.Transfer) as cm:
                c.call(dead, "target")
            self.assertEqual(cm.exception.cause, "refused")
            self.assertTrue(str(cm.exception).endswith("nothing was sent (after 3 attempts)"),
                            str(cm.exception))
            st = c.stats(dead)
            self.assertEqual((st["attempts"], st["retries"], st["calls"]), (3, 2, 0))
            self.assertEqual(st["retries_by_cause"]["refused"], 2)
            self.assertEqual(st["errors"]["refused"], 1)  # one call failed
        self.assertSleeps(t, [0.01, 0.02])

    def test_backoff_past_the_deadline_not_started(self):
        t = FakeTime()
        with self.client(t, max_attempts=10, retry_busy=True, initial_backoff=4.0,
                         max_backoff=100.0) as c:
            with self.assertRaises(ctlrpc.Busy) as cm:
                c.call(self.a, "busy", {"k": "dl"}, timeout=10.0)
            # 4 s fits, then 8 s would end past the 10 s deadline.
            self.assertSleeps(t, [4.0])
            self.assertTrue(str(cm.exception).endswith("(after 2 attempts)"))

    def test_jitter_bounds(self):
        for r, want in ((0.0, 0.08), (0.999999, 0.12)):
            t = FakeTime()
            with self.client(t, max_attempts=2, retry_busy=True, initial_backoff=0.1,
                             rng=lambda r=r: r) as c:
                with self.assertRaises(ctlrpc.Busy):
                    c.call(self.a, "busy", {"k": "j%s" % r})
            self.assertSleeps(t, [want])

    def test_lost_after_sent_only_when_idempotent(self):
        for idempotent in (False, True):
            ctx = zmq.Context.instance()
            router = ctx.socket(zmq.ROUTER)
            address = "tcp://127.0.0.1:%d" % router.bind_to_random_port("tcp://127.0.0.1")
            got = threading.Event()

            def fake():  # takes the request, then goes away without answering
                if router.poll(int(CALL_S * 1000)):
                    router.recv_multipart()
                    got.set()
                router.close(linger=0)
            th = threading.Thread(target=fake)
            th.start()
            t = FakeTime()
            try:
                with self.client(t, max_attempts=3, initial_backoff=0.01) as c:
                    with self.assertRaises(ctlrpc.Transfer) as cm:
                        c.call(address, "target", idempotent=idempotent)
                    st = c.stats(address)
            finally:
                th.join()
            self.assertTrue(got.is_set())
            self.assertEqual(st["calls"], 1)
            # Its reconnects are refused: cause "refused", as the C client says, but sent.
            if idempotent:
                # Sent again; nothing listens any more: refused, then refused again. The
                # first did reach the unit: the call may have run, and its error does not say
                # that nothing was sent.
                self.assertEqual(cm.exception.cause, "refused", str(cm.exception))
                self.assertIn("the last attempt was not sent (after 3 attempts; an earlier one "
                              "was sent: the unit may have run it)", str(cm.exception))
                self.assertNotIn("nothing was sent", str(cm.exception))
                self.assertFalse(cm.exception.unsent)
                self.assertEqual(st["attempts"], 3)
                self.assertEqual(st["retries_by_cause"]["refused"], 2)
            else:
                self.assertEqual(cm.exception.cause, "refused", str(cm.exception))
                self.assertIn("the request was sent before the connection was lost: it may "
                              "have run", str(cm.exception))
                self.assertNotIn("nothing was sent", str(cm.exception))
                self.assertFalse(cm.exception.unsent)
                self.assertEqual((st["attempts"], st["retries"]), (1, 0))

    def test_every_attempt_carries_the_calls_id(self):
        """Every attempt of a retried call carries the call's one id, and so its one deadline,
        as in C (a fake unit answers each Busy and keeps the ids)."""
        ctx = zmq.Context.instance()
        router = ctx.socket(zmq.ROUTER)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        address = "tcp://127.0.0.1:%d" % port
        ids = []

        def fake():
            while len(ids) < 3 and router.poll(int(CALL_S * 1000)):
                peer, data = router.recv_multipart()
                rid = msgpack.unpackb(data, raw=False)[1]
                ids.append(rid)
                router.send_multipart([peer, ctlrpc._wire.pack_error_reply(
                    rid, "Busy", "later", "pinned")])
        th = threading.Thread(target=fake)
        th.start()
        t = FakeTime()
        try:
            with self.client(t, max_attempts=3, retry_busy=True) as c:
                with self.assertRaises(ctlrpc.Busy):
                    c.call(address, "target", timeout=CALL_S)
        finally:
            th.join()
            router.close(linger=0)
        self.assertEqual(len(ids), 3, ids)
        self.assertEqual(len(set(ids)), 1, ids)
        self.assertRegex(ids[0], r"^[0-9a-f]+@[0-9]{13}$")

    def test_restarted_in_place(self):
        """A unit restarted at the same address under a call: the new unit takes the
        connection over and the request died with the old one. An idempotent call with an
        attempt left goes again to the new unit at once (as in C), not at its deadline; any
        other call waits, as the reply could still come."""
        for idempotent in (True, False):
            ctx = zmq.Context()  # its own: term() returns once the port is free again
            router = ctx.socket(zmq.ROUTER)
            port = router.bind_to_random_port("tcp://127.0.0.1")
            address = "tcp://127.0.0.1:%d" % port
            got = {}

            def call():
                try:
                    got["result"] = c.call(address, "target", timeout=CALL_S if idempotent
                                           else 1.5, idempotent=idempotent)
                except ctlrpc.Error as e:
                    got["error"] = e

            unit = None
            with ctlrpc.Client(timeout=CALL_S, retry=ctlrpc.RetryPolicy(max_attempts=3)) as c:
                t0 = time.monotonic()
                th = threading.Thread(target=call)
                th.start()
                try:
                    self.assertTrue(router.poll(int(CALL_S * 1000)))
                    router.recv_multipart()  # and never answered
                    router.close(linger=0)
                    ctx.term()
                    unit = Unit(bind=address)  # at once: before the client's reconnect
                    th.join(CALL_S + 5)
                finally:
                    router.close(linger=0)
                    ctx.term()
                    if unit is not None:
                        unit.close()
                took = time.monotonic() - t0
                st = c.address_stats(address)
            self.assertFalse(th.is_alive())
            if idempotent:
                self.assertEqual(got.get("result"), "ran", got)
                self.assertLess(took, CALL_S / 2)
                self.assertEqual(st["retries_by_cause"].get("transport"), 1, st)
            else:
                self.assertIsInstance(got.get("error"), ctlrpc.Timeout, got)
                self.assertEqual(st["retries"], 0)

    def test_budget_throttles(self):
        t = FakeTime()
        unit = Unit()
        try:
            with self.client(t, max_attempts=10, retry_busy=True, budget_tokens=4,
                             budget_ratio=1.0) as c:
                a = unit.address
                with self.assertRaises(ctlrpc.Busy):
                    c.call(a, "busy", {"k": "t1"})  # 4 -> 3: retry; 3 -> 2: refused
                st = c.stats(a)
                self.assertEqual((st["attempts"], st["retries"], st["retries_throttled"]),
                                 (2, 1, 1))
                c.call(a, "probe")  # a result gives a token back: 3
                with self.assertRaises(ctlrpc.Busy):
                    c.call(a, "busy", {"k": "t2"})  # 3 -> 2: refused at once
                self.assertEqual(c.stats(a)["retries_throttled"], 2)
                self.assertEqual(c.stats(a)["attempts"], 4)
                for _ in range(3):
                    c.call(a, "probe")  # back to 4, no more (capped)
                with self.assertRaises(ctlrpc.Busy):
                    c.call(a, "busy", {"k": "t3"})
                st = c.stats(a)
                self.assertEqual((st["attempts"], st["retries"], st["retries_throttled"]),
                                 (9, 2, 3))
        finally:
            unit.close()

    def test_transparent_retry_of_a_dropped_pooled_socket(self):
        for transparent in (True, False):
            unit = Unit()
            a = unit.address
            t = FakeTime()
            c = self.client(t, transparent=transparent)
            try:
                # The pool is left alone meanwhile: neither the janitor nor a lend closes the
                # idle socket whose unit has gone.
                ctlrpc.client._JANITOR.remove(c._pool)
                with mock.patch.object(ctlrpc.client, "IDLE_DRAIN_S", 1e9):
                    self.assertEqual(c.call(a, "probe"), "here")
                    unit.close()
                    sock = c._pool.entries[a].idle[0][0]
                    support.wait_for(lambda: not c._pool.connected(sock),
                                     "the pooled connection seen dropped", CALL_S)
                    with self.assertRaises(ctlrpc.Transfer) as cm:
                        c.call(a, "probe")
                st = c.stats(a)
                if transparent:  # a fresh socket, refused: nothing was sent either time
                    self.assertEqual(cm.exception.cause, "refused", str(cm.exception))
                    self.assertEqual((st["attempts"], st["retries"]), (3, 1))
                    self.assertEqual(sum(st["retries_by_cause"].values()), 0)  # retries alone
                    self.assertTrue(str(cm.exception).endswith("nothing was sent (after 2 "
                                                               "attempts)"))
                    self.assertEqual(st["calls"], 1)
                else:
                    # On the dead socket: handed to the pipe of the dropped connection (lost,
                    # "it may have run"), or found no connection (not sent): refused either way.
                    self.assertEqual(cm.exception.cause, "refused", str(cm.exception))
                    self.assertEqual((st["attempts"], st["retries"]), (2, 0))
            finally:
                c.close()

    def test_call_many_each_target_on_its_own(self):
        t = FakeTime()
        dead = support.dead_address()
        with self.client(t, max_attempts=3, retry_busy=True, initial_backoff=0.05) as c:
            outs = c.call_many("busy", [(self.a, {"k": "m1", "n": 2}),
                                        (self.a, {"k": "m2", "n": 1}), (dead, None)])
            self.assertEqual([o.ok for o in outs], [True, True, False])
            self.assertEqual((outs[0].result, outs[1].result), (2, 1))
            self.assertEqual(outs[2].error.cause, "refused")
            self.assertTrue(str(outs[2].error).endswith("(after 3 attempts)"))
            self.assertEqual(c.stats(self.a)["retries_busy"], 1)
            self.assertEqual(c.stats(dead)["retries_by_cause"]["refused"], 2)

    def test_notify_never_retried(self):
        t = FakeTime()
        dead = support.dead_address()
        with self.client(t, max_attempts=5) as c:
            with self.assertRaises(ctlrpc.Transfer) as cm:
                c.notify(dead, "note")
            self.assertEqual(cm.exception.cause, "refused")
            self.assertNotIn("attempts", str(cm.exception))
            self.assertEqual(c.stats(dead)["retries"], 0)
        self.assertEqual(t.sleeps, [])


def run(coro_fn):
    """Run `coro_fn()` on a fresh loop in debug mode with warnings as errors; fail on anything
    the loop's exception handler is given."""
    reported = []

    async def main():
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: reported.append(ctx))
        return await coro_fn()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = asyncio.run(main(), debug=True)
        gc.collect()
    if reported:
        raise AssertionError("the loop reported: %r" % reported)
    return result


def readers(loop):
    return len(loop._selector.get_map())


class SlowFirst:
    """A Python unit whose op `slow` sleeps 0.3 s on its first run and answers its run's
    number; the server runs one request at a time, so a retry's request waits behind it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.runs = 0
        self.server = ctlrpc.Server({"slow": self.slow}, "tcp://127.0.0.1:0")
        self.address = self.server.endpoint

    def slow(self, args):
        with self.lock:
            self.runs += 1
            n = self.runs
        if n == 1:
            time.sleep(0.3)
        return n

    def close(self):
        self.server.close()


class AttemptTimeout(Case):
    """RetryPolicy.attempt_timeout: an attempt of an idempotent call with a retry after it
    ends as a timeout after that long and is retried within the call's deadline; any other
    call, and the last attempt, waits for the time left."""

    def setUp(self):
        self.unit = SlowFirst()
        self.addCleanup(self.unit.close)

    def policy(self, **kw):
        kw.setdefault("jitter", 0)
        kw.setdefault("initial_backoff", 0.002)
        return ctlrpc.RetryPolicy(max_attempts=2, attempt_timeout=0.05, **kw)

    def check(self, c, result, attempts):
        st = c.address_stats(self.unit.address)
        self.assertEqual((result, st["attempts"]), (attempts, attempts))
        self.assertEqual(st["retries_by_cause"]["timeout"], attempts - 1)
        # The call did not time out, an attempt did: timeouts count calls (errors["timeout"]).
        self.assertEqual((st["timeouts"], st["errors"].get("timeout", 0)), (0, 0))

    def test_idempotent_attempt_cut_and_retried(self):
        with ctlrpc.Client(timeout=CALL_S, retry=self.policy(), late_grace=5.0) as c:
            self.check(c, c.call(self.unit.address, "slow", idempotent=True), 2)

    def test_other_calls_wait_the_time_left(self):
        with ctlrpc.Client(timeout=CALL_S, retry=self.policy()) as c:
            self.check(c, c.call(self.unit.address, "slow"), 1)

    def test_no_cut_without_time_for_the_retry(self):
        pol = self.policy(initial_backoff=5.0, max_backoff=5.0)
        with ctlrpc.Client(timeout=1.0, retry=pol) as c:
            self.check(c, c.call(self.unit.address, "slow", idempotent=True), 1)

    def test_aio(self):
        async def go():
            async with ctlrpc.aio.Client(timeout=CALL_S, retry=self.policy(),
                                         late_grace=5.0) as c:
                self.check(c, await c.call(self.unit.address, "slow", idempotent=True), 2)
        run(go)

    def test_validation(self):
        for bad in (-1, float("nan"), "1", True):
            with self.assertRaises(ValueError) as cm:
                ctlrpc.RetryPolicy(attempt_timeout=bad)
            self.assertIn("attempt_timeout", str(cm.exception))


class Aio(Case):

    @classmethod
    def setUpClass(cls):
        cls.unit = Unit()
        cls.a = cls.unit.address

    @classmethod
    def tearDownClass(cls):
        cls.unit.close()

    def test_busy_and_refused(self):
        t = FakeTime()
        dead = support.dead_address()

        async def go():
            pol = t.policy(aio=True, max_attempts=3, retry_busy=True, initial_backoff=0.1)
            async with ctlrpc.aio.Client(timeout=CALL_S, retry=pol) as c:
                self.assertEqual(await c.call(self.a, "busy", {"k": "a1", "n": 3}), 3)
                self.assertSleeps(t, [0.1, 0.2])
                with self.assertRaises(ctlrpc.Transfer) as cm:
                    await c.call(dead, "target")
                self.assertTrue(str(cm.exception).endswith("(after 3 attempts)"))
                outs = await c.call_many("busy", [(self.a, {"k": "a2", "n": 2}),
                                                  (self.a, {"k": "a3", "reason": "draining"})])
                self.assertTrue(outs[0].ok)
                self.assertEqual(outs[1].error.reason, "draining")
                self.assertEqual(outs[1].error.attempts, 1)
                with self.assertRaises(ctlrpc.UnitFull):
                    await c.call(self.a, "full", idempotent=True)
                st = c.stats(self.a)
                self.assertEqual((st["retries_busy"], st["attempts"]), (3, 7))
        run(go)

    def test_cancel_during_backoff(self):
        async def go():
            loop = asyncio.get_running_loop()
            base = readers(loop)
            pol = ctlrpc.RetryPolicy(max_attempts=3, retry_busy=True, initial_backoff=20.0,
                                     max_backoff=20.0)
            async with ctlrpc.aio.Client(timeout=60.0, retry=pol) as c:
                task = asyncio.create_task(c.call(self.a, "busy", {"k": "cancel"}))
                t0 = time.monotonic()
                while c.stats(self.a)["retries"] < 1:  # the first attempt failed: a backoff
                    await asyncio.sleep(0.01)
                    self.assertLess(time.monotonic() - t0, CALL_S)
                task.cancel()
                with self.assertRaises(asyncio.CancelledError):
                    await task
                self.assertLess(time.monotonic() - t0, CALL_S)
                self.assertEqual(asyncio.all_tasks(), {asyncio.current_task()})
                self.assertEqual(self.unit.seen["cancel"], 1)
                st = c.stats(self.a)
                self.assertEqual(st["sockets"], st["sockets_idle"])  # none lent
                # The loop watches the idle sockets alone.
                self.assertEqual(readers(loop), base + st["sockets_idle"])
                self.assertEqual(await c.call(self.a, "probe"), "here")
        run(go)

    def test_transparent_retry(self):
        """The transparent retry on the loop (the dropped pooled socket's reader goes with
        it), then the policy's retry of the fresh connection, refused: no reader left."""
        unit = Unit()
        a = unit.address
        t = FakeTime()

        async def go():
            loop = asyncio.get_running_loop()
            base = readers(loop)
            pol = t.policy(aio=True, max_attempts=2, initial_backoff=0.01)
            c = ctlrpc.aio.Client(timeout=CALL_S, retry=pol)
            try:
                ctlrpc.client._JANITOR.remove(c._pool)
                with mock.patch.object(ctlrpc.client, "IDLE_DRAIN_S", 1e9):
                    self.assertEqual(await c.call(a, "probe"), "here")
                    unit.close()
                    sock = c._pool.entries[a].idle[0][0]
                    t0 = time.monotonic()
                    while c._pool.connected(sock):
                        await asyncio.sleep(0.01)
                        self.assertLess(time.monotonic() - t0, CALL_S)
                    with self.assertRaises(ctlrpc.Transfer) as cm:
                        await c.call(a, "probe")
                st = c.stats(a)
                self.assertEqual(cm.exception.cause, "refused", str(cm.exception))
                self.assertEqual(st["retries"], 2)  # the transparent one, then the policy's
                self.assertEqual(st["retries_by_cause"]["refused"], 1)
                self.assertEqual(sum(st["retries_by_cause"].values()), 1)
                self.assertEqual((st["attempts"], st["calls"]), (4, 1))
                self.assertEqual(readers(loop), base)
            finally:
                c.close()
        run(go)

    def test_sleep_kind_checked(self):
        with self.assertRaises(ValueError):
            ctlrpc.aio.Client(retry=ctlrpc.RetryPolicy(sleep=time.sleep))
        with self.assertRaises(ValueError):
            ctlrpc.Client(retry=ctlrpc.RetryPolicy(sleep=asyncio.sleep))

    def test_notify_before_the_connection_is_up(self):
        async def go():
            async with ctlrpc.aio.Client(timeout=CALL_S) as c:
                for i in range(5):
                    c.notify(self.a, "note", {"i": i})
                self.assertEqual(await c.call(self.a, "probe"), "here")
                self.assertEqual(c.stats(self.a)["notifies"], 5)
            dead = support.dead_address()
            async with ctlrpc.aio.Client(timeout=CALL_S) as c:
                c.notify(dead, "note")  # waits for a connection that never comes
                with self.assertRaises(ctlrpc.Transfer):
                    await c.call(dead, "target")  # after the notify: refused too
                self.assertEqual(c.stats(dead)["errors"]["refused"], 2)
                self.assertEqual(c.stats(dead)["notifies"], 0)
        run(go)

    def test_close_drops_waiting_notifies_counted_and_logged(self):
        """Notifies still waiting for a connection when the client closes are not sent: the
        address's errors count them (cause "transport") and a warning says how many."""
        async def go():
            dead = support.dead_address()
            c = ctlrpc.aio.Client(timeout=CALL_S)
            for i in range(3):
                c.notify(dead, "note", {"i": i})  # parked: nothing listens there
            before = c.stats(dead)["errors"].get("transport", 0)
            with self.assertLogs("ctlrpc", level="WARNING") as logs:
                c.close()
            self.assertEqual(c.stats(dead)["errors"].get("transport", 0), before + 1)
            self.assertEqual(c.stats(dead)["notifies"], 0)
            self.assertTrue(any("3 notify(s)" in m and "closed" in m for m in logs.output),
                            logs.output)
        run(go)


class Policies(unittest.TestCase):

    def test_validation(self):
        for kw in ({"max_attempts": -1}, {"max_attempts": 1.5}, {"initial_backoff": -1},
                   {"max_backoff": float("nan")}, {"multiplier": 0}, {"jitter": 1.5},
                   {"jitter": -0.1}, {"budget_tokens": 0}, {"budget_ratio": -1},
                   {"clock": 3}, {"rng": "x"},
                   # The C client's bounds (ctl_retry_policy), the same here.
                   {"multiplier": 0.5}, {"multiplier": True}, {"max_backoff": 0.01},
                   {"jitter": True}, {"budget_tokens": 2000000}, {"budget_ratio": 1e7}):
            with self.assertRaises(ValueError, msg=repr(kw)) as cm:
                ctlrpc.RetryPolicy(**kw)
            self.assertIn(next(iter(kw)), str(cm.exception))
        with self.assertRaises(TypeError):
            ctlrpc.Client(retry=3)
        # Timeouts are finite numbers of seconds, named when they are not.
        for bad in (float("inf"), float("nan"), -1, True, "1"):
            with self.assertRaises(ValueError) as cm:
                ctlrpc.Client(timeout=bad)
            self.assertIn("timeout", str(cm.exception))
        with ctlrpc.Client() as c:
            for bad in (float("inf"), float("nan")):
                with self.assertRaises(ValueError) as cm:
                    c.call("tcp://127.0.0.1:1", "x", timeout=bad)
                self.assertIn("timeout", str(cm.exception))

    def test_defaults_and_backoff(self):
        p = ctlrpc.RetryPolicy()
        self.assertEqual((p.max_attempts, p.initial_backoff, p.max_backoff, p.multiplier,
                          p.jitter, p.retry_busy, p.budget_tokens, p.budget_ratio,
                          p.transparent), (1, 0.05, 1.0, 2.0, 0.2, False, 10, 0.1, True))
        p = ctlrpc.RetryPolicy(jitter=0, initial_backoff=0.05, max_backoff=1.0)
        self.assertEqual([p.backoff(n) for n in (1, 2, 3, 5, 6, 2000)],
                         [0.05, 0.1, 0.2, 0.8, 1.0, 1.0])
        with ctlrpc.Client(retry=p) as c:
            self.assertIs(c.retry, p)

    def test_generated_clients_pass_retry(self):
        sys.path.insert(0, ARGS.module_dir)
        import storage_ctl
        p = ctlrpc.RetryPolicy(max_attempts=2)
        with storage_ctl.Client(timeout=1.0, retry=p) as c:
            self.assertIs(c.rpc.retry, p)
        c = storage_ctl.AsyncClient(timeout=1.0, retry=p)
        self.assertIs(c.rpc.retry, p)
        c.close()


if __name__ == "__main__":
    ARGS, argv = support.main("module-dir")
    support.run_tests(argv)
