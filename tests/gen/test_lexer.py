"""The lexer alone: token kinds, values, locations, doc comments, and lexical errors."""

import unittest

import support  # noqa: F401  (puts gen/ on sys.path)
from ctlrpc_gen.diag import Diagnostics
from ctlrpc_gen.lexer import tokenize


def lex(text):
    diags = Diagnostics()
    diags.add_source("t.idl", text)
    return tokenize(text, "t.idl", diags), diags


class Tokens(unittest.TestCase):
    def test_kinds_values_and_locations(self):
        toks, diags = lex('op put(key: str = "k") -> u64;\n  x? [] {}')
        self.assertEqual(diags.error_count, 0)
        got = [(t.kind, t.value, t.loc.line, t.loc.col) for t in toks]
        self.assertEqual(got[:4], [("ident", "op", 1, 1), ("ident", "put", 1, 4),
                                   ("punct", "(", 1, 7), ("ident", "key", 1, 8)])
        self.assertIn(("string", "k", 1, 19), got)
        self.assertIn(("punct", "->", 1, 24), got)
        self.assertIn(("ident", "x", 2, 3), got)
        self.assertEqual(got[-1][0], "eof")

    def test_numbers(self):
        toks, diags = lex("0 -5 0x1F -0x10 1.5 -2e3 1.5e-3 0X0a")
        self.assertEqual(diags.error_count, 0)
        self.assertEqual([t.value for t in toks[:-1]], [0, -5, 31, -16, 1.5, -2000.0, 0.0015, 10])
        self.assertEqual([t.kind for t in toks[:-1]], ["int"] * 4 + ["float"] * 3 + ["int"])

    def test_malformed_numbers_are_bad_tokens(self):
        for text in ("12ab", "007", "0x", "1.", "1e", "1e999", "1.2.3"):
            toks, diags = lex(text)
            self.assertEqual(diags.error_count, 1, text)
            self.assertTrue(toks[0].bad, text)
            self.assertIsNone(toks[0].value, text)

    def test_escapes(self):
        toks, diags = lex(r'"\" \\ \n \r \t \0 \' \x41 \u00e9 \U0001F600"')
        self.assertEqual(diags.error_count, 0)
        self.assertEqual(toks[0].value, "\" \\ \n \r \t \0 ' A \u00e9 \U0001F600")

    def test_bad_escapes(self):
        for text in (r'"\q"', r'"\xff"', r'"\x4"', r'"\ud800"', r'"\U00110000"'):
            toks, diags = lex(text)
            self.assertEqual(diags.error_count, 1, text)
            self.assertTrue(toks[0].bad, text)

    def test_control_characters_in_strings_must_be_escaped(self):
        toks, diags = lex('"a\x01b"')
        self.assertEqual([d.message for d in diags.sorted()],
                         ["control character U+0001 in string literal (write it as an escape)"])
        self.assertTrue(toks[0].bad)
        toks, diags = lex('"a\tb"')  # a raw tab is allowed
        self.assertEqual((diags.error_count, toks[0].value), (0, "a\tb"))

    def test_strings_end_on_their_line(self):
        toks, diags = lex('"abc\nop')
        self.assertEqual(diags.error_count, 1)
        self.assertEqual((toks[1].value, toks[1].loc.line), ("op", 2))

    def test_arrow_and_minus(self):
        toks, diags = lex("-> - x")
        self.assertEqual(toks[0].value, "->")
        self.assertEqual(diags.error_count, 1)  # a lone '-' is not a token

    def test_crlf_and_tabs(self):
        toks, _ = lex("a\r\n\tb")
        self.assertEqual((toks[1].loc.line, toks[1].loc.col), (2, 2))

    def test_eof_is_just_after_the_last_token(self):
        toks, _ = lex("record R {\n  x: u64;\n\n// trailing\n")
        self.assertEqual((toks[-1].loc.line, toks[-1].loc.col), (2, 10))
        toks, _ = lex("// only a comment\n")
        self.assertEqual((toks[-1].loc.line, toks[-1].loc.col), (1, 1))

    def test_first_on_line(self):
        toks, _ = lex("a b\nc")
        self.assertEqual([t.first_on_line for t in toks[:3]], [True, False, True])


class Comments(unittest.TestCase):
    def test_doc_comments_attach_to_the_next_token(self):
        toks, _ = lex("/// one\n///two\n//// not doc\n// plain\nrecord R")
        self.assertEqual(toks[0].doc.text, "one\ntwo")
        self.assertEqual((toks[0].doc.loc.line, toks[0].doc.loc.col), (1, 1))
        self.assertIsNone(toks[1].doc)

    def test_block_comments(self):
        toks, diags = lex("a /* x\n y */ b")
        self.assertEqual([t.value for t in toks[:-1]], ["a", "b"])
        self.assertEqual(toks[1].loc.line, 2)
        toks, diags = lex("a /* open")
        self.assertEqual(diags.error_count, 1)

    def test_token_after_a_lexical_error_is_marked(self):
        toks, diags = lex("a $ b")
        self.assertEqual(diags.error_count, 1)
        self.assertTrue(toks[1].after_bad)
        self.assertFalse(toks[0].after_bad)


if __name__ == "__main__":
    unittest.main()
