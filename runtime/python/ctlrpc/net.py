"""Addresses: the node's IP and endpoint parsing, by the C runtime's rules (runtime/src/net.c).

`node_ip()` returns the node's routable IPv4 address: `$CTLRPC_NODE_IP` when set (for
multi-homed hosts; it must be a valid IPv4 address), else the source address of the default
route (found by "connecting" a UDP socket, which sends no packet), else the first non-loopback
IPv4 interface that is up, else 127.0.0.1.

`parse_endpoint()` accepts `tcp://host:port` where host is a hostname, a dotted IPv4 address, a
bracketed IPv6 address or `*`, and port is 0..65535 or `*`; anything else is a ValueError whose
message quotes the text and says what is wrong.
"""

from __future__ import annotations

import fcntl
import functools
import ipaddress
import itertools
import os
import socket
import struct
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Tuple, cast

import zmq
from zmq.utils.monitor import parse_monitor_message

NODE_IP_ENV = "CTLRPC_NODE_IP"

# pyzmq's constants are enums, and an enum's `&` or a flag passed through makes a new member each
# time (about a microsecond): the per-call paths of the clients use the plain values.
ZMQ_EVENTS = int(zmq.EVENTS)
ZMQ_FD = int(zmq.FD)
ZMQ_RCVMORE = int(zmq.RCVMORE)
ZMQ_POLLIN = int(zmq.POLLIN)
ZMQ_NOBLOCK = int(zmq.NOBLOCK)
ENDPOINT_MAX = 300  # CTL_ENDPOINT_MAX (ctlrpc/net.h), with its terminating NUL

# Linux ioctls for an interface's flags and IPv4 address.
_SIOCGIFFLAGS = 0x8913
_SIOCGIFADDR = 0x8915
_IFF_UP = 0x1
_IFF_LOOPBACK = 0x8


@dataclass(frozen=True)
class Endpoint:
    """A parsed endpoint: `host` as written (brackets kept for IPv6), `port` (0 when any)."""

    host: str
    port: int
    any_port: bool

    def __str__(self) -> str:
        return f"tcp://{self.host}:{'*' if self.any_port else self.port}"


def _valid_hostname(h: str) -> bool:
    # ZeroMQ's own rule for a host it will dial or bind: the first character a letter or a
    # digit, then letters, digits, '-', '.' or '_' (it refuses '_bad-host' at connect).
    if not 0 < len(h) <= 253 or not (h[0].isascii() and h[0].isalnum()):
        return False
    return all(c.isascii() and (c.isalnum() or c in "-._") for c in h)


def parse_endpoint(text: str) -> Endpoint:
    """Parse `tcp://host:port`; ValueError naming the text and what is wrong."""
    scheme = "tcp://"
    if not isinstance(text, str):
        raise TypeError(f"an endpoint must be a str (tcp://host:port), not {type(text).__name__}")
    if not text:
        raise ValueError("endpoint is empty")
    if len(text.encode("utf-8", "surrogateescape")) >= ENDPOINT_MAX:
        raise ValueError(f"endpoint '{text[:40]}...' is longer than {ENDPOINT_MAX - 1} bytes")
    if not text.startswith(scheme):
        raise ValueError(f"endpoint '{text}' is not tcp://host:port (only tcp:// endpoints are "
                         "supported)")
    rest = text[len(scheme):]
    colon = rest.rfind(":")
    if colon < 0:
        raise ValueError(f"endpoint '{text}' has no port (write tcp://host:port, or :0 for any "
                         "free port)")
    host, port = rest[:colon], rest[colon + 1:]
    if not host:
        raise ValueError(f"endpoint '{text}' has no host")
    if host.startswith("["):
        if len(host) < 3 or not host.endswith("]"):
            raise ValueError(f"endpoint '{text}': bad IPv6 host")
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"endpoint '{text}': '{host[1:-1]}' is not an IPv6 address") \
                from None
    elif host != "*" and not _valid_hostname(host):
        raise ValueError(f"endpoint '{text}': host '{host}' is not a hostname or IPv4 address "
                         "(a hostname starts with a letter or a digit, then letters, digits, "
                         "'-', '.' or '_')")
    if port == "*":
        return Endpoint(host, 0, True)
    if not port:
        raise ValueError(f"endpoint '{text}' has no port")
    if len(port) > 5 or not all("0" <= c <= "9" for c in port):
        raise ValueError(f"endpoint '{text}': port '{port}' is not a number in 0..65535 or '*'")
    value = int(port)
    if value > 65535:
        raise ValueError(f"endpoint '{text}': port {value} is out of range (0..65535)")
    return Endpoint(host, value, value == 0)


def dialable(text: str) -> str:
    """`text` if a client can dial it (a host and a port, no wildcard); ValueError otherwise.
    Every call checks its address: addresses already found dialable are remembered (at most
    4096 of them), so the check costs a lookup on the hot path."""
    if type(text) is str:
        return _dialable_cached(text)
    return _dialable(text)


def _dialable(text: str) -> str:
    ep = parse_endpoint(text)
    if ep.any_port or ep.host == "*":
        raise ValueError(f"address '{text}' is not dialable: it needs a host and a port (a unit "
                         "reports its real endpoint once bound)")
    return text


