"""The parser and loader alone: tree shape, a location on every node, docs, recovery, imports."""

import dataclasses
import os
import tempfile
import unittest

import support
from ctlrpc_gen import ast
from ctlrpc_gen.diag import Diagnostics, Loc
from ctlrpc_gen.parser import load_program, parse


def parse_text(text, path="t.idl"):
    diags = Diagnostics()
    return parse(text, path, diags), diags


def nodes(value):
    """Every syntax-tree node reachable from `value`."""
    if dataclasses.is_dataclass(value) and not isinstance(value, Loc):
        yield value
        for f in dataclasses.fields(value):
            yield from nodes(getattr(value, f.name))
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from nodes(v)


class Tree(unittest.TestCase):
    def test_every_node_has_a_location_in_its_file(self):
        diags = Diagnostics()
        program = load_program(os.path.join(support.GOOD, "everything.idl"), diags)
        self.assertEqual(diags.error_count, 0)
        count = 0
        for f in program.files:
            for node in nodes(f.decls):
                count += 1
                self.assertIsInstance(node.loc, Loc, node)
                self.assertEqual(node.loc.path, f.path)
                self.assertGreaterEqual(node.loc.line, 1)
                self.assertGreaterEqual(node.loc.col, 1)
        self.assertGreater(count, 100)

    def test_shape_and_positions(self):
        f, diags = parse_text("service s;\n"
                              "op put(key: str, pin: bool = false) -> list<u64?>? raises Busy;\n")
        self.assertEqual(diags.error_count, 0)
        svc, op = f.decls
        self.assertEqual((svc.name, svc.loc.line, svc.loc.col, svc.start.col), ("s", 1, 9, 1))
        self.assertEqual((op.name, op.loc.col, op.notify), ("put", 4, False))
        self.assertEqual([a.name for a in op.args], ["key", "pin"])
        self.assertEqual(op.args[1].default.kind, "bool")
        self.assertEqual((op.args[1].loc.line, op.args[1].loc.col), (2, 18))
        self.assertEqual(ast.type_text(op.result), "list<u64?>?")
        self.assertEqual([k.name for k in op.raises], ["Busy"])

    def test_literals(self):
        f, diags = parse_text('service s;\nop f(a: u64 = 0x10, b: str = "x\\n", c: list<u64> = [],'
                              ' d: map<str, u64> = {}, e: str? = null, g: f64 = -1.5);\n')
        self.assertEqual(diags.error_count, 0)
        lits = [a.default for a in f.decls[1].args]
        self.assertEqual([(l.kind, l.value, l.text) for l in lits],
                         [("int", 16, "0x10"), ("str", "x\n", '"x\\n"'), ("list", None, "[]"),
                          ("map", None, "{}"), ("null", None, "null"), ("float", -1.5, "-1.5")])

    def test_doc_comments(self):
        f, diags = parse_text("/// S\nservice s;\n/// R\nrecord R {\n  /// F\n  x: u64;\n}\n"
                              "/// O\nop f(\n  /// A\n  a: u64);\n")
        self.assertEqual(diags.error_count + len(diags.sorted()), 0)
        svc, rec, op = f.decls
        self.assertEqual((svc.doc, rec.doc, rec.fields[0].doc, op.doc, op.args[0].doc),
                         ("S", "R", "F", "O", "A"))

    def test_keywords_are_contextual(self):
        f, diags = parse_text("service s;\nrecord R {\n  op: str;\n  record: u64;\n}\n"
                              "op list(map: u64);\n")
        self.assertEqual(diags.error_count, 0)
        self.assertEqual([m.name for m in f.decls[1].fields], ["op", "record"])
        self.assertEqual(f.decls[2].name, "list")

    def test_idempotent_marks_the_op_that_follows(self):
        f, diags = parse_text("service s;\n/// Read it.\nidempotent op get(key: str) -> bin;\n"
                              "op put(key: str);\nidempotent notify n();\n")
        self.assertEqual(diags.error_count + len(diags.sorted()), 0)
        get, put, n = f.decls[1:]
        self.assertEqual((get.name, get.doc, get.notify), ("get", "Read it.", False))
        self.assertEqual((get.idempotent.line, get.idempotent.col), (3, 1))
        self.assertEqual((get.start.line, get.start.col), (3, 12))  # the `op` keyword
        self.assertIsNone(put.idempotent)
        # Read on a notify too, for the checker to refuse with a reason.
        self.assertTrue(n.notify)
        self.assertEqual((n.idempotent.line, n.idempotent.col), (5, 1))

    def test_idempotent_is_contextual(self):
        f, diags = parse_text("service s;\nrecord idempotent {\n  idempotent: u64;\n}\n"
                              "idempotent op idempotent(idempotent: idempotent?) -> u64;\n"
                              "op plain(op: u64);\n")
        self.assertEqual(diags.error_count, 0, diags.render())
        rec, op, plain = f.decls[1:]
        self.assertEqual((rec.name, rec.fields[0].name), ("idempotent", "idempotent"))
        self.assertEqual((op.name, op.args[0].name), ("idempotent", "idempotent"))
        self.assertIsNotNone(op.idempotent)
        self.assertIsNone(plain.idempotent)

    def test_idempotent_needs_an_op(self):
        f, diags = parse_text("service s;\nidempotent record R { a: u64; }\n"
                              "idempotent get();\nop ok();\n")
        self.assertEqual(diags.error_count, 2)
        self.assertEqual([d.name for d in f.decls], ["s", "ok"])
        text = diags.render()
        self.assertIn("t.idl:2:12: error: expected 'op' after 'idempotent' (it marks an op: "
                      "'idempotent op NAME(...)'), found 'record'", text)
        self.assertIn("t.idl:3:12: error: expected 'op' after 'idempotent'", text)

    def test_trailing_comma_in_arguments(self):
        f, diags = parse_text("service s;\nop f(a: u64, b: u64,);\n")
        self.assertEqual(diags.error_count, 0)
        self.assertEqual(len(f.decls[1].args), 2)


