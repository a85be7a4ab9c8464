"""A small Python peer of the control plane, written from docs/PROTOCOL.md alone.

Shared by the interop tests: a DEALER client that speaks the wire contract
([op, id, args] in, [id, ok, result_or_error] out, msgpack with bin for
bytes and str for strings), and helpers to run the programs under test
(units print their endpoint as their first line; nothing sleeps on a guess).

Needs python3-zmq and python3-msgpack (the system /usr/bin/python3).
"""

import os
import secrets
import select
import signal
import subprocess
import sys
import time

import msgpack
import zmq

# The Python tests' helpers (no ctlrpc import): one dead_address for every suite.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import support  # noqa: E402

dead_address = support.dead_address

START_S = 20   # a unit must print its endpoint within this
CALL_S = 10    # a reply must arrive within this


def pack(obj):
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data):
    return msgpack.unpackb(data, raw=False)


def new_id():
    """12 lowercase hex characters, as the reference client uses."""
    return secrets.token_hex(6)


class NoReply(Exception):
    pass


class Client:
    """One DEALER socket to one unit; one request in flight at a time."""

    def __init__(self, ctx, address, sock_type=zmq.DEALER):
        self.sock = ctx.socket(sock_type)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)

    def close(self):
        self.sock.close(0)

    def send(self, op, args, rid=None):
        rid = new_id() if rid is None else rid
        self.sock.send(pack([op, rid, args]))
        return rid

    def send_raw(self, *frames):
        self.sock.send_multipart(list(frames))

    def recv(self, timeout_s=CALL_S):
        if not self.sock.poll(int(timeout_s * 1000)):
            raise NoReply("no reply within %.1f s" % timeout_s)
        return unpack(self.sock.recv())

    def nothing_within(self, timeout_s):
        """True when no message arrives within timeout_s."""
        return not self.sock.poll(int(timeout_s * 1000))

    def call(self, op, args=None, rid=None):
        """Send a request; return (ok, result_or_error) after checking the
        reply's shape and that it carries our id."""
        rid = self.send(op, {} if args is None else args, rid)
        reply = self.recv()
        assert isinstance(reply, list) and len(reply) == 3, reply
        assert reply[0] == rid, (reply[0], rid)
        assert isinstance(reply[1], bool), reply
        return reply[1], reply[2]

    def notify(self, op, args):
        self.sock.send(pack([op, "", args]))


class Process:
    """A program that prints its endpoint as its first line of stdout."""

    def __init__(self, argv, cwd=None):
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, cwd=cwd)
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

    def signal(self, sig):
        self.proc.send_signal(sig)

    def freeze(self):
        """SIGSTOP, and wait until every thread has stopped (kill returns
        before that, and a thread still running could answer a call)."""
        self.proc.send_signal(signal.SIGSTOP)
        _, status = os.waitpid(self.proc.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status), status

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


def wait_for(check, what, timeout_s=10):
    """Poll `check` until it is true (for the effect of a notify seen over
    another connection, where order is not promised)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)
