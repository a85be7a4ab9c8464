"""The checker and the model: facts computed for the render stage, determinism, immutability,
and rules whose diagnostics the fixtures do not pin down."""

import dataclasses
import os
import unittest

import support
from ctlrpc_gen import model
from ctlrpc_gen.check import check
from ctlrpc_gen.diag import Diagnostics
from ctlrpc_gen.parser import load_program, parse
from ctlrpc_gen import ast


def load(path):
    diags = Diagnostics()
    m = check(load_program(path, diags), diags)
    return m, diags


def check_text(text):
    diags = Diagnostics()
    f = parse(text, "t.idl", diags)
    m = check(ast.Program(f, (f,), {"t.idl": ()}), diags)
    return m, diags


EVERYTHING = os.path.join(support.GOOD, "everything.idl")


class Storage(unittest.TestCase):
    """idl/storage.idl matches the contract of docs/STORAGE.md."""

    def setUp(self):
        self.m, diags = load(support.STORAGE_IDL)
        self.assertIsNotNone(self.m, diags.render())

    def test_ops_args_results_and_errors(self):
        table = {op.name: (tuple(a.idl for a in op.args),
                           op.result.idl if op.result else None, op.raises, op.no_reply)
                 for op in self.m.ops}
        self.assertEqual(table, {
            "put": (("key: str", "data: bin", "pin: bool = false"), "u64",
                    ("UnitFull", "Busy"), False),
            "get": (("keys: list<str>",), "list<bin>", ("Missing",), False),
            "describe": (("keys: list<str>",), "list<BlobInfo>", ("Missing",), False),
            "pin": (("keys: list<str>",), "u64", ("Missing",), False),
            "unpin": (("keys: list<str>",), None, (), True),
            "abort": (("keys: list<str>",), None, (), True),
            "delete": (("keys: list<str>",), "u64", ("Busy",), False),
            "list": (('prefix: str = ""', 'after: str = ""', "limit: u32 = 0"), "list<str>",
                     (), False),
            "stats": ((), "UnitStats", (), False),
        })

    def test_idempotent_ops(self):
        # Reads and pin run twice to the same effect and answer; put (with pin, a retry of a
        # put that ran fails Busy) and delete (a retry answers 0) do not; notify ops cannot.
        self.assertEqual([op.name for op in self.m.ops if op.idempotent],
                         ["get", "describe", "pin", "list", "stats"])
        self.assertEqual(self.m.op("get").idl,
                         "idempotent op get(keys: list<str>) -> list<bin> raises Missing")

    def test_records(self):
        fields = {r.name: [f.idl for f in r.fields] for r in self.m.records}
        self.assertEqual(fields, {
            "BlobInfo": ["key: str", "size: u64", "pinned: bool", "spilled: bool"],
            "UnitStats": ["blobs: u64", "bytes: u64", "capacity: u64", "pinned: u64",
                          "spilled: u64", "requests: u64", "dropped: u64",
                          "index_bytes: u64 = 0", "index_capacity: u64 = 0"],
        })

    def test_docs_are_carried(self):
        self.assertTrue(self.m.service.doc.startswith("A storage unit"))
        self.assertTrue(self.m.op("put").doc.startswith("Store `data`"))
        self.assertEqual(self.m.op("put").args[0].doc, "The blob's key.")
        self.assertEqual(self.m.record("BlobInfo").fields[1].doc, "Its length in bytes.")


