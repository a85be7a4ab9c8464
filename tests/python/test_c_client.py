"""The C storage client (ctl-storage, generated C stubs) against a Python Server, and CURVE
between the two runtimes.

    test_c_client.py --cli PATH/ctl-storage --unit PATH/ctl-storage-unit [unittest args]

The Python side implements a few storage ops by hand (put, get, delete, pin, unpin, list,
stats; docs/STORAGE.md), enough to show results and each error kind crossing from a Python
unit to a C caller: the CLI's exit status tells them apart (3 UnitFull, 4 Busy, 5 Missing,
6 Protocol, 7 timeout). CURVE with the key files of either side: keys made by
`ctl-storage-unit --gen-keys` used by a Python server and client, keys made by
`ctlrpc.keygen` used by the C programs, a wrong server key (a timeout), an allowlist refusing an
unlisted client (counted), and secret key files readable by others refused.
"""

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import unittest

import ctlrpc

import support

CLI = None
UNIT = None
EXIT = {"UnitFull": 3, "Busy": 4, "Missing": 5, "Transfer": 6, "timeout": 7}


class PyStorage:
    """A small in-memory storage unit, by hand, on the untyped Server."""

    RAISES = {"put": ["UnitFull", "Busy"], "get": ["Missing"], "pin": ["Missing"],
              "delete": ["Busy"], "unpin": [], "list": [], "stats": []}

    def __init__(self, capacity=1 << 20, **kw):
        self.blobs = {}
        self.pinned = set()
        self.capacity = capacity
        handlers = {"put": self.put, "get": self.get, "pin": self.pin, "unpin": self.unpin,
                    "delete": self.delete, "list": self.list, "stats": self.stats}
        self.server = ctlrpc.Server(handlers, "tcp://127.0.0.1:0", notify=["unpin"],
                                    raises=self.RAISES, name="storage", **kw)
        self.address = self.server.endpoint

    def put(self, args):
        key, data, pin = args["key"], args["data"], args.get("pin", False)
        if not isinstance(key, str) or not isinstance(data, bytes):
            raise ctlrpc.Error("put: key must be a str and data a bin")
        if key in self.pinned:
            raise ctlrpc.Busy("blob '%s' is pinned" % key, reason="pinned")
        used = sum(len(v) for k, v in self.blobs.items() if k != key)
        if used + len(data) > self.capacity:
            raise ctlrpc.UnitFull("%d bytes do not fit" % len(data))
        self.blobs[key] = data
        if pin:
            self.pinned.add(key)
        return len(data)

    def _missing(self, keys):
        gone = [k for k in keys if k not in self.blobs]
        if gone:
            raise ctlrpc.Missing("%d of %d keys are not on this unit" % (len(gone), len(keys)),
                                 blobs=gone)

    def get(self, args):
        self._missing(args["keys"])
        return [self.blobs[k] for k in args["keys"]]

    def pin(self, args):
        self._missing(args["keys"])
        self.pinned.update(args["keys"])
        return len(set(args["keys"]))

    def unpin(self, args):
        self.pinned.difference_update(args["keys"])

    def delete(self, args):
        keys = args["keys"]
        if any(k in self.pinned for k in keys):
            raise ctlrpc.Busy("a named blob is pinned; nothing was deleted", reason="pinned")
        return sum(1 for k in set(keys) if self.blobs.pop(k, None) is not None)

    def list(self, args):
        prefix, after, limit = args.get("prefix", ""), args.get("after", ""), args.get("limit", 0)
        keys = sorted(k for k in self.blobs if k.startswith(prefix) and k > after)
        return keys[:limit] if limit else keys

    def stats(self, args):
        st = self.server.stats()
        return {"blobs": len(self.blobs), "bytes": sum(map(len, self.blobs.values())),
                "capacity": self.capacity, "pinned": len(self.pinned), "spilled": 0,
                "requests": st["requests"], "dropped": st["dropped"]}

    def close(self):
        self.server.close()


class Run:
    def __init__(self, proc):
        self.status = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr.decode(errors="replace")

    def json(self):
        return json.loads(self.out.decode())


def cli(addresses, *args, stdin=None):
    argv = [CLI]
    for a in addresses:
        argv += ["--address", a]
    return Run(subprocess.run(argv + list(args), input=stdin, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=support.RUN_S))


