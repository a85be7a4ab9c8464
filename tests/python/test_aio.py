"""The asyncio client (ctlrpc.aio.Client, and a generated module's AsyncClient) against Python
units and the C storage unit.

    test_aio.py --unit PATH/ctl-storage-unit [unittest args]

Many calls in flight from one loop; every error kind; timeouts and the late replies after them,
counted; a reply for another id skipped and counted; the fail-fast causes (refused, unresolved,
auth, too-large, each well before the deadline); notifies in order with the calls after them;
cancelling the awaiting task of a call and of a fan-out (CancelledError in the task, the
sockets retired, no reader left on the loop, no task or future left behind, the late reply
counted); close() with a call in flight. Every test runs its loop in asyncio's debug mode with
warnings as errors, and fails on anything the loop reports ("exception was never retrieved",
"Task was destroyed but it is pending", a slow callback is not counted). The generated
AsyncClient calls the C unit and the Python storage unit (examples/storage/unit.py): put, get,
stats_many, UnitFull, Busy, a timeout (the unit frozen) and its late reply.
"""

import asyncio
import gc
import os
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import warnings
from unittest import mock

import msgpack
import zmq

import ctlrpc

import support

UNIT = None
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CALL_S = 5.0


class NotFound(ctlrpc.DeclaredError):
    kind = "NotFound"


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
    """The descriptors the loop watches (its own wake-up pipe among them)."""
    return len(loop._selector.get_map())  # asyncio's selector loops


class Handlers:
    def __init__(self):
        self.entered = threading.Event()
        self.release = threading.Event()
        self.notes = []

    def table(self):
        return {"echo": lambda a: a.get("text"),
                "big": lambda a: b"x" * a["n"],
                "fail": self.fail,
                "block": self.block,
                "slow": lambda a: time.sleep(a.get("s", 0.3)) or "late",
                "note": lambda a: self.notes.append(a["n"]),
                "notes": lambda a: list(self.notes)}

    def fail(self, a):
        what = a["what"]
        if what == "UnitFull":
            raise ctlrpc.UnitFull("no room")
        if what == "Busy":
            raise ctlrpc.Busy("pinned it is", reason="pinned")
        if what == "Missing":
            raise ctlrpc.Missing("gone", blobs=["k"])
        if what == "NotFound":
            raise NotFound("no such", reason="why")
        raise ValueError("bad value")

    def block(self, a):
        self.entered.set()
        self.release.wait(CALL_S)
        return "unblocked"