class Facts(unittest.TestCase):
    def setUp(self):
        self.m, diags = load(EVERYTHING)
        self.assertIsNotNone(self.m, diags.render())

    def test_op_order_and_name_index(self):
        self.assertEqual([op.index for op in self.m.ops], list(range(len(self.m.ops))))
        names = [op.name for op in self.m.op_index]
        self.assertEqual(names, sorted(names))
        self.assertEqual(sorted(op.name for op in self.m.ops), names)
        self.assertEqual(self.m.ops[0].name, "echo")

    def test_no_reply(self):
        self.assertEqual([op.name for op in self.m.ops if op.no_reply], ["forget", "poke"])
        self.assertIsNone(self.m.op("ping").result)

    def test_families_and_nullability(self):
        c = {f.name: f.type for f in self.m.record("Containers").fields}
        self.assertEqual((c["ints"].family, c["names"].family, c["when"].family),
                         ("array", "map", "map"))
        self.assertEqual((c["maybe"].family, c["maybe"].nullable), ("str", True))
        self.assertEqual(c["holes"].elem.nullable, True)
        s = {f.name: f.type for f in self.m.record("Scalars").fields}
        self.assertEqual([s[n].family for n in ("flag", "small", "total", "ratio", "name", "blob")],
                         ["bool", "int", "int", "float", "str", "bin"])
        self.assertEqual(s["count"].int_range, (0, 2 ** 32 - 1))

    def test_defaults_and_required(self):
        c = {f.name: f for f in self.m.record("Containers").fields}
        self.assertTrue(c["ints"].required)
        self.assertEqual((c["maybe"].default, c["maybe"].default_written), (model.NULL, False))
        self.assertFalse(c["maybe"].required)
        self.assertEqual(c["maybe_d"].default, model.Value("str", "set", '"set"'))
        s = {f.name: f.default for f in self.m.record("Scalars").fields}
        self.assertEqual(s["count_d"], model.Value("int", 0xFFFFFFFF, "0xffffffff"))
        self.assertEqual(s["neg_hex"].value, -16)
        self.assertEqual(s["ratio_int"], model.Value("float", 2.0, "2"))
        self.assertEqual(s["blob_d"], model.Value("bin", b"raw", '"raw"'))
        self.assertEqual(s["name_d"].value, 'tab\t, quote", backslash\\, \u00e9, newline\n')

    def test_records_order_recursion_and_dependencies(self):
        self.assertEqual([r.name for r in self.m.records],
                         ["Stamp", "Scalars", "Containers", "Node"])
        self.assertEqual([r.name for r in self.m.records if r.recursive], ["Node"])
        self.assertEqual(self.m.record("Containers").deps, ("Scalars", "Stamp"))
        order = [r.name for r in self.m.records_by_dependency]
        for rec in self.m.records:
            for f in rec.fields:
                t = f.type.inner if isinstance(f.type, model.OptionalOf) else f.type
                if isinstance(t, model.RecordRef) and t.name != rec.name:
                    self.assertLess(order.index(t.name), order.index(rec.name))

    def test_types_inner_first(self):
        seen = []
        for t in self.m.types:
            for c in model.children(t):
                self.assertIn(c, seen)
            seen.append(t)
        self.assertEqual(len(set(self.m.types)), len(self.m.types))

    def test_signature(self):
        self.assertEqual(self.m.op("matrix").idl,
                         "op matrix(rows: u32, cols: u32 = 0x10) -> list<list<f64>> raises Busy")
        self.assertEqual(self.m.op("forget").idl,
                         "notify forget(names: list<str>, hard: bool = false)")

    def test_files(self):
        self.assertEqual([os.path.basename(p) for p in self.m.files],
                         ["everything.idl", "common.idl"])

    def test_model_is_frozen_and_deterministic(self):
        again, _ = load(EVERYTHING)
        self.assertEqual(self.m, again)
        self.assertEqual(repr(self.m), repr(again))
        with self.assertRaises(dataclasses.FrozenInstanceError):
            self.m.ops[0].name = "x"
        self.assertIsInstance(self.m.ops, tuple)


class Rules(unittest.TestCase):
    def test_recursion_through_optional_list_or_map_is_fine(self):
        m, diags = check_text("service s;\nrecord A { b: B?; }\nrecord B { a: A; }\n"
                              "record T { kids: list<T>; by: map<str, T>; }\nop f() -> A;\n")
        self.assertIsNotNone(m, diags.render())
        self.assertEqual([r.name for r in m.records if r.recursive], ["A", "B", "T"])

    def test_defaulted_arguments_may_come_first(self):
        m, diags = check_text("service s;\nop f(a: u64 = 1, b: str, c: bool = true);\n")
        self.assertIsNotNone(m, diags.render())
        self.assertEqual([a.required for a in m.op("f").args], [False, True, False])

    def test_idempotent(self):
        m, diags = check_text("service s;\nidempotent op get(k: str) -> bin raises Missing;\n"
                              "op put(k: str);\n")
        self.assertIsNotNone(m, diags.render())
        self.assertEqual([(op.name, op.idempotent) for op in m.ops],
                         [("get", True), ("put", False)])
        self.assertEqual(m.op("get").idl, "idempotent op get(k: str) -> bin raises Missing")

    def test_idempotent_notify_is_refused_naming_it(self):
        m, diags = check_text("service s;\nop ok();\nidempotent notify drop(k: str);\n")
        self.assertIsNone(m)
        self.assertEqual(diags.error_count, 1)
        self.assertIn("t.idl:3:1: error: notify 'drop' cannot be idempotent: the unit sends no "
                      "reply", diags.render())

    def test_idempotent_without_op_is_one_error(self):
        m, diags = check_text("service s;\nidempotent get();\n")
        self.assertIsNone(m)
        self.assertEqual(diags.error_count, 1, diags.render())  # not "declares no ops" too
        self.assertIn("expected 'op' after 'idempotent'", diags.render())

    def test_no_model_when_there_is_any_error(self):
        m, diags = check_text("service s;\nop f(a: strng);\n")
        self.assertIsNone(m)
        self.assertEqual(diags.error_count, 1)

    def test_unknown_names_after_a_failed_import_are_not_reported(self):
        status, _, err = support.run(["--check", "import_missing.idl"], cwd=support.BAD)
        self.assertEqual(status, 1)
        self.assertNotIn("unknown type", err)


if __name__ == "__main__":
    unittest.main()
