"""Membership in etcd, Python side: Python units (examples/storage/unit.py and the runtime's
Server) seen by Python directories (ctlrpc.Directory), against a private etcd started here.

    test_fleet.py --pyunit UNIT_PY --module-dir DIR [unittest args, e.g. Faults]

- Members: the value of docs/PROTOCOL.md (every field, readable with etcdctl), addresses() of
  serving units only, the change callback, Server.register and serve(etcd=...), a unit that
  starts before etcd, one that cannot reach it logging so once however often it tries again,
  endpoints tried in order, a directory that never reached etcd.
- Faults: SIGKILL (gone within TTL + 1 s), SIGTERM (draining seen, then gone at once), etcd
  SIGSTOPped longer than the TTL (stale meanwhile, calls to units still work, re-register,
  watch resumed and nothing missed), etcd restarted on the same and on an empty data
  directory, a watch cut off while the revisions it needs are compacted.
- Hostile: bad values under the prefix skipped, counted, logged once; another service's keys.
- Secure: https with a CA made here and client certificates; an etcd user with a password.
- Cross (with --cunit and --ccli, when the C runtime is built with etcd): C units
  (ctl-storage-unit) seen by Python directories, Python units seen by the C directory of
  ctl-storage, SIGTERM and SIGKILL across the two.
"""

import io
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)

import ctlrpc  # noqa: E402
from ctlrpc import directory as cdir  # noqa: E402

import fleet_support as fs  # noqa: E402
import support  # noqa: E402

OPTS = None
PREFIX = "/ctlrpc/v1/default/storage/"


def py_unit(etcd_url, *extra, env=None, stderr=None):
    """examples/storage/unit.py registered in etcd; a support.Process (address, proc)."""
    argv = [sys.executable, OPTS.pyunit, "--module-dir", OPTS.module_dir,
            "--bind", "tcp://127.0.0.1:0", "--etcd", etcd_url, *extra]
    if env is None:
        return support.Process(argv, stderr=stderr)
    old = dict(os.environ)
    os.environ.update(env)
    try:
        return support.Process(argv, stderr=stderr)
    finally:
        os.environ.clear()
        os.environ.update(old)


def ids(units):
    return sorted(u.unit_id for u in units)


class Base(unittest.TestCase):
    def setUp(self):
        self.tmp = fs.TempDir()
        self.addCleanup(self.tmp.close)
        self.etcd = fs.Etcd(self.tmp.path)
        self.addCleanup(self.etcd.close)
        self.units = []

    def tearDown(self):
        for u in self.units:
            u.kill()

    def unit(self, *extra, etcd=None, env=None):
        u = py_unit(etcd or self.etcd.url, *extra, env=env)
        self.units.append(u)
        return u

    def directory(self, etcd=None, **kw):
        d = ctlrpc.Directory(etcd or self.etcd.url, "storage", **kw)
        self.addCleanup(d.close)
        return d