class PythonUnit(unittest.TestCase):

    def setUp(self):
        self.h = Handlers()
        self.server = ctlrpc.Server(self.h.table(), "tcp://127.0.0.1:0", notify=("note",),
                                    max_msg_bytes=1 << 20)
        self.addCleanup(self.server.close)
        self.addCleanup(self.h.release.set)
        self.a = self.server.endpoint

    def test_many_in_flight(self):
        async def go():
            loop = asyncio.get_running_loop()
            base = readers(loop)
            async with ctlrpc.aio.Client(timeout=CALL_S) as c:
                got = await asyncio.gather(*[c.call(self.a, "echo", {"text": str(i)})
                                             for i in range(300)])
                self.assertEqual(got, [str(i) for i in range(300)])
                outs = await c.call_many("echo", [(self.a, {"text": "m%d" % i})
                                                  for i in range(20)])
                self.assertEqual([o.result for o in outs], ["m%d" % i for i in range(20)])
                self.assertTrue(all(o.ok and o.error is None for o in outs))
                st = c.stats(self.a)
                self.assertEqual((st["calls"], st["timeouts"], st["late_replies"],
                                  st["retired"]), (320, 0, 0, 0), st)
                # The loop watches the sockets idle in the pool, and those alone.
                self.assertEqual(readers(loop), base + st["sockets_idle"])
                self.assertEqual(st["sockets_idle"], st["sockets"])
            self.assertEqual(readers(loop), base)
        run(go)

    def test_idle_sockets_closed_off_the_loop(self):
        """Sockets idle in the pool stay with the loop until the pool's janitor closes them
        (idle_timeout): then the loop stops watching them and they are closed."""
        async def go():
            loop = asyncio.get_running_loop()
            base = readers(loop)
            async with ctlrpc.aio.Client(timeout=CALL_S, idle_timeout=0.2) as c:
                await asyncio.gather(*[c.call(self.a, "echo", {"text": "x"})
                                       for _ in range(4)])
                self.assertEqual(readers(loop), base + c.stats(self.a)["sockets_idle"])
                self.assertGreater(c.stats(self.a)["sockets_idle"], 0)
                deadline = time.monotonic() + CALL_S
                while c.stats(self.a)["sockets"] and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                self.assertEqual(c.stats(self.a)["sockets"], 0)
                self.assertEqual(readers(loop), base)
                self.assertEqual(await c.call(self.a, "echo", {"text": "again"}), "again")
        run(go)

    def test_unit_gone_while_sockets_idle(self):
        """The unit of idle, watched sockets goes away: their descriptors signal, and the loop
        is not kept busy by them while they wait to be closed; then the janitor closes them
        and the loop stops watching them."""
        server = ctlrpc.Server(self.h.table(), "tcp://127.0.0.1:0")
        address = server.endpoint

        async def go():
            loop = asyncio.get_running_loop()
            base = readers(loop)
            async with ctlrpc.aio.Client(timeout=CALL_S) as c:
                await asyncio.gather(*[c.call(address, "echo", {"text": "x"})
                                       for _ in range(4)])
                idle = c.stats(address)["sockets_idle"]
                self.assertGreater(idle, 0)
                # Nothing closes them for now: no janitor, no sweep of the idle.
                ctlrpc.client._JANITOR.remove(c._pool)
                with mock.patch.object(ctlrpc.client, "IDLE_DRAIN_S", 1e9):
                    server.close()
                    cpu0 = time.thread_time()
                    await asyncio.sleep(0.5)
                    spent = time.thread_time() - cpu0
                    # A descriptor left readable would have the loop call its reader
                    # without end, burning the whole half second.
                    self.assertLess(spent, 0.2, spent)
                    self.assertEqual(c.stats(address)["sockets_idle"], idle)
                ctlrpc.client._JANITOR.add(c._pool)
                deadline = time.monotonic() + CALL_S
                while c.stats(address)["sockets"] and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                self.assertEqual(c.stats(address)["sockets"], 0)
                self.assertEqual(readers(loop), base)
        run(go)

    def test_one_client_on_two_loops(self):
        """A client used from one loop, then another: its sockets move to the new loop."""
        c = ctlrpc.aio.Client(timeout=CALL_S)
        self.addCleanup(c.close)

        async def call(text):
            return await c.call(self.a, "echo", {"text": text})
        self.assertEqual(run(lambda: call("one")), "one")
        self.assertEqual(run(lambda: call("two")), "two")
        self.assertEqual(c.stats(self.a)["calls"], 2)

    def test_error_kinds(self):
        async def go():
            async with ctlrpc.aio.Client(timeout=CALL_S) as c:
                with self.assertRaises(ctlrpc.UnitFull):
                    await c.call(self.a, "fail", {"what": "UnitFull"})
                with self.assertRaises(ctlrpc.Busy) as cm:
                    await c.call(self.a, "fail", {"what": "Busy"})
                self.assertEqual(cm.exception.reason, "pinned")
                with self.assertRaises(ctlrpc.Missing) as cm:
                    await c.call(self.a, "fail", {"what": "Missing"})
                self.assertEqual(cm.exception.blobs, ["k"])
                with self.assertRaises(NotFound) as cm:
                    await c.call(self.a, "fail", {"what": "NotFound"},
                                 kinds={"NotFound": NotFound})
                self.assertEqual(cm.exception.reason, "why")
                with self.assertRaises(ctlrpc.Transfer) as cm:
                    await c.call(self.a, "fail", {"what": "ValueError"})
                self.assertEqual(cm.exception.cause, "remote")
                with self.assertRaises(ctlrpc.Transfer) as cm:
                    await c.call(self.a, "nosuch")
                self.assertIn("unknown op 'nosuch'", str(cm.exception))
                self.assertEqual(c.stats(self.a)["errors"]["remote"], 2)
                with self.assertRaises(ValueError):
                    await c.call("tcp://127.0.0.1", "echo")
                with self.assertRaises(ValueError):
                    await c.call("tcp://_bad-host:4100", "echo")
                with self.assertRaises(TypeError):
                    await c.call(self.a, "echo", ["not", "a", "map"])
        run(go)

    def test_timeout_then_late_reply(self):
        async def go():
            async with ctlrpc.aio.Client(timeout=CALL_S, late_grace=CALL_S) as c:
                t0 = time.monotonic()
                with self.assertRaises(ctlrpc.Timeout) as cm:
                    await c.call(self.a, "slow", {"s": 2.0}, timeout=0.1)
                self.assertLess(time.monotonic() - t0, 1.5)  # at its deadline, not the reply
                self.assertIn("no reply within 100 ms", str(cm.exception))
                st = c.stats(self.a)
                self.assertEqual((st["timeouts"], st["retired"], st["errors"]["timeout"]),
                                 (1, 1, 1), st)
                self.assertEqual(await c.call(self.a, "echo", {"text": "after"}), "after")
                deadline = time.monotonic() + CALL_S
                while c.stats(self.a)["late_replies"] < 1 and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                self.assertEqual(c.stats(self.a)["late_replies"], 1)
        run(go)

    def test_cancel_a_call(self):
        async def go():
            loop = asyncio.get_running_loop()
            base = readers(loop)
            async with ctlrpc.aio.Client(timeout=CALL_S, late_grace=3.0) as c:
                task = asyncio.create_task(c.call(self.a, "block"))
                while not self.h.entered.is_set():
                    await asyncio.sleep(0.01)
                task.cancel()
                with self.assertRaises(asyncio.CancelledError):
                    await task
                self.assertTrue(task.cancelled())
                st = c.stats(self.a)
                self.assertEqual((st["retired"], st["sockets_idle"], st["timeouts"]),
                                 (1, 0, 0), st)
                self.assertEqual(readers(loop), base)
                self.assertEqual(asyncio.all_tasks(), {asyncio.current_task()})
                self.h.release.set()
                # The reply comes to the retired socket: counted, never given to a call.
                self.assertEqual(await c.call(self.a, "echo", {"text": "next"}), "next")
                deadline = time.monotonic() + CALL_S
                while c.stats(self.a)["late_replies"] < 1 and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                self.assertEqual(c.stats(self.a)["late_replies"], 1)
        run(go)

    def test_cancel_a_fan_out(self):
        async def go():
            loop = asyncio.get_running_loop()
            base = readers(loop)
            async with ctlrpc.aio.Client(timeout=CALL_S) as c:
                dead = support.dead_address()
                task = asyncio.create_task(c.call_many(
                    "block", [(self.a, None), (self.a, None), (dead, None)]))
                while not self.h.entered.is_set():
                    await asyncio.sleep(0.01)
                task.cancel()
                with self.assertRaises(asyncio.CancelledError):
                    await task
                self.assertEqual(c.stats(self.a)["retired"], 2)
                self.assertEqual(c.stats(dead)["retired"], 1)
                self.assertEqual(readers(loop), base)
        run(go)

    def test_cancel_with_wait_for(self):
        async def go():
            async with ctlrpc.aio.Client(timeout=CALL_S) as c:
                with self.assertRaises(asyncio.TimeoutError):
                    await asyncio.wait_for(c.call(self.a, "slow", {"s": 0.5}), 0.1)
                self.assertEqual(c.stats(self.a)["retired"], 1)
                self.assertEqual(await c.call(self.a, "echo", {"text": "ok"}), "ok")
        run(go)

    def test_fail_fast(self):
        async def go():
            async with ctlrpc.aio.Client(timeout=CALL_S, max_msg_bytes=1000) as c:
                for address, cause in ((support.dead_address(), "refused"),
                                       ("tcp://no-such-host.invalid:4100", "unresolved")):
                    t0 = time.monotonic()
                    with self.assertRaises(ctlrpc.Transfer) as cm:
                        await c.call(address, "echo")
                    self.assertEqual(cm.exception.cause, cause, str(cm.exception))
                    self.assertLess(time.monotonic() - t0, CALL_S / 2)
                    self.assertEqual(c.stats(address)["errors"][cause], 1)
                with self.assertRaises(ctlrpc.Transfer) as cm:
                    await c.call(self.a, "echo", {"text": "x" * 2000})
                self.assertEqual(cm.exception.cause, "too-large")
                self.assertIn("not sent", str(cm.exception))
                t0 = time.monotonic()
                with self.assertRaises(ctlrpc.Transfer) as cm:
                    await c.call(self.a, "big", {"n": 5000})
                self.assertEqual(cm.exception.cause, "too-large", str(cm.exception))
                self.assertLess(time.monotonic() - t0, CALL_S / 2)
        run(go)

    def test_auth(self):
        public, secret = ctlrpc.curve.keypair()
        server = ctlrpc.Server(self.h.table(), "tcp://127.0.0.1:0", curve_secret=secret)
        self.addCleanup(server.close)
        wrong, _ = ctlrpc.curve.keypair()

        async def go():
            async with ctlrpc.aio.Client(timeout=CALL_S, curve_server_key=public) as c:
                self.assertEqual(await c.call(server.endpoint, "echo", {"text": "c"}), "c")
            async with ctlrpc.aio.Client(timeout=CALL_S, curve_server_key=wrong) as c:
                t0 = time.monotonic()
                with self.assertRaises(ctlrpc.Transfer) as cm:
                    await c.call(server.endpoint, "echo")
                self.assertEqual(cm.exception.cause, "auth", str(cm.exception))
                self.assertLess(time.monotonic() - t0, CALL_S / 2)
        run(go)

    def test_notify_then_call(self):
        async def go():
            async with ctlrpc.aio.Client(timeout=CALL_S) as c:
                for i in range(5):
                    c.notify(self.a, "note", {"n": i})
                self.assertEqual(await c.call(self.a, "notes"), [0, 1, 2, 3, 4])
                self.assertEqual(c.stats(self.a)["notifies"], 5)
                # Each notify was a try at sending, as in the C client.
                self.assertEqual(c.stats(self.a)["attempts"], 6)
        run(go)

    def test_close_with_a_call_in_flight(self):
        async def go():
            loop = asyncio.get_running_loop()
            base = readers(loop)
            c = ctlrpc.aio.Client(timeout=CALL_S)
            task = asyncio.create_task(c.call(self.a, "block"))
            while not self.h.entered.is_set():
                await asyncio.sleep(0.01)
            c.close()
            with self.assertRaises(ctlrpc.Transfer) as cm:
                await task
            self.assertIn("closed", str(cm.exception))
            # Named as every error is: the address and the op.
            self.assertEqual((cm.exception.address, cm.exception.op), (self.a, "block"))
            self.assertEqual(readers(loop), base)
            with self.assertRaises(RuntimeError):
                await c.call(self.a, "echo")
        run(go)


