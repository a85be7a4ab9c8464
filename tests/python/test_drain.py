"""The Python unit's drain and stop, under load.

    test_drain.py [unittest args]

Drain, on every way a Server is set up (its own context, a shared context, a CURVE allowlist):
twenty callers send while a handler runs; the drain answers every queued request with Busy
"draining" (the running handler's caller gets its reply), and drain(timeout) returns within its
timeout even when a handler runs past it (the bounds allow a second for a loaded machine; the
handler that runs past the drain runs 5 s).

SIGTERM under reconnecting clients: a unit whose handler is busy while thousands of TCP
connections come and go (each an accepted and a disconnected event on its socket's monitor),
then told to drain by SIGTERM, exits within a deadline; its connection counters saw them. The
monitor is read on a thread of its own, so its events never pile up while a handler runs or a
drain goes on (they would stop libzmq's I/O thread, and the unit's close with it).

A unit whose main thread waits for SIGTERM without a timeout takes it after a SIGSTOP and
SIGCONT: the runtime's own threads block signals, so none of them swallows it.
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest

import zmq

import ctlrpc

import support

CALL_S = 5.0
EXIT_S = 10.0
CONNECTIONS = 3000


class Drain(unittest.TestCase):

    def drain_under_load(self, **server_opts):
        entered = threading.Event()

        def slow(args):
            entered.set()
            time.sleep(1.0)  # time for the other requests to reach the unit, however loaded
            return "served"

        server = ctlrpc.Server({"slow": slow, "echo": lambda a: a}, "tcp://127.0.0.1:0",
                               **server_opts.get("server", {}))
        self.addCleanup(server.close)
        client = ctlrpc.Client(timeout=CALL_S, max_idle_per_address=32,
                               **server_opts.get("client", {}))
        self.addCleanup(client.close)
        # The callers' connections are up before the slow handler holds the serving thread
        # (which answers ZAP for an allowlist too): the client's sockets are ZMQ_IMMEDIATE, so
        # a request leaves only on a connection that is up, and the twenty must reach the unit
        # while the handler runs.
        warm = client.call_many("echo", [(server.endpoint, {})] * 20)
        self.assertTrue(all(o.ok for o in warm), warm)
        self.assertEqual(client.stats(server.endpoint)["sockets_idle"], 20)
        results = []
        lock = threading.Lock()

        def caller(op):
            try:
                r = client.call(server.endpoint, op, {})
            except ctlrpc.Error as e:
                r = e
            with lock:
                results.append(r)

        first = threading.Thread(target=caller, args=("slow",))
        first.start()
        self.assertTrue(entered.wait(CALL_S))
        others = [threading.Thread(target=caller, args=("slow",)) for _ in range(19)]
        for t in others:
            t.start()
        support.wait_for(lambda: client.stats(server.endpoint)["calls"] == 40,
                         "twenty requests sent")
        t0 = time.monotonic()
        server.drain(2.0)
        took = time.monotonic() - t0
        for t in [first] + others:
            t.join(CALL_S)
        self.assertLess(took, 2.0 + 3.0, "drain(2.0) took %.2f s" % took)
        served = [r for r in results if r == "served"]
        busy = [r for r in results if isinstance(r, ctlrpc.Busy) and r.reason == "draining"]
        self.assertEqual(len(results), 20, results)
        self.assertEqual(len(served), 1, results)
        self.assertEqual(len(busy), 19, results)

    def test_own_context(self):
        self.drain_under_load()

    def test_shared_context(self):
        ctx = zmq.Context()
        self.addCleanup(ctx.term)
        self.drain_under_load(server={"context": ctx}, client={"context": ctx})

    def test_curve_allowlist(self):
        if not ctlrpc.curve.available():
            self.skipTest("skipped: this libzmq has no CURVE")
        server_public, server_secret = ctlrpc.curve.keypair()
        public, secret = ctlrpc.curve.keypair()
        self.drain_under_load(
            server={"curve_secret": server_secret, "curve_allow": [public]},
            client={"curve_server_key": server_public, "curve_secret": secret})

    def test_drain_returns_within_its_timeout_while_a_handler_runs(self):
        release = threading.Event()
        entered = threading.Event()

        def block(args):
            entered.set()
            release.wait(CALL_S)
            return "late"

        server = ctlrpc.Server({"block": block}, "tcp://127.0.0.1:0")
        self.addCleanup(release.set)
        client = ctlrpc.Client(timeout=0.5)
        self.addCleanup(client.close)
        seen = []

        def caller():
            try:
                seen.append(client.call(server.endpoint, "block"))
            except ctlrpc.Error as e:
                seen.append(e)
        t = threading.Thread(target=caller)
        t.start()
        self.assertTrue(entered.wait(CALL_S))
        t0 = time.monotonic()
        server.drain(0.3)
        # Within its timeout (and what a loaded machine adds), not when the handler ends.
        self.assertLess(time.monotonic() - t0, 0.3 + 3.0)
        # The handler still runs: the call ends at its deadline, then the handler is let go.
        t.join(CALL_S)
        self.assertFalse(t.is_alive())
        release.set()
        self.assertEqual(len(seen), 1)
        self.assertIsInstance(seen[0], ctlrpc.Timeout)


def child():
    """A unit that drains on SIGTERM; its handler "block" runs for a while."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server = ctlrpc.Server({"block": lambda a: time.sleep(a.get("s", 2.0)) or "done",
                            "echo": lambda a: a}, "tcp://127.0.0.1:0")
    print(server.endpoint, flush=True)
    while not stop.wait(0.05):
        pass
    server.drain(1.0)
    print("accepted %d" % server.stats()["accepted"], flush=True)