class Members(Base):
    def test_value_and_addresses(self):
        seen = []
        d = self.directory(on_change=lambda units: seen.append(ids(units)))
        self.assertEqual(d.units(), [])
        self.assertFalse(d.stale)
        a = self.unit("--unit-id", "a", "--lease-ttl", "5")
        b = self.unit("--unit-id", "b")
        self.assertTrue(d.wait(lambda us: ids(us) == ["a", "b"], 10), ids(d.units()))
        self.assertEqual(d.addresses(), [a.address, b.address])
        self.assertIn(["a", "b"], seen)
        ua = d.units()[0]
        with ctlrpc.Client(5.0) as c:
            desc = c.call(a.address, "_describe", {})
        self.assertEqual(ua.address, a.address)
        self.assertEqual(ua.state, "serving")
        self.assertEqual(ua.service, "storage")
        self.assertEqual(ua.idl_hash, desc["idl_sha256"])
        self.assertEqual(ua.version, ctlrpc.__version__)
        self.assertEqual(ua.pid, a.proc.pid)
        self.assertTrue(ua.host)
        self.assertLessEqual(abs(ua.started - time.time()), 60)
        self.assertIsNone(ua.curve_public_key)
        # The contract is plain JSON that etcdctl reads.
        got = self.etcd.get_prefix("/ctlrpc/v1/")
        self.assertEqual(set(got), {PREFIX + "a", PREFIX + "b"})
        self.assertEqual(set(got[PREFIX + "a"]), {"address", "state", "service", "idl_hash",
                                                  "version", "host", "pid", "started"})
        self.assertIsNotNone(self.etcd.lease_of(PREFIX + "a"))
        # A unit in another namespace, and a service whose name starts the same, are not seen.
        self.unit("--unit-id", "c", "--namespace", "other")
        self.unit("--unit-id", "d", "--service", "storage2")
        fs.wait_until(lambda: len(self.etcd.get_prefix("/ctlrpc/v1/")) == 4, "4 keys")
        self.assertEqual(ids(d.units()), ["a", "b"])
        d2 = self.directory(namespace="other")
        self.assertEqual(ids(d2.units()), ["c"])

    def test_default_unit_id_and_draining_not_serving(self):
        u = self.unit()
        d = self.directory()
        self.assertTrue(d.wait(lambda us: len(us) == 1, 10))
        uid = d.units()[0].unit_id
        self.assertRegex(uid, r"^[A-Za-z0-9._-]+-%d-[0-9a-f]{8}$" % u.proc.pid)
        # A value in state draining is listed and is not serving.
        self.etcd.put(PREFIX + "x", json.dumps({"address": "tcp://127.0.0.1:9", "state":
                                                "draining", "service": "storage"}))
        self.assertTrue(d.wait(lambda us: len(us) == 2, 10))
        self.assertEqual(d.addresses(), [u.address])
        self.assertEqual([x.state for x in d.units() if x.unit_id == "x"], ["draining"])

    def test_server_register_and_serve(self):
        """The runtime's Server and the generated serve() join the fleet in a few lines."""
        d = self.directory()
        s = ctlrpc.Server({"echo": lambda a: a}, "tcp://127.0.0.1:0", name="storage")
        self.addCleanup(s.close)
        reg = s.register(self.etcd.url, unit_id="inproc", lease_ttl=3)
        self.assertTrue(d.wait(lambda us: ids(us) == ["inproc"], 10))
        fs.wait_until(lambda: reg.registered, "registered", 5)
        self.assertEqual(reg.registrations, 1)
        s.close()  # revokes: the key is gone at once, not after the TTL
        t0 = time.monotonic()
        self.assertTrue(d.wait(lambda us: us == [], 2.0))
        self.assertLess(time.monotonic() - t0, 2.0)
        self.assertEqual(self.etcd.get_prefix(PREFIX), {})

        sys.path.insert(0, OPTS.module_dir)
        import storage_ctl
        h = storage_ctl.Handlers()
        s2 = storage_ctl.serve(h, "tcp://127.0.0.1:0", etcd=self.etcd.url,
                               register={"unit_id": "gen", "lease_ttl": 2})
        try:
            self.assertTrue(d.wait(lambda us: ids(us) == ["gen"], 10))
            self.assertEqual(d.units()[0].idl_hash, storage_ctl._IDL_SHA256)
        finally:
            s2.drain(0.2)
        self.assertTrue(d.wait(lambda us: us == [], 3))
        # Bad arguments are refused, naming them.
        s3 = ctlrpc.Server({"echo": lambda a: a}, "tcp://127.0.0.1:0", name="storage")
        self.addCleanup(s3.close)
        for kw, text in (({"lease_ttl": 1}, "lease TTL"), ({"unit_id": "a/b"}, "unit id"),
                         ({"namespace": ""}, "namespace"),
                         ({"advertise": "tcp://0.0.0.0:5"}, "wildcard")):
            with self.assertRaisesRegex(ValueError, text):
                s3.register(self.etcd.url, **kw)
        with self.assertRaisesRegex(ValueError, "not http"):
            s3.register("tcp://127.0.0.1:2379")

    def test_long_drain_still_revokes(self):
        """A drain longer than the 2 s a stop gives etcd at each step (a handler runs 2.5 s) still
        revokes the lease when the server closes: the key is gone at once, not after its TTL."""
        started = threading.Event()

        def slow(a):
            started.set()
            time.sleep(2.5)
            return "done"
        d = self.directory()
        s = ctlrpc.Server({"slow": slow}, "tcp://127.0.0.1:0", name="storage")
        self.addCleanup(s.close)
        s.register(self.etcd.url, unit_id="slowdrain", lease_ttl=30)
        self.assertTrue(d.wait(lambda us: ids(us) == ["slowdrain"], 10))
        got = []
        th = threading.Thread(target=lambda: got.append(
            ctlrpc.Client(timeout=10.0).call(s.endpoint, "slow")))
        th.start()
        self.assertTrue(started.wait(10.0))
        s.drain(timeout=5.0)
        t0 = time.monotonic()
        self.assertTrue(d.wait(lambda us: us == [], 5.0), ids(d.units()))
        self.assertLess(time.monotonic() - t0, 5.0)  # revoked: its lease had 30 s to run
        th.join(10.0)
        self.assertEqual(got, ["done"])

    def test_advertise(self):
        self.unit("--unit-id", "adv", "--advertise", "tcp://10.1.2.3:4100")
        d = self.directory()
        self.assertTrue(d.wait(lambda us: len(us) == 1, 10))
        self.assertEqual(d.addresses(), ["tcp://10.1.2.3:4100"])

    def test_unit_starts_before_etcd(self):
        """A unit that cannot reach etcd serves anyway and registers once etcd is there."""
        port = fs.free_port()
        late = f"http://127.0.0.1:{port}"
        u = py_unit(late, "--unit-id", "early", "--lease-ttl", "2")
        self.units.append(u)
        with ctlrpc.Client(5.0) as c:
            self.assertEqual(c.call(u.address, "_health", {})["status"], "serving")
        # A directory that never reached etcd fails, naming the endpoint.
        t0 = time.monotonic()
        with self.assertRaises(ctlrpc.EtcdUnreachable) as cm:
            ctlrpc.Directory(late, "storage", start_timeout=0.5)
        self.assertIn(late, str(cm.exception))
        self.assertLess(time.monotonic() - t0, 5)
        # Now etcd comes up on that port.
        self.etcd.stop()
        self.etcd.client_port = port
        self.etcd.start()
        d = self.directory()
        self.assertTrue(d.wait(lambda us: ids(us) == ["early"], 15), ids(d.units()))

    def test_etcd_down_logged_once(self):
        """A unit that cannot reach etcd at start serves anyway, logs it once however often it
        tries again, and registers once etcd answers. Its etcd endpoints are a port nothing
        listens on and a cut proxy, which counts the connections it turns away: one per
        attempt, and the first three have run their course, logging included, before the
        fourth connects."""
        proxy = fs.Proxy(self.etcd.client_port)
        self.addCleanup(proxy.close)
        proxy.cut()
        path = os.path.join(self.tmp.path, "unit.err")
        with open(path, "wb") as err:
            u = py_unit(f"http://127.0.0.1:{fs.free_port()},{proxy.url}", "--unit-id", "early",
                        "--lease-ttl", "2", stderr=err)
        self.units.append(u)

        def lines():
            with open(path, encoding="utf-8", errors="replace") as f:
                return f.read().splitlines()

        with ctlrpc.Client(5.0) as c:
            self.assertEqual(c.call(u.address, "_health", {})["status"], "serving")
        fs.wait_until(lambda: proxy.refused >= 4, "four registration attempts", 20)
        got = lines()
        self.assertEqual(len(got), 1, got)
        self.assertIn("cannot reach etcd", got[0])
        self.assertIn("serving anyway", got[0])
        proxy.mend()
        d = self.directory()
        self.assertTrue(d.wait(lambda us: ids(us) == ["early"], 15), ids(d.units()))
        # Its line comes after the key is put: wait for it too.
        got = fs.wait_until(lambda: len(lines()) >= 2 and lines(), "the line saying so", 10)
        self.assertEqual(len(got), 2, got)
        self.assertIn("answers again", got[1])

    def test_endpoints_in_order(self):
        dead = f"http://127.0.0.1:{fs.free_port()}"
        self.unit("--unit-id", "x", etcd=f"{dead},{self.etcd.url}")
        d = self.directory(etcd=[dead, self.etcd.url])
        self.assertTrue(d.wait(lambda us: ids(us) == ["x"], 10))
        with self.assertRaisesRegex(ValueError, "not http"):
            ctlrpc.Directory("ftp://x:1", "storage")
        with self.assertRaisesRegex(ValueError, "service"):
            ctlrpc.Directory(self.etcd.url, "bad/name")