class OtherIds(unittest.TestCase):

    def test_reply_for_another_id(self):
        """A fake unit answers first with another id, then with the right one: the call gets
        its own, the other is counted as late, and the socket is retired."""
        ctx = zmq.Context()
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.bind("tcp://127.0.0.1:0")
        self.addCleanup(ctx.term)
        self.addCleanup(router.close)
        address = router.getsockopt(zmq.LAST_ENDPOINT).decode()

        def fake():
            if not router.poll(int(CALL_S * 1000)):
                return
            ident, payload = router.recv_multipart()
            _, rid, _ = msgpack.unpackb(payload, raw=False)
            for r in ("000000000000", rid):
                router.send_multipart([ident, msgpack.packb([r, True, "yes"])])

        t = threading.Thread(target=fake)
        t.start()
        self.addCleanup(t.join)

        async def go():
            async with ctlrpc.aio.Client(timeout=CALL_S) as c:
                self.assertEqual(await c.call(address, "x"), "yes")
                st = c.stats(address)
                self.assertEqual((st["late_replies"], st["retired"]), (1, 1), st)
        run(go)


def generate_storage(out):
    subprocess.run([sys.executable, os.path.join(ROOT, "gen", "ctlrpc-gen"), "--lang",
                    "python", os.path.join(ROOT, "idl", "storage.idl"), "-o", out], check=True)
    sys.path.insert(0, out)
    import storage_ctl
    return storage_ctl