def runtime_threads():
    """A server and a client, and every thread they start: the server's, the client's janitor,
    both contexts' threads, and pyzmq's collector of zero-copy sends (a request and a reply
    over 32 KiB each)."""
    server = ctlrpc.Server({"echo": lambda a: a}, "tcp://127.0.0.1:0")
    client = ctlrpc.Client()
    client.call(server.endpoint, "echo", {"v": b"x" * (100 << 10)})
    return server, client


def child_masks():
    """Print, for each thread but this one, its id and whether it blocks SIGTERM and SIGINT."""
    server, client = runtime_threads()
    me = str(threading.get_native_id())
    for tid in sorted(os.listdir("/proc/self/task")):
        if tid == me:
            continue
        with open("/proc/self/task/%s/status" % tid) as f:
            blk = next(int(line.split()[1], 16) for line in f if line.startswith("SigBlk:"))
        both = all(blk >> (sig - 1) & 1 for sig in (signal.SIGTERM, signal.SIGINT))
        print(tid, "blocks" if both else "takes", flush=True)
    client.close()
    server.close()


def child_waits():
    """A unit whose main thread waits for SIGTERM in signal.sigwait, as unit.py does. The
    signal is blocked in the main thread only once the runtime's threads are running (they
    inherit no mask from it), so the wait ends only if every one of them blocks it: a thread
    that did not would take the signal itself, and the wait would never end."""
    server, client = runtime_threads()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    print(server.endpoint, flush=True)
    signal.sigwait({signal.SIGTERM})
    client.close()
    server.close()


class Sigterm(unittest.TestCase):

    def test_signal_reaches_a_main_thread_that_waits(self):
        """SIGCONT then SIGTERM (what a supervisor that froze a unit sends): the main thread
        takes it, because no thread of the runtime's (nor of libzmq's) can."""
        for _ in range(8):
            unit = support.Process([sys.executable, os.path.abspath(__file__), "--child-waits"])
            unit.freeze()
            unit.thaw()
            try:
                self.assertEqual(unit.stop(), 0)
            except subprocess.TimeoutExpired:
                unit.kill()
                self.fail("the unit did not take SIGTERM")

    def test_runtime_threads_block_signals(self):
        """Every thread the runtime starts, libzmq's and pyzmq's included, blocks signals from
        its first instruction: libzmq's threads block them only once they run, and pyzmq's
        collector takes the mask of the thread whose send starts it."""
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child-masks"],
                             stdout=subprocess.PIPE, timeout=60, check=True).stdout.decode()
        lines = out.split("\n")[:-1]
        self.assertGreaterEqual(len(lines), 8, out)  # server 2, janitor, 2 contexts, collector
        self.assertEqual([ln for ln in lines if not ln.endswith(" blocks")], [], out)

    @staticmethod
    def call_quietly(client, address):
        try:
            client.call(address, "block", {"s": 2.0})
        except ctlrpc.Error:
            pass  # the unit may stop before the handler ends: not what is tested here

    def test_sigterm_under_reconnecting_clients(self):
        unit = support.Process([sys.executable, os.path.abspath(__file__), "--child"])
        port = int(unit.address.rsplit(":", 1)[1])
        client = ctlrpc.Client(timeout=CALL_S)
        self.addCleanup(client.close)
        busy = threading.Thread(target=self.call_quietly, args=(client, unit.address))
        busy.start()
        support.wait_for(lambda: client.stats(unit.address)["calls"] == 1, "the busy call")
        # Connections that come and go while the handler runs, then during the drain.
        stop = threading.Event()
        made = [0]

        def churn():
            while not stop.is_set():
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                        pass
                except OSError:
                    return  # the unit has gone
                made[0] += 1

        churners = [threading.Thread(target=churn) for _ in range(4)]
        for t in churners:
            t.start()
        try:
            support.wait_for(lambda: made[0] >= CONNECTIONS, "%d connections" % CONNECTIONS,
                             30)
            t0 = time.monotonic()
            unit.proc.send_signal(signal.SIGTERM)
            try:
                rc = unit.proc.wait(timeout=EXIT_S)
            except subprocess.TimeoutExpired:
                unit.kill()
                self.fail("the unit did not exit within %.0f s of SIGTERM" % EXIT_S)
            self.assertEqual(rc, 0)
            self.assertLess(time.monotonic() - t0, EXIT_S)
            tail = unit.proc.stdout.read().decode()
            self.assertRegex(tail, r"accepted \d+")
            accepted = int(tail.split()[-1])
            self.assertGreater(accepted, 100, tail)
        finally:
            stop.set()
            for t in churners:
                t.join(EXIT_S)
            busy.join(CALL_S)
            unit.proc.stdout.close()


if __name__ == "__main__":
    if "--child-waits" in sys.argv:
        child_waits()
        sys.exit(0)
    if "--child-masks" in sys.argv:
        child_masks()
        sys.exit(0)
    if "--child" in sys.argv:
        child()
        sys.exit(0)
    support.run_tests(sys.argv)
