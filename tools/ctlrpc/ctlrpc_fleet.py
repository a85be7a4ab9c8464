"""The generic caller's fleet side: units found in etcd instead of given by address.

    ctlrpc health --etcd URL --service storage        every serving unit of the service
    ctlrpc call --etcd URL --service storage OP ...   fan-out to them
    ctlrpc units --etcd URL --service storage [--json]
    ctlrpc exporter --etcd URL --service storage --listen HOST:PORT

Wherever the caller takes an address, `--service` (with `--etcd URL[,URL...]`, default
$CTLRPC_ETCD, and `--namespace`) means the addresses of every serving unit of that service, as
one listing of etcd says (docs/PROTOCOL.md, "Membership in etcd"). `units` prints the
membership; `exporter` serves the Prometheus text format at /metrics for every unit of the
service, following the membership with a ctlrpc.Directory. An etcd that cannot be reached at
all is exit 8, naming the endpoints; an etcd user's password is read from
$CTLRPC_ETCD_PASSWORD only.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import signal
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import ctlrpc

import ctlrpc_caller as caller

# ctlrpc.directory and ctlrpc.etcd are imported by the functions that use them, so a caller
# that never names --etcd does not load urllib, ssl and http.client.

ETCD_TIMEOUT_S = 2.0  # the deadline of one request to etcd


def add_arguments(common: argparse.ArgumentParser) -> None:
    """The fleet options, on every command that takes an address."""
    g = common.add_argument_group("fleet (units found in etcd)")
    g.add_argument("--etcd", metavar="URL[,URL...]",
                   help="etcd endpoints, tried in order (default $CTLRPC_ETCD); with --service "
                        "the units are every serving unit of that service")
    g.add_argument("--service", metavar="NAME", help="the service whose units to call")
    g.add_argument("--namespace", metavar="NAME", default="default",
                   help="the fleet's namespace (default 'default')")
    g.add_argument("--etcd-cacert", metavar="FILE", help="check https etcd against this CA")
    g.add_argument("--etcd-cert", metavar="FILE", help="client certificate for etcd")
    g.add_argument("--etcd-key", metavar="FILE", help="its private key")
    g.add_argument("--etcd-user", metavar="NAME",
                   help="etcd user; the password comes from $CTLRPC_ETCD_PASSWORD")


def add_commands(sub: Any, calling: argparse.ArgumentParser,
                 base: argparse.ArgumentParser) -> None:
    """`units` (which only reads etcd: `base`'s options, --timeout and the fleet's) and
    `exporter` (which calls every unit of the service: `calling`'s, without --address and
    --idl)."""
    u = sub.add_parser("units", parents=[base],
                       help="the membership of a service in etcd: --etcd URL --service NAME")
    u.add_argument("words", nargs="*", metavar="", help=argparse.SUPPRESS)
    u.add_argument("--json", action="store_true", help="print JSON")
    u.set_defaults(address=None, idl=None, retries=0, retry_busy=False, curve_server_key=None,
                   curve_key=None)
    x = sub.add_parser("exporter", parents=[calling],
                       help="serve Prometheus metrics of every unit of a service at /metrics")
    x.add_argument("words", nargs="*", metavar="", help=argparse.SUPPRESS)
    x.add_argument("--listen", metavar="HOST:PORT", default="127.0.0.1:9464",
                   help="where to serve /metrics (default 127.0.0.1:9464; port 0 picks one; "
                        "the first line of stdout is the URL)")
    x.set_defaults(address=None, idl=None)


def wanted(a: argparse.Namespace) -> bool:
    """Whether this command line asks for a fleet (--service, or --etcd given)."""
    return getattr(a, "service", None) is not None or getattr(a, "etcd", None) is not None


def etcd_of(a: argparse.Namespace) -> Any:
    """The etcd of the command line (a ctlrpc.Etcd); usage errors name the flag at fault."""
    from ctlrpc import directory as _dir
    if a.service is None:
        raise caller.usage(f"{a.command}: --etcd needs --service NAME (the service whose units "
                           "to find)")
    endpoints = a.etcd if a.etcd is not None else os.environ.get("CTLRPC_ETCD")
    if not endpoints:
        raise caller.usage(f"{a.command}: --service needs --etcd URL[,URL...] (or $CTLRPC_ETCD)")
    if (a.etcd_cert is None) != (a.etcd_key is None):
        raise caller.usage("--etcd-cert and --etcd-key go together")
    try:
        _dir.check_name("--service", a.service)
        _dir.check_name("--namespace", a.namespace)
        return ctlrpc.Etcd(endpoints, cacert=a.etcd_cacert, cert=a.etcd_cert, key=a.etcd_key,
                           user=a.etcd_user, timeout=min(ETCD_TIMEOUT_S, max(0.1, a.timeout)))
    except ValueError as e:
        raise caller.usage(str(e)) from None


def etcd_failure(e: Any) -> caller.Fail:
    from ctlrpc.etcd import EtcdUnreachable
    if isinstance(e, EtcdUnreachable):
        return caller.Fail(caller.EXIT_UNREACHABLE, e.msg)
    if getattr(e, "auth", False):
        return caller.Fail(caller.EXIT_AUTH, e.msg)
    return caller.Fail(caller.EXIT_LOCAL, e.msg)


LISTING_RETRY_S = 1.0  # an etcd no endpoint answers is tried again, with backoff, this long


def listing(a: argparse.Namespace, etcd: Any) -> Any:
    """One listing of the service, retried with backoff for about a second (never past the
    command's --timeout) while no etcd endpoint answers, as ctl-storage does; a failure names
    the service and its namespace."""
    from ctlrpc import directory as _dir
    from ctlrpc.etcd import Backoff, EtcdError, EtcdUnreachable
    until = time.monotonic() + min(LISTING_RETRY_S, max(0.0, a.timeout))
    backoff = Backoff()
    while True:
        try:
            got = _dir.list_units(etcd, a.service, a.namespace)
            break
        except EtcdError as e:
            wait = backoff.next()
            if not isinstance(e, EtcdUnreachable) or time.monotonic() + wait >= until:
                fail = etcd_failure(e)
                fail.msg = f"service '{a.service}' (namespace {a.namespace}): {fail.msg}"
                raise fail from None
            time.sleep(wait)
    if got.first_bad is not None:
        key, why = got.first_bad
        sys.stderr.write(f"{caller.PROG}: skipped {got.skipped} value(s) under "
                         f"{_dir.prefix(a.service, a.namespace)} that are not units (first: "
                         f"{key}: {why})\n")
    return got


def resolve(a: argparse.Namespace) -> None:
    """With --service: add the serving units' addresses to a.address (exit 8 when etcd cannot
    be reached; when the service has no serving unit, exit 8 too: there is nothing to call)."""
    if not wanted(a) or a.command in ("units", "exporter", "keygen"):
        return
    etcd = etcd_of(a)
    got = listing(a, etcd)
    addresses = [u.address for _, u in sorted(got.units.items()) if u.serving]
    if not addresses:
        raise caller.Fail(caller.EXIT_UNREACHABLE,
                          f"no serving unit of service '{a.service}' in namespace "
                          f"'{a.namespace}' (etcd {etcd.where}: {len(got.units)} listed)")
    a.address = list(a.address or []) + addresses


def age_text(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def cmd_units(a: argparse.Namespace, client: Optional[ctlrpc.Client]) -> int:
    if a.words:
        raise caller.usage(f"units: unexpected argument '{a.words[0]}'")
    if a.service is None and a.etcd is None and not os.environ.get("CTLRPC_ETCD"):
        raise caller.usage("units: --etcd URL --service NAME")
    etcd = etcd_of(a)
    got = listing(a, etcd)
    now = time.time()
    units = [u for _, u in sorted(got.units.items())]
    if not units:
        sys.stderr.write(f"{caller.PROG}: no unit of service '{a.service}' is registered in "
                         f"namespace '{a.namespace}' (etcd {etcd.where})\n")
    if a.json:
        # Each unit's value as it is in etcd, with its unit id, namespace and age.
        caller.out(json.dumps([dict(u.fields, unit_id=u.unit_id, namespace=u.namespace,
                                    age_s=round(max(0.0, now - u.started), 3)
                                    if u.started else None) for u in units]))
        return 0
    caller.out(f"{'UNIT_ID':<32} {'ADDRESS':<28} {'STATE':<9} {'AGE':>8}  VERSION")
    for u in units:
        age = age_text(now - u.started) if u.started else "?"
        caller.out(f"{u.unit_id:<32} {u.address:<28} {u.state:<9} {age:>8}  {u.version}")
    return 0


# ---- the exporter ---------------------------------------------------------------------------

def scrape(a: argparse.Namespace, client: ctlrpc.Client, d: Any) -> str:
    units = d.units()
    rows: List[Tuple[str, Optional[Dict[str, Any]], Optional[caller.Fail]]] = []
    if units:
        for o in client.call_many("_stats", [(u.address, {}) for u in units], a.timeout):
            if o.ok and isinstance(o.result, dict):
                rows.append((o.address, o.result, None))
            else:
                err = caller.Fail(caller.EXIT_TRANSFER, str(o.error or "not a map"))
                rows.append((o.address, None, err))
    # One row per unit (two units may share an address only by mistake: the first wins).
    by_address = {}
    for u in units:
        by_address.setdefault(u.address, {"unit": u.unit_id, "state": u.state})
    text = caller.prometheus(rows, by_address)
    lines = [text.rstrip("\n")] if rows else []
    stale = 1 if d.stale else 0
    lines += [
        "# HELP ctlrpc_directory_units Units of the service listed in etcd, by state.",
        "# TYPE ctlrpc_directory_units gauge"]
    states: Dict[str, int] = {"serving": 0, "draining": 0}
    for u in units:
        states[u.state] = states.get(u.state, 0) + 1
    for st, n in sorted(states.items()):
        lines.append(f"ctlrpc_directory_units{caller.labels(service=a.service, state=st)} {n}")
    lines += [
        "# HELP ctlrpc_directory_stale Whether etcd cannot be reached (the membership is the "
        "last one seen).",
        "# TYPE ctlrpc_directory_stale gauge",
        f"ctlrpc_directory_stale{caller.labels(service=a.service)} {stale}",
        "# HELP ctlrpc_directory_contact_age_seconds Seconds since etcd last answered.",
        "# TYPE ctlrpc_directory_contact_age_seconds gauge",
        f"ctlrpc_directory_contact_age_seconds{caller.labels(service=a.service)} {d.age:.3f}",
        "# HELP ctlrpc_directory_skipped_total Values under the service's prefix that are not "
        "units.",
        "# TYPE ctlrpc_directory_skipped_total counter",
        f"ctlrpc_directory_skipped_total{caller.labels(service=a.service)} {d.skipped}",
    ]
    return "\n".join(lines) + "\n"


def parse_listen(text: str) -> Tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise caller.usage(f"exporter: --listen '{text}' is not HOST:PORT")
    return host, int(port)


def cmd_exporter(a: argparse.Namespace, client: ctlrpc.Client) -> int:
    from ctlrpc.etcd import EtcdError
    if a.words:
        raise caller.usage(f"exporter: unexpected argument '{a.words[0]}'")
    host, port = parse_listen(a.listen)
    etcd = etcd_of(a)
    try:
        d = ctlrpc.Directory(etcd, a.service, a.namespace,
                             start_timeout=min(ETCD_TIMEOUT_S, a.timeout))
    except EtcdError as e:
        raise etcd_failure(e) from None
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_error(404, "only /metrics is served here")
                return
            with lock:  # one scrape at a time: a fan-out is bounded by --timeout
                body = scrape(a, client, d).encode("utf-8")
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    stop = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    try:
        server = http.server.ThreadingHTTPServer((host, port), Handler)
    except OSError as e:
        d.close()
        raise caller.Fail(caller.EXIT_LOCAL, f"exporter: cannot listen on {a.listen}: "
                          f"{e.strerror or e}") from None
    server.daemon_threads = True
    bound = server.server_address
    shown = f"[{bound[0]}]" if ":" in str(bound[0]) else str(bound[0])
    caller.out(f"http://{shown}:{bound[1]}/metrics")
    sys.stdout.flush()
    t = threading.Thread(target=server.serve_forever, daemon=True, name="ctlrpc-exporter")
    t.start()
    try:
        signal.sigwait(stop)
    finally:
        server.shutdown()
        server.server_close()
        d.close()
    return 0


COMMANDS = {"units": cmd_units, "exporter": cmd_exporter}
