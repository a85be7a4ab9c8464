"""A private etcd for the fleet tests: on 127.0.0.1 with free ports and a temporary data
directory (never the packaged service on 2379), stopped by its pid; optionally https with a CA
made here (openssl), client certificates, or an etcd user with a password. Also a TCP proxy
the tests can cut (a partition that etcd does not see) and helpers that write and read keys
through etcdctl (so what the tests plant does not depend on the code under test).

Every wait has a deadline; nothing sleeps on a guess.
"""

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.request

ETCD = shutil.which("etcd") or "/usr/bin/etcd"
ETCDCTL = shutil.which("etcdctl") or "/usr/bin/etcdctl"
START_S = 30


def have_etcd():
    return os.access(ETCD, os.X_OK) and os.access(ETCDCTL, os.X_OK)


def etcd_required():
    """Whether the fleet tests must run: CTLRPC_REQUIRE_ETCD=1 in the environment (CI sets it,
    .ci/run), and then a missing etcd fails them instead of skipping them."""
    return os.environ.get("CTLRPC_REQUIRE_ETCD") == "1"


def without_etcd(what):
    """None when etcd and etcdctl are installed. Else says on stdout that `what` (a test) needs
    them and returns the exit status to end with: 77 (ctest: skipped), or 1 with
    CTLRPC_REQUIRE_ETCD=1 (a run that must include the fleet tests does not pass without
    them)."""
    if have_etcd():
        return None
    print(f"{what}: etcd or etcdctl not found (Debian: apt-get install etcd-server "
          "etcd-client)")
    if etcd_required():
        print("CTLRPC_REQUIRE_ETCD=1: failing rather than skipping")
        return 1
    return 77


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_until(check, what, timeout_s=10.0, step=0.02):
    """Poll `check` until it returns a true value (returned); AssertionError at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(step)


class Pki:
    """A CA and certificates for 127.0.0.1 made with openssl in `dir`."""

    def __init__(self, dir):
        self.dir = dir
        os.makedirs(dir, exist_ok=True)
        self.ca = os.path.join(dir, "ca.pem")
        self.ca_key = os.path.join(dir, "ca.key")
        self._ssl(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                   "-subj", "/CN=ctlrpc test CA", "-keyout", self.ca_key, "-out", self.ca])
        self.server, self.server_key = self.issue("server", server=True)
        self.client, self.client_key = self.issue("client")

    def issue(self, name, server=False):
        key = os.path.join(self.dir, f"{name}.key")
        csr = os.path.join(self.dir, f"{name}.csr")
        crt = os.path.join(self.dir, f"{name}.pem")
        ext = os.path.join(self.dir, f"{name}.ext")
        with open(ext, "w") as f:
            f.write("basicConstraints=CA:FALSE\n")
            if server:
                f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                        "extendedKeyUsage=serverAuth,clientAuth\n")
            else:
                f.write("extendedKeyUsage=clientAuth\n")
        self._ssl(["req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                   "-keyout", key, "-out", csr])
        self._ssl(["x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", self.ca_key,
                   "-CAcreateserial", "-days", "2", "-extfile", ext, "-out", crt])
        return crt, key

    @staticmethod
    def _ssl(args):
        subprocess.run(["openssl", *args], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=60)


class Etcd:
    """One etcd member. `url` is its client endpoint; `stop()` ends it (SIGTERM, then SIGKILL
    at a deadline), `start()` runs it again on the same ports and data directory, `wipe()`
    empties that directory, `pause()`/`resume()` SIGSTOP and SIGCONT it."""

    def __init__(self, tmp, pki=None, client_cert_auth=False, name="etcd"):
        self.dir = os.path.join(tmp, name)
        self.data = os.path.join(self.dir, "data")
        os.makedirs(self.dir, exist_ok=True)
        self.pki = pki
        self.client_cert_auth = client_cert_auth
        self.proc = None
        self.log = None
        self.scheme = "https" if pki else "http"
        self.start(fresh_ports=True)

    # ---- the process --------------------------------------------------------------------------

    def start(self, fresh_ports=False):
        for attempt in range(3):
            if fresh_ports or attempt:
                self.client_port, self.peer_port = free_port(), free_port()
            self.url = f"{self.scheme}://127.0.0.1:{self.client_port}"
            peer = f"http://127.0.0.1:{self.peer_port}"
            argv = [ETCD, "--name", "t", "--data-dir", self.data,
                    "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
                    "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                    "--initial-cluster", f"t={peer}", "--log-level", "warn",
                    "--logger", "zap"]
            if self.pki:
                argv += ["--cert-file", self.pki.server, "--key-file", self.pki.server_key]
                if self.client_cert_auth:
                    argv += ["--client-cert-auth", "--trusted-ca-file", self.pki.ca]
            self.log = open(os.path.join(self.dir, "etcd.log"), "ab")
            self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
            try:
                wait_until(self.ready, f"etcd at {self.url} to answer", START_S, 0.05)
                return
            except AssertionError:
                self.stop()
                if not fresh_ports and attempt == 0 and not self._port_taken():
                    raise
        raise AssertionError(f"etcd did not start: see {self.dir}/etcd.log")

    def _port_taken(self):
        with open(os.path.join(self.dir, "etcd.log"), "rb") as f:
            return b"address already in use" in f.read()

    def ready(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"etcd exited with {self.proc.returncode}: see "
                                 f"{self.dir}/etcd.log")
        try:
            ctx = None
            if self.pki:
                ctx = ssl.create_default_context(cafile=self.pki.ca)
                ctx.load_cert_chain(self.pki.client, self.pki.client_key)
            with urllib.request.urlopen(self.url + "/health", timeout=1, context=ctx) as r:
                return json.loads(r.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None
        if self.log:
            self.log.close()
            self.log = None

    def kill(self):
        """SIGKILL: etcd dies as on a crash."""
        self.proc.kill()
        self.proc.wait(timeout=10)
        self.proc = None

    def wipe(self):
        assert self.proc is None
        shutil.rmtree(self.data, ignore_errors=True)

    def pause(self):
        os.kill(self.proc.pid, signal.SIGSTOP)
        _, status = os.waitpid(self.proc.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status), status

    def resume(self):
        os.kill(self.proc.pid, signal.SIGCONT)

    # ---- etcdctl ------------------------------------------------------------------------------

    def ctl(self, *args, user=None, check=True, input=None):
        argv = [ETCDCTL, "--endpoints", self.url, "--command-timeout", "5s"]
        if self.pki:
            argv += ["--cacert", self.pki.ca, "--cert", self.pki.client,
                     "--key", self.pki.client_key]
        if user:
            argv += ["--user", user]
        r = subprocess.run(argv + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           input=input, timeout=30, env=dict(os.environ, ETCDCTL_API="3"))
        if check and r.returncode != 0:
            raise AssertionError(f"etcdctl {' '.join(args)}: {r.stderr.decode()}")
        return r.stdout.decode("utf-8", "replace")

    def put(self, key, value, user=None):
        """Put `value` (str or bytes) at `key`, read from stdin so any bytes go."""
        data = value.encode() if isinstance(value, str) else value
        argv = [ETCDCTL, "--endpoints", self.url, "--command-timeout", "5s"]
        if self.pki:
            argv += ["--cacert", self.pki.ca, "--cert", self.pki.client,
                     "--key", self.pki.client_key]
        if user:
            argv += ["--user", user]
        r = subprocess.run(argv + ["put", key], input=data, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=30)
        if r.returncode != 0:
            raise AssertionError(f"etcdctl put {key}: {r.stderr.decode()}")

    def get_prefix(self, prefix, user=None):
        """{key: value (parsed JSON)} under `prefix`, read with etcdctl's JSON output."""
        out = self.ctl("get", "--prefix", prefix, "-w", "json", user=user)
        import base64
        got = json.loads(out)
        return {base64.b64decode(kv["key"]).decode(): json.loads(base64.b64decode(kv["value"]))
                for kv in got.get("kvs", [])}

    def revision(self):
        out = json.loads(self.ctl("get", "/", "-w", "json"))
        return int(out["header"]["revision"])

    def lease_of(self, key):
        out = json.loads(self.ctl("get", key, "-w", "json"))
        kvs = out.get("kvs", [])
        return kvs[0].get("lease") if kvs else None

    def close(self):
        self.stop()


class Proxy:
    """A TCP proxy from 127.0.0.1:<port> to `target` ("host", port) that a test can cut:
    `cut()` closes every connection and refuses new ones (the far side sees nothing, as in a
    partition), `mend()` lets them through again. `refused` counts the connections closed at
    once while cut: with a cut proxy as a program's etcd, one per call the program tried."""

    def __init__(self, target_port):
        self.target = ("127.0.0.1", target_port)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._conns = []
        self._open = True
        self._stop = False
        self.refused = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self._stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                if not self._open:
                    c.close()
                    self.refused += 1
                    continue
                try:
                    u = socket.create_connection(self.target, timeout=2)
                except OSError:
                    c.close()
                    continue
                self._conns += [c, u]
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a, b):
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self):
        with self._lock:
            self._open = False
            conns, self._conns = self._conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def mend(self):
        with self._lock:
            self._open = True

    def close(self):
        self._stop = True
        self.cut()
        self.sock.close()


class TempDir:
    def __init__(self):
        self.path = tempfile.mkdtemp(prefix="ctlrpc-fleet-")

    def close(self):
        shutil.rmtree(self.path, ignore_errors=True)