class CUnit(unittest.TestCase):

    def setUp(self):
        self.procs = []
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.m = generate_storage(self.tmp.name)

    def tearDown(self):
        for p in self.procs:
            self.assertEqual(p.stop(), 0, "unit exit status")

    def unit(self):
        return [UNIT]

    def start(self, capacity="64M"):
        # The deadline check off: a late reply test needs the request it gave up on to run
        # once the unit is thawed, however late the machine lets it.
        p = support.Process(self.unit() + ["--bind", "tcp://127.0.0.1:0", "--capacity",
                                           capacity, "--deadline-skew-ms", "-1"])
        self.procs.append(p)
        return p.address

    def test_generated_async_client(self):
        a, b = self.start(), self.start("1K")
        m = self.m

        async def go():
            async with m.AsyncClient(timeout=CALL_S) as c:
                self.assertEqual(await c.put(a, key="k", data=b"v" * 100), 100)
                self.assertEqual(await c.get(a, keys=["k"]), [b"v" * 100])
                sizes = await asyncio.gather(*[c.put(a, key="k%d" % i, data=b"d" * i)
                                               for i in range(64)])
                self.assertEqual(sizes, list(range(64)))
                outs = await c.stats_many([a, b])
                self.assertTrue(all(o.ok for o in outs), outs)
                self.assertEqual(outs[0].result.blobs, 65)
                with self.assertRaises(ctlrpc.UnitFull):
                    await c.put(b, key="big", data=b"x" * 4096)
                await c.put(a, key="p", data=b"y", pin=True)
                with self.assertRaises(ctlrpc.Busy) as cm:
                    await c.delete(a, keys=["p"])
                self.assertEqual(cm.exception.reason, "pinned")
                with self.assertRaises(TypeError):
                    await c.put(a, key=1, data=b"")
                with self.assertRaises(TypeError):
                    await c.stats_many(a)
        run(go)

    def test_timeout_and_late_reply(self):
        unit = self.procs
        a = self.start()
        m = self.m

        async def go():
            async with m.AsyncClient(timeout=CALL_S, late_grace=5.0) as c:
                await c.put(a, key="k", data=b"v")
                unit[0].freeze()
                try:
                    with self.assertRaises(ctlrpc.Timeout):
                        await c.get(a, keys=["k"], timeout=0.2)
                finally:
                    unit[0].thaw()
                self.assertEqual(await c.get(a, keys=["k"]), [b"v"])
                deadline = time.monotonic() + CALL_S
                while c.rpc.stats(a)["late_replies"] < 1 and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                st = c.rpc.stats(a)
                self.assertEqual((st["timeouts"], st["late_replies"]), (1, 1), st)
        run(go)


class PythonStorageUnit(CUnit):
    """The same, against the storage unit written on the generated module (unit.py)."""

    def unit(self):
        return [sys.executable, os.path.join(ROOT, "examples", "storage", "unit.py"),
                "--module-dir", self.tmp.name]


if __name__ == "__main__":
    args, argv = support.main("unit")
    UNIT = args.unit
    support.run_tests(argv)
