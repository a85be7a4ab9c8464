#!/usr/bin/python3
"""Write the fuzz targets' seed corpus (tests/fuzz/corpus/<target>/).

    /usr/bin/python3 tests/fuzz/make_corpus.py [OUT_DIR]

Seeds are valid messages of idl/storage.idl and docs/PROTOCOL.md (plus a few
near misses), framed as fuzz.h and each target's opening comment describe.
The output is deterministic; the files are small and kept in the repository,
so run this again only when the protocol or the IDL changes.
"""
import os
import sys

import msgpack

SEP = b"\xc1CTL"
ID = "0123456789ab"  # fuzz_reply's call id


def pack(obj):
    return msgpack.packb(obj, use_bin_type=True)


def req(op, args, rid="000000000001"):
    return pack([op, rid, args])


def nested(depth):
    """A list nested `depth` deep (deeper than the decoders allow)."""
    v = 0
    for _ in range(depth):
        v = [v]
    return v


def unit_input(*payloads, mode=0):
    """fuzz_unit: messages, each a framing byte and a payload."""
    return SEP.join(bytes([mode]) + p for p in payloads)


def reply(ok, body, rid=ID):
    return pack([rid, ok, body])


def err(kind, msg="it failed", reason=None, blobs=None):
    return {"kind": kind, "msg": msg, "reason": reason, "blobs": blobs}


OPS = ["put", "get", "describe", "pin", "delete", "list", "stats"]


def reply_input(op, *payloads, two_frames=False):
    """fuzz_reply: the op byte, then messages, each a flags byte and a payload."""
    flags = bytes([1 if two_frames else 0])
    return bytes([OPS.index(op)]) + SEP.join(flags + p for p in payloads)


def unit_seeds():
    put = req("put", {"key": "k1", "data": b"hello"})
    put_pin = req("put", {"key": "k2", "data": b"pinned blob", "pin": True}, "000000000002")
    get = req("get", {"keys": ["k1", "k2"]}, "000000000003")
    return {
        "put": unit_input(put),
        "put-get": unit_input(put, put_pin, get),
        "put-describe": unit_input(put, req("describe", {"keys": ["k1"]})),
        "put-pin-delete": unit_input(put, req("pin", {"keys": ["k1", "k1"]}),
                                     req("delete", {"keys": ["k1"]})),
        "put-unpin-abort-get": unit_input(
            put_pin, put, req("unpin", {"keys": ["k2", "nope"]}, ""),
            req("abort", {"keys": ["k1", "k2"]}, ""), get),
        "put-list": unit_input(put, put_pin, req("list", {"prefix": "k"}),
                               req("list", {})),
        "put-overwrite-pinned": unit_input(put_pin, put_pin),
        "put-full": unit_input(req("put", {"key": "big", "data": bytes(2000)})),
        "get-missing": unit_input(req("get", {"keys": ["a", "b"]})),
        "delete-missing": unit_input(req("delete", {"keys": ["a"]})),
        "stats": unit_input(req("stats", {})),
        "stats-req-framing": unit_input(req("stats", {}), mode=4),
        "stats-empty-id": unit_input(req("stats", {}, "")),
        "unknown-op": unit_input(req("frobnicate", {"x": 1})),
        "bad-arg-type": unit_input(req("put", {"key": 7, "data": b"x"})),
        "bad-list-item": unit_input(req("get", {"keys": ["a", 2, "c"]})),
        "missing-arg": unit_input(req("put", {"key": "k"})),
        "unknown-arg": unit_input(req("list", {"prefix": "", "limit": 3})),
        "args-not-map": unit_input(pack(["stats", "000000000001", [1, 2]])),
        "notify-bad-args": unit_input(req("abort", {"keys": "k1"}, "")),
        "id-not-str": unit_input(pack(["stats", 1, {}])),
        "not-array": unit_input(pack({"op": "stats"})),
        "trailing-bytes": unit_input(req("stats", {}) + b"\x00"),
        "deep-args": unit_input(req("list", {"prefix": nested(40)})),
        "huge-count": unit_input(b"\x93\xa4list\xa1x\xdf\xff\xff\xff\xff"),
        # The built-in ops every unit answers (docs/PROTOCOL.md, "Built-in ops").
        "builtin-describe": unit_input(req("_describe", {})),
        "builtin-health": unit_input(req("_health", {})),
        "builtin-stats": unit_input(put, req("_stats", {}, "000000000002")),
        "builtin-all": unit_input(req("_health", {}), put, req("_describe", {}, "2"),
                                  req("_stats", {}, "3"), req("_health", {}, ""), mode=4),
        "builtin-args": unit_input(req("_stats", {"x": 1}), req("_describe", {1: 2}, "2")),
        "builtin-near-miss": unit_input(req("_stat", {}), req("_healthy", {}, "2")),
        # Deadlines in ids (docs/PROTOCOL.md, "Deadlines"): long past (skipped), far ahead
        # and near misses of the form (served).
        "deadline-passed": unit_input(req("put", {"key": "k1", "data": b"x"}, "0001@1"),
                                      req("_stats", {}, "0002@1"),
                                      req("get", {"keys": ["k1"]}, "0003@0000000000001")),
        "deadline-ahead": unit_input(put, req("get", {"keys": ["k1"]}, "0002@9999999999999999"),
                                     req("get", {"keys": ["k1"]}, "0003@99999999999999999"),
                                     req("stats", {}, "0004@1x")),
    }


