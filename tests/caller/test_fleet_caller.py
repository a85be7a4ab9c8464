"""The generic caller on a fleet: `ctlrpc units`, `ctlrpc exporter`, and `--etcd ... --service`
wherever an address is taken (call fan-out, health, stats), against Python units
(examples/storage/unit.py) registered in a private etcd (tests/python/fleet_support.py).

    test_fleet_caller.py --caller CTLRPC --pyunit UNIT_PY --module-dir DIR

The exporter's text is read back with the Prometheus client's own parser (Debian:
python3-prometheus-client) when it is installed, and always with this suite's line checker.
"""

import json
import os
import signal
import subprocess
import sys
import time
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(TOP, "tests", "python"))
sys.path.insert(0, HERE)

import fleet_support as fs  # noqa: E402
import support  # noqa: E402

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:  # checked by the line checker alone
    text_string_to_metric_families = None

OPTS = None
PREFIX = "/ctlrpc/v1/default/storage/"


def caller(*args, env=None):
    r = subprocess.run([sys.executable, OPTS.caller, *args], capture_output=True,
                       timeout=support.RUN_S, env=env)
    return r.returncode, r.stdout.decode(), r.stderr.decode()


def check_prometheus(test, text):
    """Parsed by prometheus_client when present; {(name, frozenset(labels)): value}."""
    import test_caller  # the suite's line-by-line checker
    test_caller.check_prometheus(test, text)
    samples = {}
    if text_string_to_metric_families is None:
        return None
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def up_of(samples):
    return {dict(k[1]).get("unit"): v for k, v in samples.items() if k[0] == "ctlrpc_unit_up"}


