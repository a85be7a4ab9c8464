"""The ctl-storage command line against real ctl-storage-unit processes.

    test_cli.py --unit PATH/ctl-storage-unit --cli PATH/ctl-storage [unittest args]
    test_cli.py --unit "/usr/bin/python3 examples/storage/unit.py --module-dir DIR" --cli ...

--unit is a command: a program, or one with its interpreter and options (split as a
shell splits words, so quote a path with spaces); the tests append their options.

Every command in text and JSON form (JSON is parsed, not grepped), every
error kind with its exit status (0 ok, 1 local, 2 usage, 3 UnitFull,
4 Busy, 5 Missing, 6 Transfer, 7 timeout), usage errors, and stats/list
fanned out over several units including a dead address.

Units bind tcp://127.0.0.1:0; the test reads the endpoint each prints as its
first line instead of sleeping. Deadlines are generous for a loaded machine.
Needs only the standard library.
"""

import argparse
import base64
import json
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

# The Python tests' helpers (no ctlrpc import): one have_ipv6_loopback and dead_address
# for every suite.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import support  # noqa: E402

UNIT = None
CLI = None
START_S = 20      # a unit must print its endpoint within this
RUN_S = 30        # any one CLI run must end within this
EXIT = {"ok": 0, "local": 1, "usage": 2, "UnitFull": 3, "Busy": 4,
        "Missing": 5, "Transfer": 6, "timeout": 7, "unreachable": 8, "auth": 9}