_dialable_cached = functools.lru_cache(maxsize=4096)(_dialable)


def _probe_route() -> Optional[str]:
    """The local address of a UDP socket "connected" to a public address (sends nothing)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("8.8.8.8", 53))
            ip = s.getsockname()[0]
    except OSError:
        return None
    return ip if isinstance(ip, str) and ip != "0.0.0.0" else None


def _first_interface() -> Optional[str]:
    """The first up, non-loopback IPv4 interface address."""
    try:
        names = socket.if_nameindex()
    except OSError:
        return None
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    except OSError:
        return None
    with s:
        for _, name in names:
            req = struct.pack("256s", name.encode()[:15])
            try:
                flags = struct.unpack_from("H", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, req),
                                           16)[0]
                if not flags & _IFF_UP or flags & _IFF_LOOPBACK:
                    continue
                addr = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, req)
            except OSError:
                continue  # no IPv4 address, or gone meanwhile
            return socket.inet_ntoa(addr[20:24])
    return None


def node_ip() -> str:
    """The node's routable IPv4 address (see the module's docstring for the order).

    ValueError when $CTLRPC_NODE_IP is set to something that is not an IPv4 address.
    """
    env = os.environ.get(NODE_IP_ENV, "")
    if env:
        try:
            socket.inet_pton(socket.AF_INET, env)
        except OSError:
            raise ValueError(f"{NODE_IP_ENV}='{env}' is not an IPv4 address") from None
        return env
    return _probe_route() or _first_interface() or "127.0.0.1"


def wants_ipv6(host: str) -> bool:
    """Whether a socket for `host` (as parse_endpoint keeps it) needs ZMQ_IPV6: every host but
    an IPv4 address and the wildcard `*`. A bracketed IPv6 address does; a name does too, so a
    name with only AAAA records resolves (ZeroMQ then asks the resolver for IPv6 addresses and,
    where a name has none, for its IPv4 ones mapped into IPv6)."""
    if host == "*":
        return False
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return True
    return False


# The one source of inproc endpoint names (socket monitors): a counter for the life of the
# process, so a name is never used twice, whatever objects come and go (an object's id() or
# a socket's descriptor is reused as soon as it is freed, while libzmq releases an inproc name
# later, on its reaper thread).
_inproc_ids = itertools.count()


def inproc_name(what: str) -> str:
    """A fresh `inproc://ctlrpc-<what>-<pid>-<n>` endpoint, never returned twice in a process."""
    return f"inproc://ctlrpc-{what}-{os.getpid()}-{next(_inproc_ids)}"


def open_monitor(ctx: "zmq.Context[Any]", sock: "zmq.Socket[Any]", events: int,
                 what: str) -> "zmq.Socket[Any]":
    """Start `sock`'s monitor for `events` on a fresh inproc name and return the PAIR socket
    that reads it (no linger, no receive limit: ZeroMQ sends monitor events blocking, so its
    reader must not refuse them). Set up before a connect or bind, so no event is missed. On
    failure nothing is left open and the ZMQError is raised."""
    endpoint = inproc_name(what)
    sock.monitor(endpoint, events)
    try:
        mon: zmq.Socket[Any] = zmq.Socket(ctx, zmq.PAIR)
    except zmq.ZMQError:
        stop_monitor(sock)
        raise
    try:
        mon.setsockopt(zmq.LINGER, 0)
        mon.setsockopt(zmq.RCVHWM, 0)
        mon.setsockopt(zmq.MAXMSGSIZE, -1)
        mon.connect(endpoint)
    except zmq.ZMQError:
        mon.close(linger=0)
        stop_monitor(sock)
        raise
    return mon


def close_monitor(sock: "zmq.Socket[Any]", mon: "zmq.Socket[Any]") -> None:
    """Stop `sock`'s monitor and close its reader (before `sock` itself is closed)."""
    stop_monitor(sock)
    mon.close(linger=0)


def stop_monitor(sock: "zmq.Socket[Any]") -> None:
    """Stop `sock`'s monitor (its reader gets EVENT_MONITOR_STOPPED if it asked for it)."""
    try:
        sock.disable_monitor()
    except zmq.ZMQError:
        pass


def monitor_events(mon: "zmq.Socket[Any]", most: int = -1) -> Iterator[Tuple[int, int]]:
    """The (event, value) pairs waiting on a socket monitor, without blocking, at most `most`
    of them (negative: every one); frames that do not parse as a monitor message are
    skipped."""
    while most != 0:
        most -= 1
        try:
            # Asking first is cheaper than the zmq.Again an empty receive raises (a client
            # reads a pooled socket's monitor before every request it sends on it).
            if not cast(int, mon.getsockopt(ZMQ_EVENTS)) & ZMQ_POLLIN:
                return
            frames = mon.recv_multipart(ZMQ_NOBLOCK)
        except zmq.ZMQError:
            return
        try:
            msg = parse_monitor_message(frames)
        except Exception:
            continue
        yield int(msg["event"]), int(msg["value"])