class Faults(Base):
    def test_sigkill_gone_within_ttl(self):
        u = self.unit("--unit-id", "k", "--lease-ttl", "2")
        d = self.directory()
        self.assertTrue(d.wait(lambda us: ids(us) == ["k"], 10))
        u.proc.kill()
        t0 = time.monotonic()
        self.assertTrue(d.wait(lambda us: us == [], 2 + 1.0), "still listed after TTL + 1 s")
        self.assertLess(time.monotonic() - t0, 3.0)

    def test_key_deleted_put_back(self):
        """A key deleted while its lease lives (an operator's `etcdctl del`) comes back at the
        unit's next keepalive, a third of the TTL later."""
        self.unit("--unit-id", "del", "--lease-ttl", "3")
        d = self.directory()
        self.assertTrue(d.wait(lambda us: ids(us) == ["del"], 10))
        self.etcd.ctl("del", PREFIX + "del")
        self.assertTrue(d.wait(lambda us: ids(us) == [], 5))
        self.assertTrue(d.wait(lambda us: ids(us) == ["del"], 3 + 5), "not put back")

    def test_sigterm_draining_then_gone(self):
        history = []
        lock = threading.Lock()

        def changed(units):
            with lock:
                history.append({u.unit_id: u.state for u in units})

        u = self.unit("--unit-id", "t", "--lease-ttl", "10", "--drain-timeout", "300")
        d = self.directory(on_change=changed)
        self.assertTrue(d.wait(lambda us: ids(us) == ["t"], 10))
        u.proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        self.assertTrue(d.wait(lambda us: us == [], 5))
        self.assertLess(time.monotonic() - t0, 5.0)  # revoked, not left to its 10 s lease
        self.assertEqual(u.proc.wait(timeout=10), 0)
        with lock:
            states = [h.get("t") for h in history]
        self.assertIn("draining", states)
        self.assertLess(states.index("serving"), states.index("draining"))
        self.assertIsNone(states[-1])

    def test_etcd_stopped_longer_than_ttl(self):
        """SIGSTOP etcd for longer than the TTL, then SIGCONT: the directory stays usable and
        says stale meanwhile, calls to units still work, the unit registers again, and the
        watch goes on without missing an event."""
        history = []
        u = self.unit("--unit-id", "s", "--lease-ttl", "2")
        d = self.directory(heartbeat=0.5, on_change=lambda us: history.append(ids(us)))
        self.assertTrue(d.wait(lambda us: ids(us) == ["s"], 10))
        lease0 = self.etcd.lease_of(PREFIX + "s")
        self.etcd.pause()
        try:
            fs.wait_until(lambda: d.stale, "the directory to say stale", 10)
            self.assertEqual(d.addresses(), [u.address])  # the last membership is kept
            self.assertIsNotNone(d.last_error)
            with ctlrpc.Client(5.0) as c:  # calls go straight to the units
                self.assertEqual(c.call(u.address, "_health", {})["status"], "serving")
            stopped = time.monotonic()
            fs.wait_until(lambda: time.monotonic() - stopped > 3.0, "3 s past the TTL", 5)
            self.assertGreater(d.age, 2.0)
            self.assertTrue(d.stale)
        finally:
            self.etcd.resume()
        fs.wait_until(lambda: not d.stale, "the directory to reach etcd again", 10)
        # The unit registered again (a new lease), and the directory has it.
        fs.wait_until(lambda: self.etcd.lease_of(PREFIX + "s") not in (None, lease0),
                      "a new lease for the unit", 15)
        self.assertTrue(d.wait(lambda us: ids(us) == ["s"], 10))
        self.assertEqual(d.addresses(), [u.address])
        # Nothing missed: events after the pause all arrive, in order, on the resumed watch.
        for i in range(20):
            self.etcd.put(PREFIX + f"e{i:02d}", json.dumps(
                {"address": f"tcp://127.0.0.1:{1000 + i}", "state": "serving"}))
        self.etcd.ctl("del", PREFIX + "e05")
        want = ["s"] + [f"e{i:02d}" for i in range(20) if i != 5]
        self.assertTrue(d.wait(lambda us: ids(us) == sorted(want), 10), ids(d.units()))
        fs.wait_until(lambda: d.revision == self.etcd.revision(), "the directory's revision", 5)
        self.assertEqual(d.lists, 1)  # resumed, never needed to list again

    def test_etcd_restart_same_data_dir(self):
        u = self.unit("--unit-id", "r", "--lease-ttl", "3")
        d = self.directory(heartbeat=0.5)
        self.assertTrue(d.wait(lambda us: ids(us) == ["r"], 10))
        self.etcd.stop()
        fs.wait_until(lambda: d.stale, "stale while etcd is down", 10)
        self.assertEqual(d.addresses(), [u.address])
        self.etcd.start()
        fs.wait_until(lambda: not d.stale, "the directory back", 15)
        self.etcd.put(PREFIX + "after", json.dumps({"address": "tcp://127.0.0.1:7",
                                                    "state": "serving"}))
        self.assertTrue(d.wait(lambda us: ids(us) == ["after", "r"], 15), ids(d.units()))
        # The unit's key outlives its TTL: it kept or renewed its registration.
        t0 = time.monotonic()
        fs.wait_until(lambda: time.monotonic() - t0 > 4, "a TTL", 6)
        self.assertIn(PREFIX + "r", self.etcd.get_prefix(PREFIX))

    def test_etcd_restart_empty_data_dir(self):
        self.unit("--unit-id", "r1", "--lease-ttl", "2")
        self.unit("--unit-id", "r2", "--lease-ttl", "2")
        d = self.directory(heartbeat=0.5)
        self.etcd.put(PREFIX + "ghost", json.dumps({"address": "tcp://127.0.0.1:7",
                                                    "state": "serving"}))
        self.assertTrue(d.wait(lambda us: ids(us) == ["ghost", "r1", "r2"], 10))
        lists = d.lists
        self.etcd.stop()
        self.etcd.wipe()
        self.etcd.start()
        # Both units register again; the ghost (in the old store only) is gone after the new
        # listing, which the directory makes because the store's revision went back.
        fs.wait_until(lambda: set(self.etcd.get_prefix(PREFIX)) == {PREFIX + "r1",
                                                                     PREFIX + "r2"},
                      "both units registered in the new store", 15)
        self.assertTrue(d.wait(lambda us: ids(us) == ["r1", "r2"], 15), ids(d.units()))
        self.assertGreater(d.lists, lists)

    def test_resumed_watch_publishes_each_revision(self):
        """Changes made while a directory is cut off arrive together when its watch resumes;
        each revision is still published on its own, in order, and nothing is listed again."""
        proxy = fs.Proxy(self.etcd.client_port)
        self.addCleanup(proxy.close)
        history = []
        d = self.directory(etcd=proxy.url, heartbeat=0.5,
                           on_change=lambda us: history.append({u.unit_id: u.state
                                                                for u in us}))

        def value(state, port):
            return json.dumps({"address": f"tcp://127.0.0.1:{port}", "state": state})

        self.etcd.put(PREFIX + "b", value("serving", 7001))
        self.assertTrue(d.wait(lambda us: ids(us) == ["b"], 10))
        lists = d.lists
        proxy.cut()
        fs.wait_until(lambda: d.stale, "stale behind the cut proxy", 10)
        self.etcd.put(PREFIX + "b", value("draining", 7001))
        self.etcd.put(PREFIX + "c", value("serving", 7002))
        self.etcd.ctl("del", PREFIX + "b")
        proxy.mend()
        self.assertTrue(d.wait(lambda us: ids(us) == ["c"], 15), ids(d.units()))
        self.assertEqual(history[-3:], [{"b": "draining"}, {"b": "draining", "c": "serving"},
                                        {"c": "serving"}])
        self.assertEqual(d.lists, lists)
        fs.wait_until(lambda: d.revision == self.etcd.revision(), "the directory's revision", 5)

    def test_compaction_past_the_watch(self):
        proxy = fs.Proxy(self.etcd.client_port)
        self.addCleanup(proxy.close)
        self.unit("--unit-id", "stay")
        gone = self.unit("--unit-id", "gone", "--lease-ttl", "2")
        d = self.directory(etcd=proxy.url, heartbeat=0.5)
        self.assertTrue(d.wait(lambda us: ids(us) == ["gone", "stay"], 10))
        lists = d.lists
        proxy.cut()
        fs.wait_until(lambda: d.stale, "stale behind the cut proxy", 10)
        gone.stop()
        self.unit("--unit-id", "new")
        fs.wait_until(lambda: set(self.etcd.get_prefix(PREFIX)) == {PREFIX + "stay",
                                                                     PREFIX + "new"},
                      "the membership to change in etcd", 10)
        rev = self.etcd.revision()
        self.etcd.ctl("compaction", str(rev))
        proxy.mend()
        self.assertTrue(d.wait(lambda us: ids(us) == ["new", "stay"], 15), ids(d.units()))
        self.assertGreater(d.lists, lists)
        fs.wait_until(lambda: not d.stale, "the directory back", 10)


