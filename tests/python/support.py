"""What the Python runtime's tests share: running the programs under test, command lines, waits.

The tests run with runtime/python on PYTHONPATH (the ctests set it), with the system Python
(/usr/bin/python3: python3-zmq and python3-msgpack). A unit prints its endpoint as its first
line of stdout; nothing here sleeps on a guess, and every wait has a deadline.
"""

import argparse
import os
import select
import signal
import socket
import subprocess
import sys
import time
import unittest

START_S = 20  # a unit must print its endpoint within this
RUN_S = 30  # a command must finish within this


def main(*options):
    """Run the tests of the calling script: `options` are the --NAME command-line options it
    takes (program paths); their values are returned in a namespace before unittest runs."""
    parser = argparse.ArgumentParser()
    for name in options:
        parser.add_argument("--" + name, required=True)
    args, rest = parser.parse_known_args()
    return args, [sys.argv[0]] + rest


def run_tests(argv):
    unittest.main(argv=argv, verbosity=2)


class Process:
    """A program that prints its endpoint as its first line of stdout. `stderr`: where its
    standard error goes (a file; default the test's)."""

    def __init__(self, argv, stderr=None):
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr)
        self.address = self._first_line()

    def _first_line(self):
        fd = self.proc.stdout.fileno()
        buf = b""
        deadline = time.monotonic() + START_S
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise RuntimeError("%s did not print its endpoint" % self.proc.args[0])
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1)
                if not chunk:
                    raise RuntimeError("%s exited before printing its endpoint"
                                       % self.proc.args[0])
                buf += chunk
        return buf.decode().strip()

    def freeze(self):
        """SIGSTOP, and wait until every thread has stopped."""
        self.proc.send_signal(signal.SIGSTOP)
        _, status = os.waitpid(self.proc.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status), status

    def thaw(self):
        self.proc.send_signal(signal.SIGCONT)

    def stop(self):
        """SIGTERM (after SIGCONT, in case a test froze it); the exit status."""
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


# The sockets dead_address holds, by port: bound, never listening, for the life of the process.
_DEAD = {}


def dead_address():
    """tcp://127.0.0.1:<port> where nothing listens: a connection is refused. The port stays
    bound (not listening) while the process lives, so no other unit on the machine can take it
    and receive what a test sends there (a port bound and closed again is free for the next
    bind, and the kernel picks from fewer ports when many wait in TIME_WAIT)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    _DEAD[port] = s
    return "tcp://127.0.0.1:%d" % port


def dead_release(address):
    """Let a port of dead_address go, for a test that then serves `address`."""
    s = _DEAD.pop(int(address.rsplit(":", 1)[1]), None)
    if s is not None:
        s.close()


def have_ipv6_loopback():
    """Whether this machine has IPv6 loopback (a socket binds ::1)."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


IPV6_ONLY_NAMES = ("ip6-localhost", "ip6-loopback", "localhost6")


def ipv6_only_name():
    """A name of this machine that resolves to ::1 and nothing else (Debian's /etc/hosts has
    ip6-localhost), or None: the first of IPV6_ONLY_NAMES that does."""
    for name in IPV6_ONLY_NAMES:
        try:
            found = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
        except OSError:
            continue
        if found and all(f[0] == socket.AF_INET6 and f[4][0] == "::1" for f in found):
            return name
    return None


def wait_for(check, what, timeout_s=10):
    """Poll `check` until it is true."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    raise AssertionError("timed out waiting for " + what)