class Fleet(unittest.TestCase):
    def setUp(self):
        self.tmp = fs.TempDir()
        self.addCleanup(self.tmp.close)
        self.etcd = fs.Etcd(self.tmp.path)
        self.addCleanup(self.etcd.close)
        self.units = {}
        for uid in ("a", "b"):
            self.start(uid)
        fs.wait_until(lambda: len(self.etcd.get_prefix(PREFIX)) == 2, "two units registered")

    def start(self, uid, *extra):
        u = support.Process([sys.executable, OPTS.pyunit, "--module-dir", OPTS.module_dir,
                             "--bind", "tcp://127.0.0.1:0", "--etcd", self.etcd.url,
                             "--unit-id", uid, *extra])
        self.units[uid] = u
        self.addCleanup(u.kill)
        return u

    def test_units(self):
        status, out, err = caller("units", "--etcd", self.etcd.url, "--service", "storage")
        self.assertEqual(status, 0, err)
        lines = out.splitlines()
        self.assertEqual(lines[0].split(), ["UNIT_ID", "ADDRESS", "STATE", "AGE", "VERSION"])
        rows = [line.split() for line in lines[1:]]
        self.assertEqual([r[0] for r in rows], ["a", "b"])
        self.assertEqual([r[1] for r in rows], [self.units["a"].address,
                                                self.units["b"].address])
        self.assertEqual({r[2] for r in rows}, {"serving"})
        self.assertTrue(all(r[3].endswith("s") for r in rows), rows)
        status, out, err = caller("units", "--etcd", self.etcd.url, "--service", "storage",
                                  "--json")
        self.assertEqual(status, 0, err)
        got = json.loads(out)
        self.assertEqual([u["unit_id"] for u in got], ["a", "b"])
        for u in got:
            for field in ("address", "state", "service", "idl_hash", "version", "host", "pid",
                          "started", "age_s"):
                self.assertIn(field, u)
        # $CTLRPC_ETCD is the default endpoint.
        env = dict(os.environ, CTLRPC_ETCD=self.etcd.url)
        status, out, err = caller("units", "--service", "storage", "--json", env=env)
        self.assertEqual((status, len(json.loads(out))), (0, 2), err)
        # Another namespace has none.
        status, out, err = caller("units", "--etcd", self.etcd.url, "--service", "storage",
                                  "--namespace", "other", "--json")
        self.assertEqual((status, json.loads(out)), (0, []))
        self.assertIn("no unit of service 'storage' is registered in namespace 'other'", err)

    def test_call_health_stats_by_service(self):
        fleet = ["--etcd", self.etcd.url, "--service", "storage"]
        status, out, err = caller("call", *fleet, "put", "key=k", "data=hello")
        self.assertEqual(status, 0, err)
        rows = [json.loads(line) for line in out.splitlines()]
        self.assertEqual(sorted(r["address"] for r in rows),
                         sorted(u.address for u in self.units.values()))
        self.assertEqual({r["result"] for r in rows}, {5})
        status, out, err = caller("health", *fleet, "--json")
        self.assertEqual(status, 0, err)
        self.assertEqual({h["health"]["status"] for h in json.loads(out)}, {"serving"})
        self.assertEqual(len(json.loads(out)), 2)
        status, out, err = caller("stats", *fleet, "--json")
        self.assertEqual(status, 0, err)
        self.assertEqual(len(json.loads(out)), 2)
        # A draining unit is left out: only serving units are called.
        self.etcd.put(PREFIX + "d", json.dumps({"address": "tcp://127.0.0.1:9",
                                                "state": "draining"}))
        status, out, err = caller("health", *fleet, "--json")
        self.assertEqual((status, len(json.loads(out))), (0, 2), err)

    def test_failures(self):
        dead = f"http://127.0.0.1:{fs.free_port()}"
        for cmd in (["units"], ["health"], ["call", "put", "key=k", "data=x"], ["stats"]):
            status, out, err = caller(*cmd, "--etcd", dead, "--service", "storage")
            self.assertEqual(status, 8, (cmd, err))
            self.assertIn(dead, err)
            self.assertIn("service 'storage' (namespace default)", err)
        status, _, err = caller("health", "--etcd", self.etcd.url, "--service", "nothing")
        self.assertEqual(status, 8)
        self.assertIn("no serving unit of service 'nothing'", err)
        status, _, err = caller("health", "--etcd", self.etcd.url)
        self.assertEqual(status, 2)
        self.assertIn("--service", err)
        env = dict(os.environ)
        env.pop("CTLRPC_ETCD", None)
        status, _, err = caller("units", "--service", "storage", env=env)
        self.assertEqual(status, 2)
        self.assertIn("--etcd", err)
        status, _, err = caller("units", "--etcd", "ftp://x", "--service", "storage")
        self.assertEqual(status, 2)
        self.assertIn("ftp://x", err)
        status, _, err = caller("units", "--etcd", self.etcd.url, "--service", "a/b")
        self.assertEqual(status, 2)
        self.assertIn("--service 'a/b'", err)
        # units reads etcd and calls no unit: the calling options are not its own.
        for opt in (["--address", "tcp://127.0.0.1:1"], ["--retries", "2"], ["--idl", "x.idl"],
                    ["--curve-server-key", "k.pub"]):
            status, _, err = caller("units", "--etcd", self.etcd.url, "--service", "storage",
                                    *opt)
            self.assertEqual(status, 2, (opt, err))
            self.assertIn(f"unrecognized argument '{opt[0]}'", err)
        status, _, err = caller("exporter", "--etcd", self.etcd.url, "--service", "storage",
                                "--address", "tcp://127.0.0.1:1")
        self.assertEqual(status, 2, err)
        self.assertIn("unrecognized argument '--address'", err)
        status, out, _ = caller("units", "--help")
        self.assertEqual(status, 0)
        for opt in ("--etcd", "--service", "--namespace", "--timeout", "--json"):
            self.assertIn(opt, out)
        for opt in ("--address", "--idl", "--retries", "--retry-busy", "--curve"):
            self.assertNotIn(opt, out)
        env["CTLRPC_ETCD_PASSWORD"] = ""
        env.pop("CTLRPC_ETCD_PASSWORD")
        status, _, err = caller("units", "--etcd", self.etcd.url, "--service", "storage",
                                "--etcd-user", "x", env=env)
        self.assertEqual(status, 2)
        self.assertIn("CTLRPC_ETCD_PASSWORD", err)

    def test_exporter_follows_membership(self):
        p = subprocess.Popen([sys.executable, OPTS.caller, "exporter", "--etcd", self.etcd.url,
                              "--service", "storage", "--listen", "127.0.0.1:0"],
                             stdout=subprocess.PIPE)
        self.addCleanup(lambda: (p.poll() is None and p.kill(), p.wait(10), p.stdout.close()))
        line = p.stdout.readline().decode().strip()
        self.assertRegex(line, r"^http://127\.0\.0\.1:\d+/metrics$")

        def scrape():
            with urllib.request.urlopen(line, timeout=10) as r:
                self.assertIn("text/plain", r.headers["Content-Type"])
                return r.read().decode()

        text = scrape()
        samples = check_prometheus(self, text)
        self.assertIn('ctlrpc_unit_up{address="%s",unit="a",state="serving"} 1'
                      % self.units["a"].address, text)
        if samples is not None:
            self.assertEqual(up_of(samples), {"a": 1.0, "b": 1.0})
            calls = [k for k in samples if k[0] == "ctlrpc_op_calls_total"]
            self.assertEqual({dict(k[1])["unit"] for k in calls}, {"a", "b"})
        self.assertIn('ctlrpc_directory_stale{service="storage"} 0', text)
        # A new unit appears; a killed one is down, then leaves with its lease.
        self.start("c", "--lease-ttl", "2")
        fs.wait_until(lambda: 'unit="c"' in scrape(), "unit c in the metrics", 10)
        self.units["a"].proc.kill()
        fs.wait_until(lambda: 'ctlrpc_unit_up{address="%s",unit="a",state="serving"} 0'
                      % self.units["a"].address in scrape(), "unit a down", 10)
        self.units["c"].proc.kill()
        fs.wait_until(lambda: 'unit="c"' not in scrape(), "unit c gone with its lease", 10)
        with self.assertRaises(urllib.error.HTTPError) as cm:
            urllib.request.urlopen(line.replace("/metrics", "/other"), timeout=10)
        self.assertEqual(cm.exception.code, 404)
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(timeout=10), 0)

    def test_exporter_without_etcd(self):
        dead = f"http://127.0.0.1:{fs.free_port()}"
        t0 = time.monotonic()
        status, _, err = caller("exporter", "--etcd", dead, "--service", "storage",
                                "--listen", "127.0.0.1:0")
        self.assertEqual(status, 8, err)
        self.assertIn(dead, err)
        self.assertLess(time.monotonic() - t0, 10)
        status, _, err = caller("exporter", "--etcd", self.etcd.url, "--service", "storage",
                                "--listen", "nowhere")
        self.assertEqual(status, 2)
        self.assertIn("--listen 'nowhere'", err)