def reply_seeds():
    info = {"key": "k", "size": 3, "pinned": True, "spilled": False}
    stats = {"blobs": 1, "bytes": 3, "capacity": 1024, "pinned": 0,
             "spilled": 0, "requests": 9, "dropped": 0}
    return {
        "put-ok": reply_input("put", reply(True, 5)),
        "get-ok": reply_input("get", reply(True, [b"abc", b""])),
        "describe-ok": reply_input("describe", reply(True, [info, info])),
        "pin-ok": reply_input("pin", reply(True, 2)),
        "delete-ok": reply_input("delete", reply(True, 0)),
        "list-ok": reply_input("list", reply(True, ["a", "b/c"])),
        "stats-ok": reply_input("stats", reply(True, stats)),
        "err-unitfull": reply_input("put", reply(False, err("UnitFull"))),
        "err-busy": reply_input("put", reply(False, err("Busy", reason="pinned"))),
        "err-missing": reply_input("get", reply(False, err("Missing", blobs=["a", "b"]))),
        "err-protocol": reply_input("list", reply(False, err("Protocol", "bad arg"))),
        "err-unknown-kind": reply_input("stats", reply(False, err("Weird"))),
        "err-not-a-map": reply_input("stats", reply(False, "no")),
        "late-then-ours": reply_input("pin", reply(True, 1, "aaaaaaaaaaaa"),
                                      reply(True, 1)),
        "late-only": reply_input("pin", reply(True, 1, "")),
        "bad-result": reply_input("get", reply(True, 5)),
        "bad-record": reply_input("describe", reply(True, [{"key": 1}])),
        "two-frames": reply_input("stats", reply(True, stats), two_frames=True),
        "not-a-reply": reply_input("put", pack(["x"])),
    }


def endpoint_seeds():
    return {
        "ipv4": b"tcp://127.0.0.1:5555",
        "any-port": b"tcp://127.0.0.1:*",
        "port-0": b"tcp://10.0.0.1:0",
        "any-host": b"tcp://*:7000",
        "ipv6": b"tcp://[::1]:80",
        "hostname": b"tcp://unit-3.rack.example:65535",
        "no-port": b"tcp://127.0.0.1",
        "big-port": b"tcp://127.0.0.1:65536",
        "other-scheme": b"ipc:///tmp/x",
        "bad-ipv6": b"tcp://[::1:80",
    }


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "corpus")
    for target, seeds in (("fuzz_unit", unit_seeds()),
                          ("fuzz_reply", reply_seeds()),
                          ("fuzz_endpoint", endpoint_seeds())):
        d = os.path.join(out, target)
        os.makedirs(d, exist_ok=True)
        for name, data in sorted(seeds.items()):
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
        print(f"{d}: {len(seeds)} seeds")


if __name__ == "__main__":
    main()