class Hostile(Base):
    def test_bad_values_skipped_counted_logged_once(self):
        good = json.dumps({"address": "tcp://127.0.0.1:5", "state": "serving",
                           "service": "storage"})
        bad = {
            "notjson": "not json at all",
            "array": "[1, 2, 3]",
            "noaddr": json.dumps({"state": "serving"}),
            "udp": json.dumps({"address": "udp://127.0.0.1:5", "state": "serving"}),
            "addrnum": json.dumps({"address": 5, "state": "serving"}),
            "nostate": json.dumps({"address": "tcp://127.0.0.1:5"}),
            "huge": json.dumps({"address": "tcp://127.0.0.1:5", "state": "serving",
                                "pad": "x" * 5000}),
            "other": json.dumps({"address": "tcp://127.0.0.1:5", "state": "serving",
                                 "service": "billing"}),
            "binary": b"\xff\xfe\x00\x01garbage",
            "a/b": good,  # a key with more parts
            ".dot": good,  # a unit id that breaks the name rule
            # The same as the C reader skips (tests/fleet/test_fleet.c).
            "tcponly": json.dumps({"address": "tcp://", "state": "serving"}),
            "nul": json.dumps({"address": "tcp://127.0.0.1:5\u0000", "state": "serving"}),
            "twice": '{"address": "tcp://127.0.0.1:5", "state": "serving", "state": "x"}',
            "bigpid": json.dumps({"address": "tcp://127.0.0.1:5", "state": "serving",
                                  "pid": 10 ** 23}),
        }
        for k, v in bad.items():
            self.etcd.put(PREFIX + k, v)
        self.etcd.put(PREFIX + "good", good)
        # An empty state is a string too: listed, not serving.
        self.etcd.put(PREFIX + "blank", json.dumps({"address": "tcp://127.0.0.1:6",
                                                    "state": ""}))
        self.etcd.put("/ctlrpc/v1/default/storage2/x", good)
        # Megabytes under the prefix: skipped too.
        self.etcd.put(PREFIX + "mega", b"{" + b" " * (1 << 20) + b"}")
        logs = io.StringIO()
        handler = logging.StreamHandler(logs)
        logging.getLogger("ctlrpc").addHandler(handler)
        self.addCleanup(logging.getLogger("ctlrpc").removeHandler, handler)
        d = self.directory()
        self.assertEqual(ids(d.units()), ["blank", "good"])
        self.assertEqual(d.addresses(), ["tcp://127.0.0.1:5"])
        self.assertEqual(d.skipped, len(bad) + 1)
        # Bad data arriving on the watch: skipped too; a unit overwritten with garbage goes.
        self.etcd.put(PREFIX + "later", "{broken")
        self.etcd.put(PREFIX + "good", "{broken")
        self.assertTrue(d.wait(lambda us: ids(us) == ["blank"], 10), ids(d.units()))
        fs.wait_until(lambda: d.skipped == len(bad) + 3, "the later values counted", 5)
        self.assertEqual(logs.getvalue().count("skipping"), 1, logs.getvalue())
        # The listing, without a watch, says the same.
        got = cdir.list_units(self.etcd.url, "storage")
        self.assertEqual(sorted(got.units), ["blank"])
        self.assertEqual(got.skipped, len(bad) + 3)


