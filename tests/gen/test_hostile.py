"""Hostile inputs, one test per class: IDL (and file names) built to break the generator.

Each class once made ctlrpc-gen crash with a traceback, emit C that compilers refuse, or report
a misleading diagnostic. Every test runs the whole command line in-process and asserts a clean
outcome: status 0, or status 1 with well-formed diagnostics (never 2, never a traceback). The
generated C of the passing cases is compiled by test_property.py's compiler harness when a C
compiler is present.
"""

import os
import re
import shutil
import tempfile
import unittest

import ccompile
import support

try:
    import jinja2  # noqa: F401
    HAVE_JINJA2 = True
except ImportError:
    HAVE_JINJA2 = False


class Hostile(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ctlrpc-hostile-")
        self.addCleanup(shutil.rmtree, self.tmp)

    def write(self, name, text):
        path = os.path.join(self.tmp, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(text.encode("utf-8") if isinstance(text, str) else text)
        return path

    def run_gen(self, name, render=False):
        """(status, diagnostic headers) of ctlrpc-gen on `name` in the temporary directory."""
        argv = [name, "-o", "out"] if render else ["--check", name]
        status, out, err = support.run(argv, cwd=self.tmp)
        self.assertIn(status, (0, 1), err)
        self.assertNotIn("Traceback", err)
        self.assertEqual(out, "")
        # Diagnostics about a whole file (or the command line) have no source line.
        whole = [line for line in err.splitlines() if re.match(r"[^:]+: error: ", line)]
        rest = "".join(line + "\n" for line in err.splitlines() if line not in whole)
        headers, why = support.diagnostics(rest)
        self.assertIsNotNone(headers, f"{why}\n--- stderr ---\n{err}")
        return status, whole + headers

    def assert_errors(self, name, expected, render=False):
        status, headers = self.run_gen(name, render)
        self.assertEqual(headers, expected)
        self.assertEqual(status, 1 if any(": error: " in h for h in expected) else 0)


class Tracebacks(Hostile):
    """Inputs that once escaped as Python exceptions."""

    def test_decimal_literal_of_thousands_of_digits(self):
        digits = "9" * 5000
        self.write("s.idl", f"service s;\nop f(a: u64 = {digits}, b: f64 = {digits}, "
                            f"c: f64 = -{digits}.5);\n")
        self.assert_errors("s.idl", [
            "s.idl:2:15: error: default 999999999999999999999999... (5000 characters) is out "
            "of range for u64 (0 to 18446744073709551615)",
            "s.idl:2:5026: error: default 999999999999999999999999... (5000 characters) is "
            "not exactly representable as f64",
            "s.idl:2:10037: error: number '-99999999999999999999999... (5003 characters)' is "
            "out of range"])

    def test_long_chain_of_question_marks(self):
        self.write("s.idl", "service s;\nop f(a: u64" + "?" * 5000 + ", b: list<str" + "?" * 3000
                   + ">);\n")
        status, headers = self.run_gen("s.idl")
        self.assertEqual(len(headers), 2, headers)
        self.assertIn("'u64??' nests optionals", headers[0])
        self.assertIn("'str??' nests optionals", headers[1])

    def test_nul_byte_in_an_import_path(self):
        self.write("s.idl", 'service s;\nimport "a\\0b.idl";\nop f() -> A;\n')
        self.assert_errors("s.idl", ["s.idl:2:8: error: import path contains a NUL character"])

    def test_import_chain_a_thousand_files_deep(self):
        depth = 1000
        for i in range(depth):
            body = f'import "f{i + 1}.idl";\n' if i < depth - 1 else "record Z { a: u32; }\n"
            self.write(f"f{i}.idl", body)
        self.write("s.idl", 'service s;\nimport "f0.idl";\nop f() -> Z;\n')
        self.assert_errors("s.idl", [], render=HAVE_JINJA2)
        # and a cycle at the bottom of the chain is reported, not followed
        self.write(f"f{depth - 1}.idl", 'import "f0.idl";\nrecord Z { a: u32; }\n')
        status, headers = self.run_gen("s.idl")
        self.assertEqual(status, 1)
        self.assertEqual(headers, ["f999.idl:1:8: error: import cycle: f0.idl -> f1.idl -> "
                                   "f2.idl -> f3.idl -> ... (992 more) ... -> f997.idl -> "
                                   "f998.idl -> f999.idl -> f0.idl"])

    def test_file_name_that_is_not_utf8(self):
        name = os.fsdecode(b"x\xff.idl")
        self.write(name, "service s;\nop f(a: u64 = 0;\n")
        self.assert_errors(name, [
            "x\\xff.idl: error: cannot name the generated files after this file: it is not "
            "valid UTF-8; rename it",
            "x\\xff.idl:2:16: error: expected ',' or ')' after argument, found ';'"])
        self.write(name, "service s;\nop f();\n")  # a valid IDL: its C files cannot be named
        self.assert_errors(name, ["x\\xff.idl: error: cannot name the generated files after "
                                  "this file: it is not valid UTF-8; rename it"])
        self.write("imp.idl", 'service s;\nimport "' + "y\\u00e9.idl" + '";\nop f() -> Y;\n')
        self.write(os.fsdecode(b"y\xc3\xa9.idl"), "record Y { a: u32; }\n")
        self.assert_errors("imp.idl", [], render=HAVE_JINJA2)


class Diagnostics(Hostile):
    """Diagnostics that pointed at the wrong column, repeated themselves or were missing."""

    def test_byte_order_mark_is_not_a_column(self):
        self.write("s.idl", "\ufeffservice s; op f(x: Q);\n")
        self.assert_errors("s.idl", ["s.idl:1:20: error: unknown type 'Q'"])

    def test_float_default_that_underflows_is_an_error_like_one_that_overflows(self):
        self.write("s.idl", "service s;\nop f(a: f64 = 1e-400, b: f64 = 1e400, c: f64 = 0.0e-999,"
                            " d: f64 = 5e-324, e: f64 = -0.0);\n")
        self.assert_errors("s.idl", [
            "s.idl:2:15: error: number '1e-400' is out of range (too small: it would be 0 as "
            "an f64)",
            "s.idl:2:32: error: number '1e400' is out of range"])

    def test_one_mistake_one_error(self):
        cases = [
            "record R  a: u32; }\nop f(x: R) -> R;",              # missing '{'
            "record R  a: u32; b: str; }\nop f(x: R) -> R;",
            "record R { a: u32 b: u32; c: str; }\nop f(x: R) -> R;",
            "op f(x: u32 y: u32) -> u32;\nop g() -> u32;",
            "op f(x: list<u32) -> u32;\nop g() -> u32;",
            "op f(x: u32) raises Busy Missing;\nop g() -> u32;",
            "op f(x: u32 = [1, 2) -> u32;\nop g() -> u32;",
            "op f(x: u32 -> u32;\nop g() -> u32;",
        ]
        for body in cases:
            with self.subTest(body=body):
                self.write("s.idl", "service s;\n" + body + "\n")
                status, headers = self.run_gen("s.idl")
                self.assertEqual(status, 1)
                self.assertEqual(len(headers), 1, headers)


@unittest.skipUnless(HAVE_JINJA2, "jinja2 is not installed (Debian: python3-jinja2)")
class Compiles(Hostile):
    """Valid IDL whose generated C compilers once refused. Each case is generated into its own
    directory and all are compiled together by every compiler installed (ccompile)."""

    def compile_cases(self, cases):
        pairs = []
        for i, (name, text) in enumerate(cases):
            d = os.path.join(self.tmp, f"case{i}")
            os.makedirs(d, exist_ok=True)
            path = os.path.join(d, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(text.encode("utf-8"))
            status, _, err = support.run([path, "-o", d])
            self.assertEqual(status, 0, f"{name}:\n{text}\n--- stderr ---\n{err}")
            pairs.append((d, os.path.splitext(os.path.basename(name))[0]))
        compilers = ccompile.available()
        if not compilers:
            self.skipTest("no C compiler found")
        failures = ccompile.compile_batch(pairs, compilers)
        report = "\n".join(f"--- {cc} refused {d}:\n{msg[:3000]}" for cc, d, msg in failures)
        self.assertFalse(failures, report)

    def test_records_referring_to_each_other_through_an_optional_in_either_order(self):
        self.compile_cases([
            ("a.idl", "service a;\nrecord A { b: B; }\nrecord B { a: A?; }\nop f() -> A;\n"),
            ("b.idl", "service b;\nrecord B { a: A?; }\nrecord A { b: B; }\nop f() -> A;\n"),
            ("c.idl", "service c;\nrecord A { b: B?; }\nrecord B { a: A?; }\nop f() -> A;\n"),
        ])

    def test_records_no_op_uses(self):
        self.compile_cases([
            ("u.idl", "service u;\nrecord R { a: list<u32>; b: R?; }\nrecord get_result "
                      "{ a: u32?; }\nop get() -> u32;\n"),
        ])


class Names(Hostile):
    """Names that would have met another generated name, a header's name or a keyword in C."""

    def test_service_prefix_joined_to_a_name_forming_a_library_identifier(self):
        for svc, decl, msg in [
                ("sched", "op yield();", "2:4: error: op 'yield' would be named 'sched_yield' "
                                         "in C, which is declared by <sched.h>"),
                ("time", "record t { a: u32; }\nop f() -> t;",
                 "2:8: error: record 't' would be named 'time_t' in C, which is declared by "
                 "<bits/types/time_t.h>"),
                ("va", "op list();", "2:4: error: op 'list' would be named 'va_list' in C, "
                                     "which is declared by <stdio.h>"),
                ("thread", "op local();", "2:4: error: op 'local' would be named 'thread_local' "
                                          "in C, which is a C keyword"),
                ("timeout", "op ms();", "2:4: error: op 'ms' would be named 'timeout_ms' in C, "
                                        "which the generated functions use as a parameter name"),
                ("s", "record opt_Foo { a: u32; }\nrecord Foo { a: u32; }\n"
                      "op f(a: Foo?, b: u32?) -> opt_Foo;", None),
        ]:
            with self.subTest(svc=svc):
                self.write("s.idl", f"service {svc};\n{decl}\n")
                self.assert_errors("s.idl", [f"s.idl:{msg}"] if msg else [])

    def test_macros_keywords_and_generated_names_as_members(self):
        self.write("s.idl", "service s;\nrecord R {\n    EOF: u32;\n    SIZE_MAX: u32;\n"
                            "    class: u32;\n    S_R_INIT: u32;\n    CTLRPC_GEN_s_CTL_H: u32;\n"
                            "}\nop f(new: u32) -> R;\n")
        self.assert_errors("s.idl", [
            "s.idl:3:5: error: field name 'EOF' is reserved: it is a macro defined by <stdio.h>",
            "s.idl:4:5: error: field name 'SIZE_MAX' is reserved: it is a macro defined by "
            "<stdint.h>",
            "s.idl:5:5: error: field name 'class' is reserved: it is a C++ keyword (generated "
            "headers are also included from C++)",
            "s.idl:6:5: error: field 'S_R_INIT' would clash in C with 'S_R_INIT', the "
            "initializer macro of record 'R' (line 2); rename it",
            "s.idl:7:5: error: field 'CTLRPC_GEN_s_CTL_H' would clash in C with "
            "'CTLRPC_GEN_s_CTL_H', the header guard of file 's.idl'; rename it",
            "s.idl:9:6: error: argument name 'new' is reserved: it is a C++ keyword (generated "
            "headers are also included from C++)"])

    def test_long_names_are_refused(self):
        self.write("s.idl", "service s;\nop " + "a" * 256 + "();\nop " + "b" * 255 + "();\n")
        self.assert_errors("s.idl", ["s.idl:2:4: error: op name is longer than 255 characters"])


@unittest.skipUnless(HAVE_JINJA2, "jinja2 is not installed (Debian: python3-jinja2)")
class CompilesToo(Compiles):
    """Comments, string literals and file names."""

    def test_hostile_text_in_comments_and_long_strings(self):
        hostile = "*/ /* \\u202e \u202e \u2066 ??= ??/ \\\\ \\\" \\0 \\x01 \u2028"
        text = ("service s;\n/// doc */ /* \u202e bidi \u2067 ??/\n/// \\\nrecord R {\n"
                f'    a: str = "{hostile}";\n'
                f'    b: bin = "{"x" * 5000}";\n'
                '    c: str = "' + "\\u00e9" * 3000 + '";\n'
                f'    d: str = "{"z" * 4095}";\n'
                "}\n"
                f'op f(x: str = "{"y" * 4096}", y: str = "{"x" * 5000}", r: R?) -> R;\n')
        self.compile_cases([("s.idl", text), ("9lives-x.idl", text),
                            ("caf\u00e9 */ x.idl", text), ("_x-.idl", text)])

    def test_imported_path_with_comment_delimiters(self):
        d = os.path.join(self.tmp, "case0")
        os.makedirs(os.path.join(d, "a*"))
        with open(os.path.join(d, "a*", "b ??.idl"), "w") as f:
            f.write("/// a */ record\nrecord B { a: u32; }\n")
        # the path to the imported file, in the comment before B, has '*/' and '??'
        self.compile_cases([("s.idl", 'service s;\nimport "a*/b ??.idl";\nop f() -> B;\n')])


if __name__ == "__main__":
    unittest.main()