class Recovery(unittest.TestCase):
    def test_each_broken_declaration_reports_once_and_parsing_goes_on(self):
        f, diags = parse_text("service s;\n"
                              "record R { a u64; b: u64; }\n"  # field error, record kept
                              "op f(a: ) -> u64;\n"           # op dropped
                              "op g() -> u64\n"               # missing ';'
                              "op h();\n")
        self.assertEqual(diags.error_count, 3)
        self.assertEqual([getattr(d, "name", None) for d in f.decls], ["s", "R", "h"])
        self.assertEqual([m.name for m in f.decls[1].fields], ["b"])
        self.assertTrue(f.decls[1].incomplete)

    def test_missing_brace_keeps_the_record(self):
        f, diags = parse_text("service s;\nrecord R { a: u64;\nop f() -> R;\n")
        self.assertEqual(diags.error_count, 1)
        self.assertEqual([d.name for d in f.decls], ["s", "R", "f"])

    def test_idempotent_starts_a_declaration_only_before_op(self):
        # A record missing its `}` ends where `idempotent op` starts a line...
        f, diags = parse_text("service s;\nrecord R { a: u64;\nidempotent op get() -> R;\n")
        self.assertEqual(diags.error_count, 1)
        self.assertEqual([d.name for d in f.decls], ["s", "R", "get"])
        self.assertIsNotNone(f.decls[2].idempotent)
        # ...but a field named `idempotent` that lacks its `:` is reported as the field.
        f, diags = parse_text("service s;\nrecord R {\n  a: u64;\n  idempotent u64;\n}\n"
                              "op f() -> R;\n")
        self.assertEqual(diags.error_count, 1)
        self.assertIn("t.idl:4:14: error: expected ':' after field name 'idempotent', found "
                      "'u64'", diags.render())
        self.assertEqual([d.name for d in f.decls], ["s", "R", "f"])

    def test_nesting_is_bounded(self):
        deep = "list<" * 500 + "u64" + ">" * 500
        f, diags = parse_text(f"service s;\nop f(a: {deep});\n")
        self.assertEqual(diags.error_count, 1)
        f, diags = parse_text("service s;\nop f(a: u64 = " + "[" * 500 + ");\n")
        self.assertEqual(diags.error_count, 1)

    def test_no_cascade_after_a_lexical_error(self):
        f, diags = parse_text('service s;\nop f(a: str = "open) -> u64;\nop g();\n')
        self.assertEqual(diags.error_count, 1)
        self.assertEqual(f.decls[-1].name, "g")


class Loading(unittest.TestCase):
    def test_imports_are_read_once_relative_to_the_importer(self):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "a", "b"))
            files = {
                "main.idl": 'service s;\nimport "a/x.idl";\nimport "a/b/y.idl";\nop f();\n',
                "a/x.idl": 'import "b/y.idl";\nrecord X { y: Y; }\n',
                "a/b/y.idl": "record Y { v: u64; }\n",
            }
            for name, text in files.items():
                with open(os.path.join(d, name), "w") as f:
                    f.write(text)
            diags = Diagnostics()
            old = os.getcwd()
            os.chdir(d)
            try:
                program = load_program("main.idl", diags)
            finally:
                os.chdir(old)
            self.assertEqual(diags.error_count, 0)
            self.assertEqual([f.path for f in program.files],
                             ["main.idl", "a/x.idl", "a/b/y.idl"])
            self.assertEqual(program.imports["main.idl"], ("a/x.idl", "a/b/y.idl"))
            self.assertEqual(program.imports["a/x.idl"], ("a/b/y.idl",))
            self.assertEqual(program.incomplete, frozenset())

    def test_unreadable_main_file(self):
        diags = Diagnostics()
        self.assertIsNone(load_program(os.path.join(support.BAD, "no-such-file.idl"), diags))
        self.assertEqual(diags.error_count, 1)


if __name__ == "__main__":
    unittest.main()