class Secure(unittest.TestCase):
    def setUp(self):
        self.tmp = fs.TempDir()
        self.addCleanup(self.tmp.close)
        self.units = []

    def tearDown(self):
        for u in self.units:
            u.kill()

    def test_https_with_client_certificates(self):
        pki = fs.Pki(os.path.join(self.tmp.path, "pki"))
        etcd = fs.Etcd(self.tmp.path, pki=pki, client_cert_auth=True)
        self.addCleanup(etcd.close)
        u = py_unit(etcd.url, "--unit-id", "tls", "--etcd-cacert", pki.ca, "--etcd-cert",
                    pki.client, "--etcd-key", pki.client_key)
        self.units.append(u)
        e = ctlrpc.Etcd(etcd.url, cacert=pki.ca, cert=pki.client, key=pki.client_key)
        d = ctlrpc.Directory(e, "storage")
        self.addCleanup(d.close)
        self.assertTrue(d.wait(lambda us: ids(us) == ["tls"], 10))
        self.assertEqual(d.addresses(), [u.address])
        # Without the CA the server's certificate is refused; without a client certificate
        # the server refuses: both name the endpoint.
        with self.assertRaises(ctlrpc.EtcdUnreachable) as cm:
            ctlrpc.Directory(etcd.url, "storage", start_timeout=0.3)
        self.assertIn(etcd.url, str(cm.exception))
        self.assertIn("TLS", str(cm.exception))
        with self.assertRaises(ctlrpc.EtcdUnreachable) as cm:
            ctlrpc.Directory(ctlrpc.Etcd(etcd.url, cacert=pki.ca), "storage",
                             start_timeout=0.3)
        self.assertIn(etcd.url, str(cm.exception))
        with self.assertRaisesRegex(ValueError, "nothere.pem"):
            ctlrpc.Etcd(etcd.url, cacert=os.path.join(self.tmp.path, "nothere.pem"))

    def test_user_with_password(self):
        etcd = fs.Etcd(self.tmp.path)
        self.addCleanup(etcd.close)
        etcd.ctl("user", "add", "root:rootpw")
        etcd.ctl("user", "add", "unit:s3cret")
        etcd.ctl("role", "add", "fleet")
        etcd.ctl("role", "grant-permission", "fleet", "--prefix=true", "readwrite",
                 "/ctlrpc/v1/default/")
        etcd.ctl("user", "grant-role", "unit", "fleet")
        etcd.ctl("auth", "enable", user="root:rootpw")
        u = py_unit(etcd.url, "--unit-id", "auth", "--etcd-user", "unit",
                    env={"CTLRPC_ETCD_PASSWORD": "s3cret"})
        self.units.append(u)
        d = ctlrpc.Directory(ctlrpc.Etcd(etcd.url, user="unit", password="s3cret"), "storage")
        self.addCleanup(d.close)
        self.assertTrue(d.wait(lambda us: ids(us) == ["auth"], 10))
        with self.assertRaisesRegex(ctlrpc.EtcdError, "unit.*cannot log in"):
            ctlrpc.Directory(ctlrpc.Etcd(etcd.url, user="unit", password="wrong"), "storage")
        with self.assertRaisesRegex(ctlrpc.EtcdError, "permission denied|user name"):
            ctlrpc.Directory(etcd.url, "storage")  # no user: refused
        env = dict(os.environ)
        env.pop("CTLRPC_ETCD_PASSWORD", None)
        r = subprocess.run([sys.executable, OPTS.pyunit, "--module-dir", OPTS.module_dir,
                            "--etcd", etcd.url, "--etcd-user", "unit"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
        self.assertEqual(r.returncode, 2)
        self.assertIn(b"CTLRPC_ETCD_PASSWORD", r.stderr)


class Cross(Base):
    def setUp(self):
        if not OPTS.cunit or not OPTS.ccli:
            why = "the C programs are not built with etcd (CTLRPC_WITH_ETCD)"
            if fs.etcd_required():
                self.fail(f"{why}, and CTLRPC_REQUIRE_ETCD=1")
            self.skipTest(why)
        super().setUp()

    def c_unit(self, *extra, etcd=None):
        u = support.Process([OPTS.cunit, "--bind", "tcp://127.0.0.1:0", "--etcd",
                             etcd or self.etcd.url, *extra])
        self.units.append(u)
        return u

    def ccli(self, *args):
        r = subprocess.run([OPTS.ccli, "--etcd", self.etcd.url, "--service", "storage",
                            "--timeout", "5000", *args], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=30)
        return r.returncode, r.stdout.decode(), r.stderr.decode()

    def test_sigterm_with_etcd_frozen_is_bounded(self):
        """etcd frozen (SIGSTOP), two endpoints given (the same etcd twice): a C and a Python
        unit stopped with SIGTERM wait at most 2 s for etcd in all (the draining mark, then
        the revoke), not a request's deadline for each call and each endpoint, and exit 0;
        the key is left to its lease."""
        twice = f"{self.etcd.url},{self.etcd.url}"
        units = {"c": self.c_unit("--unit-id", "fc", "--lease-ttl", "30", "--drain-timeout",
                                  "300", etcd=twice),
                 "py": self.unit("--unit-id", "fp", "--lease-ttl", "30", "--drain-timeout",
                                 "300", etcd=twice)}
        d = self.directory()
        self.assertTrue(d.wait(lambda us: ids(us) == ["fc", "fp"], 10), ids(d.units()))
        self.etcd.pause()
        try:
            took = {}
            for name, u in units.items():
                t0 = time.monotonic()
                u.proc.send_signal(signal.SIGTERM)
                self.assertEqual(u.proc.wait(timeout=20), 0, name)
                took[name] = time.monotonic() - t0
        finally:
            self.etcd.resume()
        for name, t in took.items():
            # 2 s for etcd, the 0.3 s drain, and room for a loaded machine (a request's
            # deadline for each call to each endpoint was 6 to 8 s).
            self.assertLess(t, 5.0, f"the {name} unit took {t:.1f} s")

    def test_c_units_seen_by_python(self):
        history = []
        d = self.directory(on_change=lambda us: history.append({u.unit_id: u.state
                                                                for u in us}))
        c1 = self.c_unit("--unit-id", "c1", "--lease-ttl", "2")
        c2 = self.c_unit("--unit-id", "c2", "--lease-ttl", "10")
        p1 = self.unit("--unit-id", "p1")
        self.assertTrue(d.wait(lambda us: ids(us) == ["c1", "c2", "p1"], 10), ids(d.units()))
        by = {u.unit_id: u for u in d.units()}
        sys.path.insert(0, OPTS.module_dir)
        import storage_ctl
        self.assertEqual(by["c1"].address, c1.address)
        self.assertEqual(by["c1"].pid, c1.proc.pid)
        self.assertEqual(by["c1"].idl_hash, storage_ctl._IDL_SHA256)
        self.assertEqual(by["c1"].idl_hash, by["p1"].idl_hash)
        self.assertEqual(set(by["c1"].fields), set(by["p1"].fields))
        self.assertEqual(sorted(d.addresses()), sorted([c1.address, c2.address, p1.address]))
        # SIGKILL: gone within its TTL + 1 s; SIGTERM: draining, then gone at once.
        c1.proc.kill()
        self.assertTrue(d.wait(lambda us: "c1" not in ids(us), 3.0))
        c2.proc.send_signal(signal.SIGTERM)
        self.assertTrue(d.wait(lambda us: "c2" not in ids(us), 5.0))
        self.assertIn("draining", [h.get("c2") for h in history])
        self.assertEqual(ids(d.units()), ["p1"])

    def test_python_units_seen_by_c(self):
        p1 = self.unit("--unit-id", "p1")
        p2 = self.unit("--unit-id", "p2", "--lease-ttl", "2")
        c1 = self.c_unit("--unit-id", "c1")
        fs.wait_until(lambda: len(self.etcd.get_prefix(PREFIX)) == 3, "three units", 10)
        status, out, err = self.ccli("stats")
        self.assertEqual(status, 0, err)
        for u in (p1, p2, c1):
            self.assertIn(u.address, out)
        status, out, err = self.ccli("put", "k", "hello")  # one unit only, and there are 3
        self.assertEqual(status, 2, err)
        self.assertIn("3 serving units", err)
        p2.proc.kill()
        fs.wait_until(lambda: p2.address not in self.ccli("stats")[1], "p2 gone for C", 5)
        p1.proc.send_signal(signal.SIGTERM)
        self.assertEqual(p1.proc.wait(timeout=10), 0)
        status, out, err = self.ccli("stats")
        self.assertEqual(status, 0, err)
        self.assertNotIn(p1.address, out)
        self.assertIn(c1.address, out)


def main():
    global OPTS
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--pyunit", required=True)
    ap.add_argument("--module-dir", required=True)
    ap.add_argument("--cunit", default="")
    ap.add_argument("--ccli", default="")
    OPTS, rest = ap.parse_known_args()
    argv = [sys.argv[0]] + rest
    status = fs.without_etcd("test_fleet.py")
    if status is not None:
        sys.exit(status)
    support.run_tests(argv)


if __name__ == "__main__":
    main()