class Unit:
    """One ctl-storage-unit process."""

    def __init__(self, capacity="64M", spill_dir=None, extra=(), bind="tcp://127.0.0.1:0"):
        args = UNIT + ["--bind", bind, "--capacity", capacity]
        if spill_dir:
            args += ["--spill-dir", spill_dir]
        args += list(extra)
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE)
        self.address = self._read_endpoint()

    def _read_endpoint(self):
        fd = self.proc.stdout.fileno()
        buf = b""
        deadline = time.monotonic() + START_S
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise RuntimeError("unit did not print its endpoint")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1)
                if not chunk:
                    raise RuntimeError("unit exited before printing its endpoint")
                buf += chunk
        return buf.decode().strip()

    def freeze(self):
        """SIGSTOP, and wait until every thread has stopped (kill returns
        before that, and a thread still running could answer a call)."""
        self.proc.send_signal(signal.SIGSTOP)
        _, status = os.waitpid(self.proc.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status), status

    def stop(self):
        """SIGTERM; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
        try:
            return self.proc.wait(timeout=START_S)
        finally:
            self.proc.stdout.close()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=START_S)
        self.proc.stdout.close()


class Result:
    def __init__(self, proc):
        self.status = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr.decode(errors="replace")

    @property
    def text(self):
        return self.out.decode(errors="replace")

    def json(self):
        return json.loads(self.out.decode())


def cli(*args, addresses=(), stdin=None):
    argv = [CLI]
    for a in addresses:
        argv += ["--address", a]
    argv += list(args)
    proc = subprocess.run(argv, input=stdin, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=RUN_S)
    return Result(proc)


class CliCase(unittest.TestCase):
    """A fresh temporary directory and the units a test starts in it."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ctl-cli-test.")
        self.units = []

    def tearDown(self):
        try:
            for u in self.units:
                status = u.stop()
                self.assertEqual(status, 0, "unit exit status")
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def unit(self, **kw):
        u = Unit(**kw)
        self.units.append(u)
        return u

    def file(self, name, data):
        path = os.path.join(self.tmp, name)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def run_ok(self, u, *args, stdin=None):
        r = cli(*args, addresses=[u.address], stdin=stdin)
        self.assertEqual(r.status, 0, "ctl-storage %s: %s" % (" ".join(args), r.err))
        return r

    def run_fail(self, u, status, *args, stdin=None):
        r = cli(*args, addresses=[u.address], stdin=stdin)
        self.assertEqual(r.status, status, "ctl-storage %s: %r %r" % (" ".join(args), r.text, r.err))
        return r

    def wait_for(self, check, what):
        """Poll `check` (notifies arrive on another connection than the
        next CLI run's, so their effect is waited for)."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if check():
                return
            time.sleep(0.05)
        self.fail("timed out waiting for " + what)


class TestUsage(CliCase):

    def usage(self, *args, expect=None):
        r = cli(*args)
        self.assertEqual(r.status, EXIT["usage"], (args, r.err))
        self.assertIn("ctl-storage", r.err)
        if expect:
            self.assertIn(expect, r.err)
        self.assertEqual(r.out, b"")
        return r

    def test_usage_errors(self):
        a = ["--address", "tcp://127.0.0.1:1"]
        self.usage(expect="no command given")
        self.usage(*a, expect="no command given")
        self.usage("stats", expect="no --address given")
        self.usage(*a, "frobnicate", expect="unknown command 'frobnicate'")
        self.usage(*a, "--timeout", "soon", "stats", expect="--timeout 'soon'")
        self.usage(*a, "--timeout", "-1", "stats", expect="--timeout")
        self.usage(*a, "--timeout", "nan", "stats", expect="--timeout")
        self.usage(*a, "--timeout", "inf", "stats", expect="--timeout")
        self.usage(*a, "--timeout", "5m", "stats", expect="--timeout")
        self.usage(*a, "--bogus", "stats", expect="usage:")
        self.usage(*a, "--retries", "x", "stats", expect="--retries 'x'")
        self.usage(*a, "--retries", "-1", "stats", expect="--retries '-1'")
        self.usage(*a, "--retries", "101", "stats", expect="--retries '101'")
        self.usage(*a, "put", expect="usage: put")
        self.usage(*a, "put", "k", expect="usage: put")
        self.usage(*a, "put", "k", "f", "extra", expect="usage: put")
        self.usage(*a, "put", "--bogus", "k", "f", expect="put: unknown option")
        self.usage(*a, "get", "k", "--bogus", expect="--bogus")
        self.usage(*a, "get", "k", "-o", expect="-o")
        self.usage(*a, *a, "put", "k", "/dev/null", expect="exactly one --address")
        self.usage(*a, "get", expect="usage: get")
        self.usage(*a, *a, "get", "k", expect="exactly one --address")
        for cmd in ("describe", "pin", "unpin", "abort", "delete"):
            self.usage(*a, cmd, expect="usage: %s" % cmd)
            self.usage(*a, *a, cmd, "k", expect="exactly one --address")
        self.usage(*a, "stats", "extra", expect="unexpected argument 'extra'")
        self.usage(*a, "list", "extra", expect="unexpected argument 'extra'")
        self.usage(*a, "list", "--prefix", expect="--prefix")
        self.usage(*a, "list", "--bogus", expect="list: unknown option")

    def test_help(self):
        r = cli("--help")
        self.assertEqual(r.status, 0)
        self.assertIn("usage: ctl-storage", r.text)
        for cmd in ("put", "get", "describe", "pin", "unpin", "abort", "delete",
                    "list", "stats"):
            self.assertIn("  " + cmd, r.text)

    def test_unit_stops_on_sigint(self):
        spill = os.path.join(self.tmp, "spill")
        u = Unit(capacity="10", spill_dir=spill)
        try:
            r = cli("put", "k", "-", addresses=[u.address], stdin=b"x" * 100)
            self.assertEqual(r.status, 0, r.err)
            self.assertEqual(len(os.listdir(spill)), 1)
        finally:
            u.proc.send_signal(signal.SIGINT)
            self.assertEqual(u.proc.wait(timeout=START_S), 0)
            u.proc.stdout.close()
        self.assertEqual(os.listdir(spill), [])

    def test_unit_usage_errors(self):
        for args in (["--capacity", "lots"], ["--max-msg-bytes", "0"], ["extra"],
                     ["--bogus"]):
            p = subprocess.run(UNIT + args, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=RUN_S)
            self.assertEqual(p.returncode, 2, args)
            self.assertEqual(p.stdout, b"")
            self.assertIn(b"ctl-storage-unit", p.stderr)
        # A spill directory that cannot be created: a local failure, exit 1.
        p = subprocess.run(UNIT + ["--bind", "tcp://127.0.0.1:0", "--spill-dir",
                            os.path.join(self.tmp, "no", "such", "dir")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=RUN_S)
        self.assertEqual(p.returncode, 1)
        self.assertIn(b"spill directory", p.stderr)


class TestStartAndAddresses(CliCase):
    """Mistakes of the command line said before anything else is printed, and a bind address
    that cannot work named for what it is."""

    def test_address_without_scheme(self):
        for cmd in (["stats"], ["list"], ["get", "k"]):
            r = cli(*cmd, addresses=["127.0.0.1:1"])
            self.assertEqual(r.status, EXIT["usage"], (cmd, r.err))
            self.assertEqual(r.out, b"", cmd)  # no table header before the error
            self.assertIn("ctl-storage: --address: endpoint '127.0.0.1:1' is not "
                          "tcp://host:port", r.err)
        r = cli("stats", addresses=["tcp://127.0.0.1:1", "127.0.0.1:2"])
        self.assertEqual((r.status, r.out), (EXIT["usage"], b""), r.err)
        self.assertIn("'127.0.0.1:2'", r.err)

    def test_bind_host_that_does_not_resolve(self):
        r = subprocess.run(UNIT + ["--bind", "tcp://nosuchhost.invalid:4100"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=RUN_S)
        self.assertEqual(r.returncode, 1, r.stderr)
        err = r.stderr.decode()
        self.assertIn("cannot bind tcp://nosuchhost.invalid:4100: host 'nosuchhost.invalid' "
                      "does not resolve", err)
        self.assertNotIn("No such device", err)


class TestCommands(CliCase):

    def setUp(self):
        super().setUp()
        self.u = self.unit()

    def test_put_get_text(self):
        u = self.u
        blob = bytes(range(256)) * 40 + b"\0\0end"
        path = self.file("blob.bin", blob)
        r = self.run_ok(u, "put", "bin", path)
        self.assertEqual(r.text, "stored %d bytes under 'bin'\n" % len(blob))
        r = self.run_ok(u, "put", "from-stdin", "-", stdin=b"piped\0bytes")
        self.assertEqual(r.text, "stored 11 bytes under 'from-stdin'\n")
        r = self.run_ok(u, "put", "pinned", path, "--pin")
        self.assertEqual(r.text, "stored %d bytes under 'pinned' (pinned)\n" % len(blob))
        r = self.run_ok(u, "put", "--pin", "empty", "/dev/null")
        self.assertEqual(r.text, "stored 0 bytes under 'empty' (pinned)\n")

        # get writes the blobs, concatenated in the order asked, to stdout.
        self.assertEqual(self.run_ok(u, "get", "bin").out, blob)
        self.assertEqual(self.run_ok(u, "get", "from-stdin", "empty", "bin").out,
                         b"piped\0bytes" + blob)
        # ... or to a file.
        out = os.path.join(self.tmp, "out.bin")
        r = self.run_ok(u, "get", "bin", "from-stdin", "-o", out)
        self.assertEqual(r.text, "wrote %d bytes (2 blobs) to %s\n" % (len(blob) + 11, out))
        with open(out, "rb") as f:
            self.assertEqual(f.read(), blob + b"piped\0bytes")

    def test_put_get_json(self):
        u = self.u
        blob = os.urandom(3000)
        path = self.file("blob.bin", blob)
        key = 'we"ird\\key\twith\nstuff \u00e9'
        self.assertEqual(self.run_ok(u, "--json", "put", key, path).json(),
                         {"key": key, "stored": 3000, "pinned": False})
        self.assertEqual(self.run_ok(u, "--json", "put", "p", "-", "--pin",
                                     stdin=b"xy").json(),
                         {"key": "p", "stored": 2, "pinned": True})
        got = self.run_ok(u, "--json", "get", key, "p", key).json()
        self.assertEqual([b["key"] for b in got["blobs"]], [key, "p", key])
        self.assertEqual([b["size"] for b in got["blobs"]], [3000, 2, 3000])
        self.assertEqual([base64.b64decode(b["base64"]) for b in got["blobs"]],
                         [blob, b"xy", blob])
        out = os.path.join(self.tmp, 'out "file".bin')
        self.assertEqual(self.run_ok(u, "--json", "get", "p", "-o", out).json(),
                         {"written": 2, "file": out})
        with open(out, "rb") as f:
            self.assertEqual(f.read(), b"xy")
        # Padding: lengths 0, 1, 2 (mod 3) all round-trip.
        for n in (0, 1, 2, 3, 4, 5):
            data = os.urandom(n)
            self.run_ok(u, "put", "pad", "-", stdin=data)
            b = self.run_ok(u, "--json", "get", "pad").json()["blobs"][0]
            self.assertEqual(base64.b64decode(b["base64"]), data)

    def test_put_large_file(self):
        """A file of 64 KiB and more is read into a ctl_blob and sent from
        it; the bytes come back whole, pinned or not, as from stdin."""
        u = self.u
        blob = os.urandom((1 << 20) + 3)
        path = self.file("large.bin", blob)
        self.assertEqual(self.run_ok(u, "put", "large", path).text,
                         "stored %d bytes under 'large'\n" % len(blob))
        self.run_ok(u, "put", "large-pinned", path, "--pin")
        self.run_ok(u, "put", "large-stdin", "-", stdin=blob)
        for key in ("large", "large-pinned", "large-stdin"):
            out = os.path.join(self.tmp, key + ".out")
            self.run_ok(u, "get", key, "-o", out)
            with open(out, "rb") as f:
                self.assertEqual(f.read(), blob, key)
        got = self.run_ok(u, "--json", "describe", "large-pinned").json()
        self.assertEqual(got[0]["size"], len(blob))
        self.assertTrue(got[0]["pinned"])

    def test_describe(self):
        u = self.u
        self.run_ok(u, "put", "small", "-", stdin=b"12345")
        self.run_ok(u, "put", "pinned", "-", "--pin", stdin=b"x" * 100)
        r = self.run_ok(u, "describe", "small", "pinned")
        lines = r.text.splitlines()
        self.assertEqual(lines[0].split(), ["KEY", "SIZE", "PINNED", "SPILLED"])
        self.assertEqual(lines[1].split(), ["small", "5", "no", "no"])
        self.assertEqual(lines[2].split(), ["pinned", "100", "yes", "no"])
        self.assertEqual(len(lines), 3)
        self.assertEqual(self.run_ok(u, "--json", "describe", "pinned", "small").json(), [
            {"key": "pinned", "size": 100, "pinned": True, "spilled": False},
            {"key": "small", "size": 5, "pinned": False, "spilled": False}])

    def test_pin_unpin_abort_delete(self):
        u = self.u
        for k in ("a", "b", "c", "d"):
            self.run_ok(u, "put", k, "-", stdin=k.encode())
        self.assertEqual(self.run_ok(u, "pin", "a", "b", "a").text, "pinned 2 blobs\n")
        self.assertEqual(self.run_ok(u, "--json", "pin", "c").json(), {"pinned": 1})
        self.assertEqual(self.run_ok(u, "pin", "c").text, "pinned 1 blob\n")

        def pinned(k):
            return self.run_ok(u, "--json", "describe", k).json()[0]["pinned"]

        r = self.run_ok(u, "unpin", "a", "unknown")
        self.assertEqual(r.text, "sent unpin for 2 keys (notify: the unit does not reply)\n")
        self.wait_for(lambda: not pinned("a"), "unpin a")
        self.assertEqual(self.run_ok(u, "--json", "unpin", "c").json(),
                         {"sent": "unpin", "keys": 1})
        self.wait_for(lambda: not pinned("c"), "unpin c")

        # abort drops the unpinned (a, c) and keeps the pinned (b).
        r = self.run_ok(u, "abort", "a", "b")
        self.assertEqual(r.text, "sent abort for 2 keys (notify: the unit does not reply)\n")
        self.assertEqual(self.run_ok(u, "--json", "abort", "c").json(),
                         {"sent": "abort", "keys": 1})
        self.wait_for(lambda: self.run_ok(u, "list").text == "b\nd\n", "abort")

        # delete: Busy while any named blob is pinned; nothing is deleted.
        r = self.run_fail(u, EXIT["Busy"], "delete", "d", "b")
        self.assertEqual(r.out, b"")
        self.assertIn("ctl-storage: Busy:", r.err)
        self.assertIn("pinned", r.err)
        self.assertEqual(self.run_ok(u, "list").text, "b\nd\n")
        self.assertEqual(self.run_ok(u, "delete", "d", "nope").text, "deleted 1 blob\n")
        self.run_ok(u, "unpin", "b")
        self.wait_for(lambda: not pinned("b"), "unpin b")
        self.assertEqual(self.run_ok(u, "--json", "delete", "b").json(), {"deleted": 1})
        self.assertEqual(self.run_ok(u, "delete", "b").text, "deleted 0 blobs\n")

    def put_raw(self, u, keys, window=500):
        """Put empty blobs under `keys` straight over the wire, pipelined (a
        CLI process per key would take minutes), at most `window` unanswered
        at a time: past its queue of replies (max_queued_replies, 1000, the
        ROUTER's high-water mark) a unit drops the replies of a client that
        does not read them, as ZeroMQ does."""
        import msgpack
        import zmq
        ctx = zmq.Context()
        s = ctx.socket(zmq.DEALER)
        try:
            s.setsockopt(zmq.LINGER, 0)
            s.connect(u.address)
            sent = 0
            for n in range(len(keys)):
                while sent < len(keys) and sent - n < window:
                    s.send(msgpack.packb(["put", "%012x" % sent,
                                          {"key": keys[sent], "data": b""}],
                                         use_bin_type=True))
                    sent += 1
                self.assertTrue(s.poll(10000), "no reply to put %d of %d" % (n + 1, len(keys)))
                reply = msgpack.unpackb(s.recv(), raw=False)
                self.assertTrue(reply[1], reply)
        finally:
            s.close()  # before term(), which waits for every socket: a failure ends, not hangs
            ctx.term()

    def test_list_pages_through(self):
        # More keys than one page (1000): the CLI asks again after the last
        # key it got until a page comes back empty, and prints them all.
        u = self.u
        keys = ["k%05d" % i for i in range(2500)] + ["other"]
        self.put_raw(u, keys)
        self.assertEqual(self.run_ok(u, "list", "--prefix", "k").text.splitlines(), keys[:-1])
        got = self.run_ok(u, "--json", "list").json()
        self.assertEqual(got, [{"address": u.address, "keys": sorted(keys)}])
        # Exactly a page's worth: the last page is empty.
        self.assertEqual(len(self.run_ok(u, "list", "--prefix", "k01").text.splitlines()), 1000)

    def test_list_unit_pages_smaller(self):
        # A unit whose page limit (--max-list-keys 7) is below the CLI's
        # page of 1000 answers every page short: a short page is not the
        # end, only an empty one is, so no key is lost.
        u = self.unit(extra=["--max-list-keys", "7"])
        keys = ["k%03d" % i for i in range(30)]
        self.put_raw(u, keys)
        self.assertEqual(self.run_ok(u, "list").text.splitlines(), keys)
        r = self.run_ok(u, "--verbose", "list", "--prefix", "k00")
        self.assertEqual(r.text.splitlines(), keys[:10])
        self.assertIn("listed in 2 pages", r.err)

    def test_list(self):
        u = self.u
        for k in ("b/2", "a", "b/10", "ab", "b", "b/1", "c"):
            self.run_ok(u, "put", k, "/dev/null")
        self.assertEqual(self.run_ok(u, "list").text, "a\nab\nb\nb/1\nb/10\nb/2\nc\n")
        self.assertEqual(self.run_ok(u, "list", "--prefix", "b/").text, "b/1\nb/10\nb/2\n")
        self.assertEqual(self.run_ok(u, "list", "--prefix", "zz").text, "")
        self.assertEqual(self.run_ok(u, "--json", "list", "--prefix", "a").json(),
                         [{"address": u.address, "keys": ["a", "ab"]}])
        self.assertEqual(self.run_ok(u, "--json", "list").json()[0]["keys"],
                         ["a", "ab", "b", "b/1", "b/10", "b/2", "c"])

    def test_stats(self):
        u = self.u
        self.run_ok(u, "put", "k", "-", stdin=b"x" * 10)
        self.run_ok(u, "put", "p", "-", "--pin", stdin=b"y" * 5)
        r = self.run_ok(u, "stats")
        lines = r.text.splitlines()
        self.assertEqual(lines[0].split(), ["UNIT", "BLOBS", "BYTES", "CAPACITY", "PINNED",
                                            "SPILLED", "REQUESTS", "DROPPED", "INDEX_BYTES"])
        row = lines[1].split()
        self.assertEqual(row[0], u.address)
        self.assertEqual(row[1:6], ["2", "15", str(64 << 20), "1", "0"])
        self.assertEqual(row[7], "0")
        self.assertEqual(len(lines), 2)
        s = self.run_ok(u, "--json", "stats").json()
        self.assertEqual(len(s), 1)
        s = s[0]
        requests = s.pop("requests")
        index_bytes = s.pop("index_bytes")
        self.assertEqual(s, {"address": u.address, "blobs": 2, "bytes": 15,
                             "capacity": 64 << 20, "pinned": 1, "spilled": 0, "dropped": 0,
                             "index_capacity": 64 << 20})
        self.assertEqual(requests, int(row[6]) + 1)
        # Two one-byte keys and their bookkeeping, as the table says.
        self.assertEqual(index_bytes, int(row[8]))
        self.assertGreater(index_bytes, 2)
        self.assertLess(index_bytes, 1024)

    def test_missing(self):
        u = self.u
        self.run_ok(u, "put", "here", "-", stdin=b"x")
        for cmd in ("get", "describe", "pin"):
            r = self.run_fail(u, EXIT["Missing"], cmd, "here", "gone", "also-gone")
            self.assertEqual(r.out, b"")
            self.assertIn("ctl-storage: Missing: %s at %s" % (cmd, u.address), r.err)
            self.assertIn("[missing: gone also-gone]", r.err)
            r = self.run_fail(u, EXIT["Missing"], "--json", cmd, "gone", "here", "x")
            e = r.json()["error"]
            self.assertEqual(e["kind"], "Missing")
            self.assertEqual(e["blobs"], ["gone", "x"])
            self.assertNotIn("reason", e)
            self.assertIn(cmd, e["msg"])
        # pin pinned nothing.
        self.assertFalse(self.run_ok(u, "--json", "describe", "here").json()[0]["pinned"])

    def test_busy_put_pinned(self):
        u = self.u
        self.run_ok(u, "put", "p", "-", "--pin", stdin=b"first")
        r = self.run_fail(u, EXIT["Busy"], "put", "p", "-", stdin=b"second")
        self.assertIn("ctl-storage: Busy: put at %s" % u.address, r.err)
        r = self.run_fail(u, EXIT["Busy"], "--json", "put", "p", "-", stdin=b"second")
        e = r.json()["error"]
        self.assertEqual((e["kind"], e["reason"]), ("Busy", "pinned"))
        self.assertNotIn("blobs", e)
        self.assertEqual(self.run_ok(u, "get", "p").out, b"first")

    def test_retries(self):
        u = self.u
        self.run_ok(u, "put", "r", "-", "--pin", stdin=b"first")
        # Busy is retried only with --retry-busy; the message counts.
        r = self.run_fail(u, EXIT["Busy"], "--retries", "2", "put", "r", "-",
                          stdin=b"second")
        self.assertNotIn("attempts", r.err)
        r = self.run_fail(u, EXIT["Busy"], "--retries", "2", "--retry-busy",
                          "put", "r", "-", stdin=b"second")
        self.assertIn("(after 3 attempts)", r.err)
        # Refused: nothing was sent, so any op goes again.
        r = cli("--retries", "1", "--timeout", "20s", "stats",
                addresses=[support.dead_address()])
        self.assertEqual(r.status, EXIT["unreachable"], r.err)
        self.assertIn("nothing was sent (after 2 attempts)", r.text + r.err)
        self.assertIn("--retries N", cli("--help").text)

    def test_local_failures(self):
        u = self.u
        r = self.run_fail(u, EXIT["local"], "put", "k", os.path.join(self.tmp, "absent"))
        self.assertIn("cannot open", r.err)
        self.run_ok(u, "put", "k", "-", stdin=b"v")
        r = self.run_fail(u, EXIT["local"], "get", "k", "-o",
                          os.path.join(self.tmp, "no-dir", "out"))
        self.assertIn("cannot open", r.err)
        self.assertEqual(self.run_ok(u, "list").text, "k\n")

    def test_timeout(self):
        u = self.u
        self.run_ok(u, "put", "k", "-", stdin=b"v")
        u.freeze()
        try:
            t0 = time.monotonic()
            r = self.run_fail(u, EXIT["timeout"], "--timeout", "300ms", "get", "k")
            self.assertLess(time.monotonic() - t0, RUN_S / 2)
            self.assertIn("ctl-storage: Timeout: get at %s" % u.address, r.err)
            r = self.run_fail(u, EXIT["timeout"], "--json", "--timeout", "0.3", "stats")
            row = r.json()[0]
            self.assertEqual(row["address"], u.address)
            self.assertEqual(row["error"]["kind"], "Timeout")
        finally:
            u.proc.send_signal(signal.SIGCONT)
        self.assertEqual(self.run_ok(u, "--timeout", "10s", "get", "k").out, b"v")


class TestErrorKinds(CliCase):

    def test_unit_full(self):
        u = self.unit(capacity="1000")
        self.run_ok(u, "put", "a", "-", stdin=b"x" * 600)
        r = self.run_fail(u, EXIT["UnitFull"], "put", "b", "-", stdin=b"y" * 600)
        self.assertIn("ctl-storage: UnitFull: put at %s" % u.address, r.err)
        r = self.run_fail(u, EXIT["UnitFull"], "--json", "put", "b", "-", stdin=b"y" * 401)
        e = r.json()["error"]
        self.assertEqual(e["kind"], "UnitFull")
        self.assertNotIn("reason", e)
        self.run_ok(u, "put", "b", "-", stdin=b"y" * 400)
        self.assertEqual(self.run_ok(u, "--json", "stats").json()[0]["bytes"], 1000)

    def test_spill_and_transfer(self):
        spill = os.path.join(self.tmp, "spill")
        u = self.unit(capacity="1000", spill_dir=spill)
        blob = os.urandom(5000)
        self.run_ok(u, "put", "big", self.file("big", blob))
        self.assertEqual(self.run_ok(u, "get", "big").out, blob)
        info = self.run_ok(u, "--json", "describe", "big").json()[0]
        self.assertEqual((info["size"], info["spilled"]), (5000, True))
        self.assertEqual(self.run_ok(u, "describe", "big").text.splitlines()[1].split(),
                         ["big", "5000", "no", "yes"])
        s = self.run_ok(u, "--json", "stats").json()[0]
        self.assertEqual((s["spilled"], s["bytes"], s["blobs"]), (1, 0, 1))
        # The unit cannot read its spill file back: a Protocol error from the
        # unit, a Transfer (exit 6) for the caller.
        files = os.listdir(spill)
        self.assertEqual(len(files), 1)
        os.unlink(os.path.join(spill, files[0]))
        r = self.run_fail(u, EXIT["Transfer"], "get", "big")
        self.assertIn("ctl-storage: Transfer: get at %s" % u.address, r.err)
        r = self.run_fail(u, EXIT["Transfer"], "--json", "get", "big")
        self.assertEqual(r.json()["error"]["kind"], "Transfer")
        self.assertIn("Protocol", r.json()["error"]["msg"])
        self.assertEqual(self.run_ok(u, "delete", "big").text, "deleted 1 blob\n")


class TestFanOut(CliCase):

    def setUp(self):
        super().setUp()
        self.us = [self.unit(), self.unit(), self.unit(capacity="1K")]
        for i, u in enumerate(self.us):
            for k in ["k%d" % i, "shared", "x/%d" % i]:
                self.run_ok(u, "put", k, "-", stdin=b"v" * (i + 1))
        self.dead = support.dead_address()
        self.addresses = [u.address for u in self.us]

    def test_stats_all_up(self):
        r = cli("--json", "stats", addresses=self.addresses)
        self.assertEqual(r.status, 0, r.err)
        rows = r.json()
        self.assertEqual([row["address"] for row in rows], self.addresses)
        self.assertEqual([row["bytes"] for row in rows], [3, 6, 9])
        self.assertEqual([row["capacity"] for row in rows], [64 << 20, 64 << 20, 1024])
        r = cli("stats", addresses=self.addresses)
        self.assertEqual(r.status, 0, r.err)
        lines = r.text.splitlines()
        self.assertEqual(len(lines), 4)
        self.assertEqual([ln.split()[0] for ln in lines[1:]], self.addresses)

    def test_stats_with_dead_unit(self):
        addrs = [self.addresses[0], self.dead] + self.addresses[1:]
        t0 = time.monotonic()
        # A long deadline: the refused connection ends the batch early.
        r = cli("--timeout", "30s", "stats", addresses=addrs)
        self.assertLess(time.monotonic() - t0, 10)
        self.assertEqual(r.status, EXIT["unreachable"], r.err)
        lines = r.text.splitlines()
        self.assertEqual(len(lines), 5)
        self.assertEqual([ln.split()[0] for ln in lines[1:]], addrs)
        self.assertIn("Unreachable:", lines[2])
        self.assertIn("connection refused", lines[2])
        self.assertIn(self.dead, lines[2])
        for ln in (lines[1], lines[3], lines[4]):
            self.assertEqual(ln.split()[1], "3")  # blobs: the live units answered
        r = cli("--json", "--timeout", "1s", "stats", addresses=addrs)
        self.assertEqual(r.status, EXIT["unreachable"])
        rows = r.json()
        self.assertEqual([row["address"] for row in rows], addrs)
        self.assertEqual(rows[1]["error"]["kind"], "Unreachable")
        self.assertNotIn("blobs", rows[1])
        for row in (rows[0], rows[2], rows[3]):
            self.assertNotIn("error", row)
            self.assertEqual(row["blobs"], 3)

    def test_list_with_dead_unit(self):
        r = cli("list", "--prefix", "x/", addresses=self.addresses)
        self.assertEqual(r.status, 0, r.err)
        lines = r.text.splitlines()
        self.assertEqual(len(lines), 3)
        for i, ln in enumerate(lines):
            self.assertEqual(ln.split(), [self.addresses[i], "1", "key:", "x/%d" % i])
        addrs = self.addresses + [self.dead]
        r = cli("--json", "--timeout", "1s", "list", addresses=addrs)
        self.assertEqual(r.status, EXIT["unreachable"])
        rows = r.json()
        self.assertEqual([row["address"] for row in rows], addrs)
        for i in range(3):
            self.assertEqual(rows[i]["keys"], sorted(["k%d" % i, "shared", "x/%d" % i]))
        self.assertEqual(rows[3]["error"]["kind"], "Unreachable")
        r = cli("--timeout", "1s", "list", "--prefix", "shared", addresses=addrs)
        self.assertEqual(r.status, EXIT["unreachable"])
        lines = r.text.splitlines()
        self.assertEqual(len(lines), 4)
        self.assertIn("Unreachable:", lines[3])
        self.assertEqual(lines[0].split(), [self.addresses[0], "1", "key:", "shared"])

    def test_single_dead_address(self):
        t0 = time.monotonic()
        r = cli("--timeout", "30s", "list", addresses=[self.dead])
        self.assertLess(time.monotonic() - t0, 10)
        self.assertEqual(r.status, EXIT["unreachable"])
        self.assertIn("ctl-storage: Unreachable: list at %s: connection refused" % self.dead,
                      r.err)
        r = cli("--timeout", "500ms", "get", "k", addresses=[self.dead])
        self.assertEqual(r.status, EXIT["unreachable"])
        r = cli("--json", "--timeout", "500ms", "put", "k", "-", addresses=[self.dead],
                stdin=b"v")
        self.assertEqual(r.status, EXIT["unreachable"])
        self.assertEqual(r.json()["error"]["kind"], "Unreachable")

    def test_host_that_does_not_resolve(self):
        addr = "tcp://nosuchhost.invalid:4100"
        t0 = time.monotonic()
        r = cli("--timeout", "30s", "stats", addresses=[addr])
        self.assertLess(time.monotonic() - t0, 10)
        self.assertEqual(r.status, EXIT["unreachable"], r.err)
        self.assertIn("host 'nosuchhost.invalid' does not resolve", r.text + r.err)


class TestIPv6(CliCase):
    """A unit bound to tcp://[::1]:0 prints its IPv6 endpoint, and
    ctl-storage calls it there (skipped: no ::1 where the machine has no
    IPv6 loopback)."""

    def test_unit_and_cli_on_ipv6_loopback(self):
        if not support.have_ipv6_loopback():
            self.skipTest("skipped: no ::1")
        if any(w.endswith("unit.py") for w in UNIT):
            self.skipTest("the C unit's test (the Python unit has tests of its own)")
        u = self.unit(bind="tcp://[::1]:0")
        self.assertRegex(u.address, r"^tcp://\[::1\]:[1-9][0-9]*$")
        r = self.run_ok(u, "put", "v6", "-", stdin=b"over IPv6")
        self.assertEqual(r.text, "stored 9 bytes under 'v6'\n")
        self.assertEqual(self.run_ok(u, "get", "v6").out, b"over IPv6")
        stats = self.run_ok(u, "--json", "stats").json()
        self.assertIn(u.address, json.dumps(stats))


class TestReplyBound(CliCase):
    """--max-reply-bytes: a get whose reply would be larger is refused with
    a Protocol error that says so, before its reply is built; smaller ones
    are served."""

    def test_get_over_the_bound(self):
        if any(w.endswith("unit.py") for w in UNIT):
            self.skipTest("the C unit's flag")
        u = self.unit(extra=["--max-reply-bytes", "64K"])
        blob = b"x" * 40000
        self.run_ok(u, "put", "big", "-", stdin=blob)
        self.assertEqual(self.run_ok(u, "get", "big").out, blob)
        r = cli("get", "big", "big", addresses=[u.address])
        self.assertEqual(r.status, EXIT["Transfer"], r.err)
        self.assertIn("op 'get': the reply would be larger than this unit's max_reply_bytes "
                      "(65536 bytes", r.err)
        self.assertEqual(r.out, b"")
        # The unit goes on serving.
        self.assertEqual(self.run_ok(u, "get", "big").out, blob)

    def test_bad_value(self):
        if any(w.endswith("unit.py") for w in UNIT):
            self.skipTest("the C unit's flag")
        p = subprocess.run(UNIT + ["--max-reply-bytes", "lots"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=RUN_S)
        self.assertEqual(p.returncode, 2)
        self.assertIn(b"--max-reply-bytes 'lots' is not a positive size", p.stderr)


class TestCurve(CliCase):
    """CURVE: key generation, encrypted and authenticated calls, strangers
    refused (they get nothing: a timeout), secret key files kept private."""

    def keygen(self, name):
        prefix = os.path.join(self.tmp, name)
        r = cli("keygen", prefix)
        self.assertEqual(r.status, 0, r.err)
        self.assertEqual(os.stat(prefix + ".key").st_mode & 0o777, 0o600)
        return prefix + ".key", prefix + ".pub"

    def test_keys_and_allowlist(self):
        unit_key = os.path.join(self.tmp, "unit")
        r = subprocess.run(UNIT + ["--gen-keys", unit_key], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=RUN_S)
        self.assertEqual(r.returncode, 0, r.stderr)
        alice_key, alice_pub = self.keygen("alice")
        bob_key, _ = self.keygen("bob")
        allow = os.path.join(self.tmp, "allow")
        with open(alice_pub) as src, open(allow, "w") as dst:
            dst.write(src.read())
        u = self.unit(extra=["--curve-secret", unit_key + ".key", "--curve-allow", allow])
        ok = cli("--json", "--curve-server-key", unit_key + ".pub", "--curve-key", alice_key,
                 "stats", addresses=[u.address])
        self.assertEqual(ok.status, 0, ok.err)
        self.assertEqual(ok.json()[0]["requests"], 1)
        for extra in (["--curve-server-key", unit_key + ".pub", "--curve-key", bob_key],
                      ["--curve-server-key", unit_key + ".pub"], []):
            t0 = time.monotonic()
            r = cli("--timeout", "30s", *extra, "stats", addresses=[u.address])
            self.assertLess(time.monotonic() - t0, 10)
            self.assertEqual(r.status, EXIT["auth"], (extra, r.text, r.err))
            self.assertIn("AuthFailed:", r.text + r.err)
            self.assertIn("authentication failed", r.text + r.err)
        # Alice is still served; the strangers' calls never reached the unit.
        ok = cli("--json", "--curve-server-key", unit_key + ".pub", "--curve-key", alice_key,
                 "stats", addresses=[u.address])
        self.assertEqual(ok.json()[0]["requests"], 2)

    def test_private_key_files_only(self):
        key, pub = self.keygen("carol")
        os.chmod(key, 0o644)
        r = cli("--curve-server-key", pub, "--curve-key", key, "stats",
                addresses=["tcp://127.0.0.1:1"])
        self.assertEqual(r.status, EXIT["usage"])
        self.assertIn("readable by others (mode 0644)", r.err)
        r = subprocess.run(UNIT + ["--curve-secret", key], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=RUN_S)
        self.assertEqual(r.returncode, 2)
        self.assertIn(key, r.stderr.decode())
        r = cli("keygen", key[:-4])
        self.assertEqual(r.status, EXIT["local"])
        self.assertIn("cannot create", r.err)


class TestKeyFileMistakes(CliCase):
    """The other half of a key pair, the unit's secret key on its allowlist, an allowlist
    others could rewrite: refused at start, naming the file and the mistake."""

    def keys(self, name):
        prefix = os.path.join(self.tmp, name)
        r = subprocess.run(UNIT + ["--gen-keys", prefix], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=RUN_S)
        self.assertEqual(r.returncode, 0, r.stderr)
        return prefix + ".key", prefix + ".pub"

    def unit_refuses(self, *flags):
        r = subprocess.run(UNIT + ["--bind", "tcp://127.0.0.1:0", *flags],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=RUN_S)
        self.assertEqual((r.returncode, r.stdout), (2, b""), r.stderr)
        return r.stderr.decode()

    def test_unit(self):
        key, pub = self.keys("unit")
        _, client_pub = self.keys("client")
        err = self.unit_refuses("--curve-secret", pub)
        self.assertIn("key file %s: this is a public key; pass the .key file" % pub, err)
        self.assertNotIn("chmod", err)
        with open(key) as f:
            secret_file = f.read()
        secret = [x for x in secret_file.split("\n") if x and x[0] != "#"][0]
        with open(client_pub) as f:
            listed = f.read()
        own = self.file("own.allow", (listed + secret + "\n").encode())
        err = self.unit_refuses("--curve-secret", key, "--curve-allow", own)
        self.assertIn("allowlist %s: key #2 is the unit's own secret key" % own, err)
        pasted = self.file("pasted.allow", (listed + secret_file).encode())
        err = self.unit_refuses("--curve-secret", key, "--curve-allow", pasted)
        self.assertIn("allowlist %s:3: this is a secret key file's header" % pasted, err)
        dup = self.file("dup.allow", (listed + listed).encode())
        err = self.unit_refuses("--curve-secret", key, "--curve-allow", dup)
        self.assertIn("allowlist %s:4: the key of line 2 again (a duplicate)" % dup, err)
        ww = self.file("ww.allow", listed.encode())
        os.chmod(ww, 0o666)
        err = self.unit_refuses("--curve-secret", key, "--curve-allow", ww)
        self.assertIn("allowlist %s is writable by others (mode 0666)" % ww, err)
        link = os.path.join(self.tmp, "link.allow")
        os.symlink(dup, link)
        err = self.unit_refuses("--curve-secret", key, "--curve-allow", link)
        self.assertIn("allowlist %s is a symbolic link" % link, err)
        nul = self.file("nul.allow", listed.encode() + b"\0" + secret.encode())
        err = self.unit_refuses("--curve-secret", key, "--curve-allow", nul)
        self.assertIn("allowlist %s holds a NUL byte (at offset %d)" % (nul, len(listed)), err)

    def test_client(self):
        key, pub = self.keys("unit")
        ckey, cpub = self.keys("client")
        for flags, words in (
                (["--curve-server-key", key], "key file %s: this is a secret key; pass the "
                 ".pub file" % key),
                (["--curve-server-key", pub, "--curve-key", cpub],
                 "key file %s: this is a public key; pass the .key file" % cpub)):
            r = cli(*flags, "stats", addresses=["tcp://127.0.0.1:1"])
            self.assertEqual((r.status, r.out), (EXIT["usage"], b""), r.err)
            self.assertIn("ctl-storage: " + words, r.err)


def main():
    global UNIT, CLI
    ap = argparse.ArgumentParser()
    ap.add_argument("--unit", required=True)
    ap.add_argument("--cli", required=True)
    args, rest = ap.parse_known_args()
    UNIT, CLI = shlex.split(args.unit), args.cli
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