class CliCase(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ctl-pyrt.")
        self.units = []
        self.procs = []

    def tearDown(self):
        try:
            for u in self.units:
                u.close()
            for p in self.procs:
                self.assertEqual(p.stop(), 0, "unit exit status")
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def unit(self, **kw):
        u = PyStorage(**kw)
        self.units.append(u)
        return u

    def path(self, name):
        return os.path.join(self.tmp, name)


class TestCliAgainstPython(CliCase):

    def test_put_get_stats(self):
        u = self.unit()
        data = os.urandom(100000) + b"\0end"
        r = cli([u.address], "put", "k1", "-", stdin=data)
        self.assertEqual(r.status, 0, r.err)
        r = cli([u.address], "put", "k2", "-", "--pin", stdin=b"two")
        self.assertEqual(r.status, 0, r.err)
        r = cli([u.address], "get", "k1", "-o", self.path("out"))
        self.assertEqual(r.status, 0, r.err)
        with open(self.path("out"), "rb") as f:
            self.assertEqual(f.read(), data)
        r = cli([u.address], "--json", "list")
        self.assertEqual(r.status, 0, r.err)
        self.assertEqual(r.json(), [{"address": u.address, "keys": ["k1", "k2"]}])
        r = cli([u.address], "--json", "stats")
        self.assertEqual(r.status, 0, r.err)
        st = r.json()[0]
        self.assertEqual((st["blobs"], st["bytes"], st["pinned"]), (2, len(data) + 3, 1))
        self.assertEqual(st["index_bytes"], 0)  # defaulted: the Python unit leaves it out
        r = cli([u.address], "unpin", "k2")
        self.assertEqual(r.status, 0, r.err)
        support.wait_for(lambda: not u.pinned, "the unpin notify")
        r = cli([u.address], "delete", "k1", "k2")
        self.assertEqual(r.status, 0, r.err)
        self.assertEqual(u.blobs, {})

    def test_error_kinds(self):
        u = self.unit(capacity=100)
        u.blobs["p"] = b"x"
        u.pinned.add("p")
        r = cli([u.address], "put", "big", "-", stdin=b"y" * 200)
        self.assertEqual(r.status, EXIT["UnitFull"], r.err)
        self.assertIn("200 bytes do not fit", r.err)
        r = cli([u.address], "--json", "delete", "p")
        self.assertEqual(r.status, EXIT["Busy"], r.err)
        err = r.json()["error"]
        self.assertEqual(err["reason"], "pinned")
        r = cli([u.address], "get", "p", "gone", "lost")
        self.assertEqual(r.status, EXIT["Missing"], r.err)
        self.assertIn("gone lost", r.err)
        r = cli([u.address], "describe", "p")  # an op this unit does not serve
        self.assertEqual(r.status, EXIT["Transfer"], r.err)
        self.assertIn("unknown op 'describe' (service storage)", r.err)
        # A handler failing with a kind its op does not declare: Protocol, counted.
        def bad_put(args):
            raise ctlrpc.Missing("not a kind put declares", blobs=["x"])
        bad = ctlrpc.Server({"put": bad_put}, "tcp://127.0.0.1:0",
                            raises={"put": PyStorage.RAISES["put"]})
        try:
            r = cli([bad.endpoint], "put", "k", "-", stdin=b"1")
            self.assertEqual(r.status, EXIT["Transfer"], r.err)
            self.assertIn("op 'put' failed with Missing, which it does not declare in 'raises'",
                          r.err)
            self.assertEqual(bad.stats()["undeclared"], 1)
        finally:
            bad.close()

    def test_timeout_and_fan_out(self):
        u = self.unit()
        blocked = self.unit()
        lock = blocked.server.lock
        dead = support.dead_address()
        with lock:  # the unit's handlers wait for its lock: no reply in time
            r = cli([blocked.address], "--timeout", "300ms", "stats")
            self.assertEqual(r.status, EXIT["timeout"], r.err)
            r = cli([u.address, blocked.address, dead], "--json", "--timeout", "500ms", "stats")
        rows = r.json()
        self.assertEqual(rows[0]["blobs"], 0)
        self.assertIn("error", rows[1])
        self.assertIn("error", rows[2])


class TestCurve(CliCase):

    def c_keys(self, name):
        prefix = self.path(name)
        r = subprocess.run([UNIT, "--gen-keys", prefix], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=support.RUN_S)
        self.assertEqual(r.returncode, 0, r.stderr)
        return prefix + ".key", prefix + ".pub"

    def py_keys(self, name):
        prefix = self.path(name)
        public, secret = ctlrpc.keygen(prefix)
        self.assertEqual(os.stat(prefix + ".key").st_mode & 0o777, 0o600)
        with open(prefix + ".pub") as f:
            self.assertIn(public, f.read())
        return prefix + ".key", prefix + ".pub"

    def test_keygen(self):
        key, pub = self.py_keys("a")
        with self.assertRaises(FileExistsError):
            ctlrpc.keygen(self.path("a"))
        self.assertEqual(ctlrpc.curve.public_of(ctlrpc.curve.read_key(key, True)),
                         ctlrpc.curve.read_key(pub, False))
        # The C programs read what keygen wrote, and the other way round.
        r = subprocess.run([CLI, "--address", "tcp://127.0.0.1:1", "--timeout", "100ms",
                            "--curve-server-key", pub, "--curve-key", key, "stats"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=support.RUN_S)
        self.assertEqual(r.returncode, EXIT["timeout"], r.stderr)
        ckey, cpub = self.c_keys("c")
        self.assertTrue(ctlrpc.curve.key_valid(ctlrpc.curve.read_key(ckey, True)))

    def test_python_unit_c_keys(self):
        key, pub = self.c_keys("unit")
        ckey, cpub = self.py_keys("client")
        stranger_key, _ = self.py_keys("stranger")
        allow = self.path("allow")
        shutil.copy(cpub, allow)
        u = self.unit(curve_secret=key, curve_allow=allow)
        # The C client, with the Python-made client key, to the Python unit with C-made keys.
        r = cli([u.address], "--json", "--curve-server-key", pub, "--curve-key", ckey, "stats")
        self.assertEqual(r.status, 0, r.err)
        # A Python client: listed, unlisted, no key, the wrong server key.
        with ctlrpc.Client(timeout=5.0, curve_server_key=pub, curve_secret=ckey) as c:
            self.assertEqual(c.call(u.address, "stats")["blobs"], 0)
        for kw in ({"curve_server_key": pub, "curve_secret": stranger_key},
                   {"curve_server_key": pub}, {},
                   {"curve_server_key": cpub, "curve_secret": ckey}):
            with ctlrpc.Client(timeout=10.0, **kw) as c:
                t0 = time.monotonic()
                with self.assertRaises(ctlrpc.Transfer, msg=str(kw)) as cm:
                    c.call(u.address, "stats")
                # An authentication failure, reported well before the deadline.
                self.assertEqual(cm.exception.cause, "auth", str(cm.exception))
                self.assertLess(time.monotonic() - t0, 2.0)
        # The two clients with the unit's key but not on the list were refused and counted;
        # the others never completed a handshake the unit could judge.
        support.wait_for(lambda: u.server.stats()["auth_denied"] >= 2, "refusals counted")
        self.assertEqual(u.server.stats()["requests"], 2)

    def test_c_unit_python_keys(self):
        key, pub = self.py_keys("unit")
        ckey, cpub = self.c_keys("client")
        p = support.Process([UNIT, "--bind", "tcp://127.0.0.1:0", "--curve-secret", key,
                             "--curve-allow", cpub])
        self.procs.append(p)
        with ctlrpc.Client(timeout=5.0, curve_server_key=pub, curve_secret=ckey) as c:
            self.assertEqual(c.call(p.address, "put", {"key": "k", "data": b"v"}), 1)
        with ctlrpc.Client(timeout=10.0, curve_server_key=pub) as c:
            t0 = time.monotonic()
            with self.assertRaises(ctlrpc.Transfer) as cm:
                c.call(p.address, "stats")
            self.assertEqual(cm.exception.cause, "auth", str(cm.exception))
            self.assertIn("not on its allowlist", str(cm.exception))
            self.assertLess(time.monotonic() - t0, 2.0)

    def c_refusal(self, *flags):
        """What the C programs say about a key file: ctl-storage-unit for --curve-secret and
        --curve-allow, ctl-storage for --curve-server-key and --curve-key."""
        unit_side = flags[0] in ("--curve-secret", "--curve-allow")
        argv = ([UNIT, "--bind", "tcp://127.0.0.1:0", *flags] if unit_side else
                [CLI, "--address", "tcp://127.0.0.1:1", "--timeout", "100ms", *flags, "stats"])
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=support.RUN_S)
        self.assertEqual(r.returncode, 2, (flags, r.stderr))
        err = r.stderr.decode().strip()
        prog = "ctl-storage-unit: " if unit_side else "ctl-storage: "
        self.assertTrue(err.startswith(prog), err)
        return err[len(prog):]

    def test_key_file_mistakes_same_words(self):
        """Each mistake in a key file or an allowlist is refused by the Python reader and the C
        programs with the same message, naming the file and the mistake."""
        key, pub = self.py_keys("unit")
        ckey, cpub = self.py_keys("client")
        with open(ckey) as f:
            client_secret_file = f.read()
        client_secret = ctlrpc.curve.read_key(ckey, True)

        def write(name, text, mode=0o644):
            path = self.path(name)
            with open(path, "wb") as f:
                f.write(text.encode() if isinstance(text, str) else text)
            os.chmod(path, mode)
            return path

        with open(cpub) as f:
            public_text = f.read()
        link = self.path("link.key")
        os.symlink(key, link)
        open_dir = self.path("open")
        os.mkdir(open_dir)
        in_open = os.path.join(open_dir, "allow")
        shutil.copy(cpub, in_open)
        os.chmod(open_dir, 0o777)
        self.addCleanup(lambda: os.path.isdir(open_dir) and os.chmod(open_dir, 0o700))
        cases = [
            # (flag, file, what the message says)
            ("--curve-key", pub, "this is a public key; pass the .key file"),
            ("--curve-key", write("pub600", public_text, 0o600),
             "this is a public key; pass the .key file"),
            ("--curve-server-key", key, "this is a secret key; pass the .pub file"),
            ("--curve-key", link, "is a symbolic link"),
            ("--curve-allow", write("ww", public_text, 0o666), "is writable by others"),
            ("--curve-allow", in_open, "in a directory that others can write"),
            ("--curve-allow", write("dup", public_text + public_text),
             ":4: the key of line 2 again (a duplicate)"),
            ("--curve-allow", write("pasted", client_secret_file),
             ":1: this is a secret key file's header"),
            ("--curve-allow", write("nul", public_text.encode() + b"\0more\n"),
             "holds a NUL byte"),
        ]
        for flag, path, words in cases:
            with self.subTest(flag=flag, path=path):
                unit_side = flag in ("--curve-secret", "--curve-allow")
                c_flags = ([flag, path] if not unit_side or flag == "--curve-secret" else
                           ["--curve-secret", key, flag, path])
                if flag == "--curve-key":
                    c_flags = ["--curve-server-key", pub, flag, path]
                got_c = self.c_refusal(*c_flags)
                with self.assertRaises(ValueError) as cm:
                    if flag == "--curve-allow":
                        ctlrpc.curve.read_allowlist(path)
                    else:
                        ctlrpc.curve.read_key(path, flag != "--curve-server-key")
                self.assertEqual(str(cm.exception), got_c)
                self.assertIn(path, got_c)
                self.assertIn(words, got_c)
        # The unit's own secret key listed as a client: both units refuse it, naming the file.
        own = write("own", public_text + client_secret + "\n")
        got_c = self.c_refusal("--curve-secret", ckey, "--curve-allow", own)
        self.assertIn("allowlist %s: key #2 is the unit's own secret key" % own, got_c)
        with self.assertRaises(ValueError) as cm:
            ctlrpc.Server({}, "tcp://127.0.0.1:0", curve_secret=ckey, curve_allow=own)
        self.assertIn("allowlist %s: key #2 is the unit's own secret key" % own,
                      str(cm.exception))

    def test_secret_files_private(self):
        key, pub = self.py_keys("k")
        os.chmod(key, 0o640)
        for make in (lambda: ctlrpc.Client(curve_server_key=pub, curve_secret=key),
                     lambda: ctlrpc.Server({}, "tcp://127.0.0.1:0", curve_secret=key)):
            with self.assertRaises(ValueError) as cm:
                make()
            self.assertIn(key, str(cm.exception))
            self.assertIn("mode 0640", str(cm.exception))
        with self.assertRaises(ValueError):
            ctlrpc.Client(curve_secret=key)  # a secret key without the units' public key
        with self.assertRaises(ValueError):
            ctlrpc.Server({}, "tcp://127.0.0.1:0", curve_allow=[pub])  # no secret key


if __name__ == "__main__":
    import logging
    logging.getLogger("ctlrpc").setLevel(logging.CRITICAL)
    opts, argv = support.main("cli", "unit")
    CLI, UNIT = opts.cli, opts.unit
    support.run_tests(argv)