class Secured(unittest.TestCase):
    """`ctlrpc units` against etcd over https: with client certificates, and with users (etcd's
    gateway does not take both at once: with client certificate auth on, it refuses a
    certificate's name as a user)."""

    def setUp(self):
        self.tmp = fs.TempDir()
        self.addCleanup(self.tmp.close)
        self.pki = fs.Pki(os.path.join(self.tmp.path, "pki"))
        self.value = json.dumps({"address": "tcp://127.0.0.1:7", "state": "serving",
                                 "service": "storage", "version": "9.9"})

    def test_units_with_client_certificates(self):
        pki = self.pki
        etcd = fs.Etcd(self.tmp.path, pki=pki, client_cert_auth=True)
        self.addCleanup(etcd.close)
        etcd.put(PREFIX + "u1", self.value)
        tls = ["--etcd", etcd.url, "--service", "storage", "--etcd-cacert", pki.ca]
        status, out, err = caller("units", *tls, "--etcd-cert", pki.client, "--etcd-key",
                                  pki.client_key, "--json")
        self.assertEqual(status, 0, err)
        self.assertEqual([(u["unit_id"], u["version"]) for u in json.loads(out)],
                         [("u1", "9.9")])
        # Without a client certificate the server refuses the connection: unreachable (8).
        status, _, err = caller("units", *tls)
        self.assertEqual(status, 8, err)
        self.assertIn(etcd.url, err)
        # Without the CA, the server's certificate is not trusted: unreachable (8), naming it.
        status, _, err = caller("units", "--etcd", etcd.url, "--service", "storage")
        self.assertEqual(status, 8, err)
        self.assertIn(etcd.url, err)
        status, _, err = caller("units", *tls, "--etcd-cert", pki.client)
        self.assertEqual(status, 2)
        self.assertIn("--etcd-key", err)

    def test_units_as_a_user(self):
        etcd = fs.Etcd(self.tmp.path, pki=self.pki)
        self.addCleanup(etcd.close)
        etcd.put(PREFIX + "u1", self.value)
        etcd.ctl("user", "add", "root:rootpw")
        etcd.ctl("user", "add", "reader:readpw")
        etcd.ctl("role", "add", "fleet-read")
        etcd.ctl("role", "grant-permission", "fleet-read", "--prefix=true", "read",
                 "/ctlrpc/v1/default/")
        etcd.ctl("user", "grant-role", "reader", "fleet-read")
        etcd.ctl("auth", "enable", user="root:rootpw")
        tls = ["--etcd", etcd.url, "--service", "storage", "--etcd-cacert", self.pki.ca]
        env = dict(os.environ, CTLRPC_ETCD_PASSWORD="readpw")
        status, out, err = caller("units", *tls, "--etcd-user", "reader", "--json", env=env)
        self.assertEqual(status, 0, err)
        self.assertEqual([u["unit_id"] for u in json.loads(out)], ["u1"])
        status, out, err = caller("health", *tls, "--etcd-user", "reader", env=env)
        self.assertEqual(status, 8, err)  # the listed unit is not there: refused
        # A wrong password: authentication failed (9), naming the user.
        env["CTLRPC_ETCD_PASSWORD"] = "wrong"
        status, _, err = caller("units", *tls, "--etcd-user", "reader", env=env)
        self.assertEqual(status, 9, err)
        self.assertIn("reader", err)
        # No user at all: etcd refuses the request (9 too).
        status, _, err = caller("units", *tls)
        self.assertEqual(status, 9, err)


def main():
    global OPTS
    OPTS, argv = support.main("caller", "pyunit", "module-dir")
    status = fs.without_etcd("test_fleet_caller.py")
    if status is not None:
        sys.exit(status)
    support.run_tests(argv)


if __name__ == "__main__":
    main()
