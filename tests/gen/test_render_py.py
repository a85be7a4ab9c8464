"""The Python render stage (ctlrpc-gen --lang python): every good fixture renders to a module
Python compiles, deterministically, under the service's name; doc comments that could end a
docstring or start an escape stay text; IDL names Python cannot take get a trailing '_'.
(Running the generated modules needs the Python runtime: tests/pygen/.)"""

import ast
import os
import tempfile
import unittest

import support


def render(idl, out):
    status, _, err = support.run(["--lang", "python", idl, "-o", out])
    assert status == 0, err
    files = [f for f in os.listdir(out) if f.endswith(".py")]
    assert len(files) == 1, files
    with open(os.path.join(out, files[0]), encoding="utf-8") as f:
        return files[0], f.read()


class RenderPython(unittest.TestCase):
    def test_good_fixtures_compile(self):
        idls = [os.path.join(support.GOOD, f) for f in sorted(os.listdir(support.GOOD))
                if f.endswith(".idl")] + [support.STORAGE_IDL]
        for idl in idls:
            with self.subTest(idl=os.path.basename(idl)), tempfile.TemporaryDirectory() as a, \
                    tempfile.TemporaryDirectory() as b:
                name, text = render(idl, a)
                compile(text, name, "exec")
                self.assertTrue(name.endswith("_ctl.py"))
                self.assertEqual(render(idl, b), (name, text))  # deterministic

    def test_docstrings_escaped(self):
        with tempfile.TemporaryDirectory() as d:
            idl = os.path.join(d, "x.idl")
            with open(idl, "w", encoding="utf-8") as f:
                f.write('/// Ends a docstring: """ and a backslash \\n and a quote"\n'
                        "service quoted;\n"
                        '/// A record """doc""" \\x\n'
                        'record R { a: str = "\\"\\"\\""; }\n'
                        '/// op doc ending in a quote"\n'
                        "op o(\n    /// arg doc \\\n    r: R?,\n) -> R;\n")
            name, text = render(idl, d)
            self.assertEqual(name, "quoted_ctl.py")
            tree = ast.parse(text)
            self.assertIn('Ends a docstring: """ and a backslash \\n and a quote"',
                          ast.get_docstring(tree))
            classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
            self.assertIn('A record """doc""" \\x', ast.get_docstring(classes["R"]))
            self.assertIn("'\"\"\"'", text)  # the default, as a Python literal

    def test_idempotent_ops(self):
        with tempfile.TemporaryDirectory() as d:
            _, text = render(support.STORAGE_IDL, d)
        ops = {}
        for block in text.split("\n_OP_")[1:]:
            name, body = block.split(" = _Op(", 1)
            ops[name] = body[:body.index("\n)")]
        self.assertEqual(sorted(n for n, body in ops.items() if "idempotent=True," in body),
                         ["describe", "get", "list", "pin", "stats"])
        # The clients pass it on to the runtime, for those ops only.
        self.assertEqual(text.count("idempotent=True)"), 4)  # call, call_many; sync and aio
        self.assertEqual(text.count("if op.idempotent:"), 4)
        self.assertIn("IDL: ``idempotent op stats() -> UnitStats``", text)

    def test_python_names(self):
        with tempfile.TemporaryDirectory() as d:
            idl = os.path.join(d, "n.idl")
            with open(idl, "w", encoding="utf-8") as f:
                f.write("service n;\nrecord object { lambda: u64; self: u64 = 0; }\n"
                        "error Client;\n"
                        "op import(from: u64, address: str, address_: str, timeout: u64,\n"
                        "          self: object?) -> object raises Client;\n"
                        "op close();\n")
            _, text = render(idl, d)
            for expected in ("class object_:", "lambda_: int", "self_: int = 0",
                             "class Client_(_ctlrpc.DeclaredError):",
                             "kind: _t.ClassVar[str] = 'Client'", "def import_(",
                             "from_: int,", "address_: str,", "address__: str,",
                             "timeout_: int,", "self_: _t.Optional[object_] = None,",
                             "def close_(", "def import_many(",
                             "_Member('from', 'from_', _T_u64, True)"):
                self.assertIn(expected, text)


if __name__ == "__main__":
    unittest.main()
