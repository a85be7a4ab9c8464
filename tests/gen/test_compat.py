"""ctlrpc-gen --against / --against-git: comparing two versions of a service.

The rules are docs/IDL.md's "Evolving a service". Each rule's example there is a marked pair of
blocks (<!-- evolve:NAME -->, then a diff from old.idl to new.idl, then the diagnostics' header
lines); `DocExamples` gets one test per example, made from those blocks, not from copies of
them: it writes the two files, runs the comparison, and checks the headers exactly (so every
location, line:col in new.idl and in the note's old.idl), the source and caret lines under each,
the exit status, and the exit status and severities under --strict. RULES lists the examples the
page must have, so one cannot silently disappear.
"""

import os
import re
import shutil
import subprocess
import tempfile
import unittest
from unittest import mock

import support
from ctlrpc_gen import cli, compat

DOC = os.path.join(support.REPO, "docs", "IDL.md")

RULES = """
    op-added op-removed op-renamed op-became-notify notify-became-op ops-reordered
    result-added result-added-optional result-removed result-changed result-widened
    raises-added raises-removed raises-declared-removed error-added error-removed
    idempotent-added idempotent-removed
    arg-added-default arg-added-optional arg-added arg-removed notify-arg-removed arg-renamed
    args-reordered
    default-changed field-default-changed default-added default-removed
    field-added-default field-added field-removed field-removed-default fields-reordered
    int-widened int-widened-signed int-narrowed int-signedness int-to-f64 f64-to-int str-to-bin
    made-optional made-required list-element-changed list-element-widened map-value-changed
    record-type-changed
    record-added record-removed record-renamed service-renamed
    doc-changed
""".split()

HEADER = re.compile(r"^(?P<path>[^\s:][^:]*(?::[^\s:][^:]*)?):(?P<line>\d+):(?P<col>\d+): "
                    r"(?P<severity>error|warning|note): (?P<message>.+)$")
CARET = re.compile(r"^[ \t]*\^~*$")
SUMMARY = re.compile(r"^(\d+) wire-breaking, (\d+) source-breaking, (\d+) safe$")
NO_CHANGE = "0 wire-breaking, 0 source-breaking, 0 safe\n"


def doc_examples():
    """{name: (old text, new text, [expected header lines])} from docs/IDL.md."""
    with open(DOC, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out = {}
    i = 0
    while i < len(lines):
        m = re.match(r"^<!-- evolve:([a-z0-9-]+) -->$", lines[i])
        i += 1
        if not m:
            continue
        blocks = []
        while len(blocks) < 2:
            if not lines[i].startswith("```"):
                raise AssertionError(f"evolve:{m.group(1)} is not followed by two code blocks")
            end = lines.index("```", i + 1)
            blocks.append(lines[i + 1:end])
            i = end + 1
        diff, expected = blocks
        old = "".join(x[1:] + "\n" for x in diff if x[:1] in (" ", "-"))
        new = "".join(x[1:] + "\n" for x in diff if x[:1] in (" ", "+"))
        if m.group(1) in out:
            raise AssertionError(f"evolve:{m.group(1)} is in the page twice")
        out[m.group(1)] = (old, new, expected)
    return out


def parse(stderr, sources):
    """The header lines of `stderr`, after checking that each is followed by its source line
    (from `sources`: path -> text) and a caret under its column."""
    lines = stderr.split("\n")
    assert lines[-1] == "", stderr
    lines.pop()
    # The last line counts the changes by class (the notes on old.idl are not changes).
    last = SUMMARY.match(lines.pop())
    assert last, f"no summary line at the end: {stderr!r}"
    headers = []
    for k in range(0, len(lines), 3):
        m = HEADER.match(lines[k])
        assert m, f"not a diagnostic header: {lines[k]!r}"
        text = sources[m.group("path")].split("\n")
        assert lines[k + 1] == text[int(m.group("line")) - 1], (lines[k], lines[k + 1])
        assert CARET.match(lines[k + 2]), lines[k + 2]
        assert lines[k + 2].index("^") == int(m.group("col")) - 1, (lines[k], lines[k + 2])
        headers.append(lines[k])
    counted = [sum(1 for h in headers if h.endswith(f" [{c}]"))
               for c in ("wire-breaking", "source-breaking", "safe")]
    assert [int(n) for n in last.groups()] == counted, (last.group(0), headers)
    return headers


class TempDir(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ctlrpc-compat-")
        self.addCleanup(shutil.rmtree, self.tmp)

    def write(self, name, text):
        path = os.path.join(self.tmp, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path

    def compare(self, *args, cwd=None):
        return support.run(list(args), cwd=cwd or self.tmp)


class DocExamples(TempDir):
    """One test per example of docs/IDL.md's rules (methods added below)."""

    def test_the_page_has_every_rule(self):
        self.assertEqual(sorted(doc_examples()), sorted(RULES))

    def run_example(self, name):
        old, new, expected = doc_examples()[name]
        self.write("old.idl", old)
        self.write("new.idl", new)
        sources = {"old.idl": old, "new.idl": new}
        status, out, err = self.compare("--against", "old.idl", "new.idl")
        self.assertEqual(out, "")
        self.assertEqual(parse(err, sources), expected)
        severities = [HEADER.match(h).group("severity") for h in expected]
        self.assertTrue(expected and expected[0].startswith("new.idl:"),
                        "the first line is a change in new.idl")
        self.assertEqual(status, 1 if "error" in severities else 0)
        # Each change ends with its class, and its severity follows from it.
        for h in expected:
            tag = re.search(r" \[(wire-breaking|source-breaking|safe)\]$", h)
            if h.startswith("old.idl"):
                self.assertIsNone(tag, h)
                continue
            sev = HEADER.match(h).group("severity")
            self.assertEqual({"wire-breaking": "error", "source-breaking": "warning",
                              "safe": "note"}[tag.group(1)], sev, h)

        status, _, err = self.compare("--against", "old.idl", "new.idl", "--strict")
        strict = [h.replace(": warning: ", ": error: ") for h in expected]
        self.assertEqual(parse(err, sources), strict)
        self.assertEqual(status, 1 if any(": error: " in h for h in strict) else 0)


def _example_test(name):
    def test(self):
        self.run_example(name)
    test.__doc__ = f"docs/IDL.md, evolve:{name}"
    return test


for _name in RULES:
    setattr(DocExamples, "test_" + _name.replace("-", "_"), _example_test(_name))


class Against(TempDir):
    def test_a_service_against_itself_says_only_its_summary(self):
        status, out, err = self.compare("--against", support.STORAGE_IDL, support.STORAGE_IDL)
        self.assertEqual((status, out, err), (0, "", NO_CHANGE))

    def test_the_summary_counts_each_class(self):
        self.write("old.idl", "service s;\nop f(a: u32);\nop g();\nop h(x: u32);\n")
        self.write("new.idl", "service s;\nop f(a: u64);\nop g(b: u32 = 1);\nop k();\n"
                   "op h(y: u32);\n")
        status, out, err = self.compare("--against", "old.idl", "new.idl")
        self.assertEqual(status, 1)
        last = err.split("\n")[-2]
        self.assertRegex(last, SUMMARY)
        self.assertEqual(last, "%d wire-breaking, %d source-breaking, %d safe" % tuple(
            err.count(" [%s]\n" % c) for c in ("wire-breaking", "source-breaking", "safe")))
        status, out, err = self.compare("--against", "old.idl", "new.idl", "--strict")
        self.assertEqual(err.split("\n")[-2], last)  # --strict changes severities, not classes

    def test_idempotent_added_warns_and_fails_only_under_strict(self):
        self.write("old.idl", "service s;\nop get(k: str) -> bin;\nop put(k: str);\n")
        self.write("new.idl", "service s;\nidempotent op get(k: str) -> bin;\n"
                   "op put(k: str);\n")
        status, out, err = self.compare("--against", "old.idl", "new.idl")
        self.assertEqual((status, out), (0, ""), err)
        self.assertIn("new.idl:2:1: warning: op 'get' is now idempotent: ", err)
        self.assertEqual(err.split("\n")[-2], "0 wire-breaking, 1 source-breaking, 0 safe")
        status, _, err = self.compare("--against", "old.idl", "new.idl", "--strict")
        self.assertEqual(status, 1)
        self.assertIn("new.idl:2:1: error: op 'get' is now idempotent: ", err)

    def test_idempotent_removed_is_safe(self):
        self.write("old.idl", "service s;\nidempotent op get(k: str) -> bin;\n")
        self.write("new.idl", "service s;\nop get(k: str) -> bin;\n")
        for strict in ((), ("--strict",)):
            status, _, err = self.compare("--against", "old.idl", "new.idl", *strict)
            self.assertEqual(status, 0, err)
            self.assertIn("new.idl:2:4: note: op 'get' is no longer idempotent: ", err)
            self.assertIn("old.idl:2:1: note: it was idempotent here", err)
            self.assertEqual(err.split("\n")[-2], "0 wire-breaking, 0 source-breaking, 1 safe")

    def test_an_idempotent_op_that_becomes_a_notify_reports_only_that(self):
        self.write("old.idl", "service s;\nidempotent op drop(k: str);\n")
        self.write("new.idl", "service s;\nnotify drop(k: str);\n")
        status, _, err = self.compare("--against", "old.idl", "new.idl")
        self.assertEqual(status, 1)
        self.assertIn("op 'drop' became a notify", err)
        self.assertIn("old.idl:2:12: note: it was an op here", err)
        self.assertNotIn("idempotent:", err)
        self.assertEqual(err.split("\n")[-2], "1 wire-breaking, 0 source-breaking, 0 safe")

    def test_strict_needs_against(self):
        status, _, err = self.compare("--strict", "--check", support.STORAGE_IDL)
        self.assertEqual(status, 1)
        self.assertIn("--strict needs --against or --against-git", err)

    def test_against_and_against_git_exclude_each_other(self):
        status, _, err = self.compare("--against", "a.idl", "--against-git", "HEAD", "b.idl")
        self.assertEqual(status, 1)
        self.assertIn("not allowed with argument", err)

    def test_errors_in_old_are_reported_and_nothing_is_compared(self):
        self.write("old.idl", "service s;\nop put(key: strng);\n")
        self.write("new.idl", "service s;\nop get();\n")
        status, _, err = self.compare("--against", "old.idl", "new.idl")
        self.assertEqual(status, 1)
        self.assertEqual(err.split("\n")[0],
                         "old.idl:2:13: error: unknown type 'strng' (did you mean 'str'?)")
        self.assertNotIn("removed", err)

    def test_unreadable_old(self):
        self.write("new.idl", "service s;\nop get();\n")
        status, _, err = self.compare("--against", "missing.idl", "new.idl")
        self.assertEqual((status, err),
                         (1, "missing.idl: error: cannot read file: No such file or directory\n"))

    def test_errors_in_new_are_reported_and_old_is_not_read(self):
        self.write("new.idl", "service s;\nop get(;\n")
        status, _, err = self.compare("--against", "missing.idl", "new.idl")
        self.assertEqual(status, 1)
        self.assertTrue(err.startswith("new.idl:2:8: error: "), err)
        self.assertNotIn("missing.idl", err)

    def test_imports_are_compared_where_they_are_declared(self):
        # Both versions import a file of records; one record moves into the service file,
        # which is no change, and the imported one gains a field.
        old_common = "record Stamp { secs: i64; }\nrecord Size { bytes: u64; }\n"
        new_common = "record Stamp { secs: i64; nanos: u32; }\n"
        self.write("v1/common.idl", old_common)
        self.write("v1/s.idl", 'service s;\nimport "common.idl";\nop at(t: Stamp) -> Size;\n')
        self.write("v2/inc/common.idl", new_common)
        new_main = ('service s;\nimport "inc/common.idl";\nrecord Size { bytes: u64; }\n'
                    "op at(t: Stamp) -> Size;\n")
        self.write("v2/s.idl", new_main)
        status, _, err = self.compare("--against", "v1/s.idl", "v2/s.idl")
        sources = {"v1/common.idl": old_common, "v2/inc/common.idl": new_common,
                   "v2/s.idl": new_main}
        self.assertEqual(parse(err, sources), [
            "v2/inc/common.idl:1:27: error: field 'nanos' of record 'Stamp' was added without a "
            "default: a record from an old peer lacks it, so a new reader refuses it (missing "
            "field); give it a default or make it optional [wire-breaking]"])
        self.assertEqual(status, 1)

    def test_notes_in_an_old_import_point_into_it(self):
        self.write("old/common.idl", "record Stamp { secs: i64; nanos: u32 = 0; }\n")
        self.write("old/s.idl", 'service s;\nimport "common.idl";\nop at(t: Stamp);\n')
        self.write("new/common.idl", "record Stamp { secs: i64; nanos: u32 = 1; }\n")
        self.write("new/s.idl", 'service s;\nimport "common.idl";\nop at(t: Stamp);\n')
        status, _, err = self.compare("--against", "old/s.idl", "new/s.idl")
        headers = [x for x in err.split("\n") if HEADER.match(x)]
        self.assertEqual(headers, [
            "new/common.idl:1:40: error: the default of field 'nanos' of record 'Stamp' changed "
            "from 0 to 1: a peer that leaves it out (one older than the field) now means 1 "
            "[wire-breaking]",
            "old/common.idl:1:40: note: the default was 0 here"])
        self.assertEqual(status, 1)

    def test_changes_are_reported_in_file_order(self):
        self.write("old.idl", "service s;\nop a(x: u32);\nop b(y: u32);\n")
        self.write("new.idl", "service s;\nop a(x: str);\nop b(y: u32, z: u32);\n")
        _, _, err = self.compare("--against", "old.idl", "new.idl")
        headers = [x.split(": ")[0] for x in err.split("\n") if HEADER.match(x)]
        self.assertEqual(headers, ["new.idl:2:9", "old.idl:2:9", "new.idl:3:14"])

    def test_renamed_record_is_compared_field_by_field(self):
        self.write("old.idl", "service s;\nrecord A { x: u32; }\nop get() -> list<A>;\n")
        self.write("new.idl", "service s;\nrecord B { x: u32; y: u32; }\nop get() -> list<B>;\n")
        status, _, err = self.compare("--against", "old.idl", "new.idl")
        headers = [x for x in err.split("\n") if HEADER.match(x)]
        self.assertEqual(headers, [
            "new.idl:2:8: warning: record 'A' was renamed to 'B': record names do not travel on "
            "the wire, but the C type 's_A' is now 's_B' [source-breaking]",
            "old.idl:2:8: note: it was 'A' here",
            "new.idl:2:20: error: field 'y' of record 'B' was added without a default: a record "
            "from an old peer lacks it, so a new reader refuses it (missing field); give it a "
            "default or make it optional [wire-breaking]"])
        self.assertEqual(status, 1)

    def test_record_inside_a_record_is_followed(self):
        self.write("old.idl", "service s;\nrecord In { x: u32; }\nrecord Out { i: In; }\n"
                              "record In2 { x: str; }\nrecord Out2 { i: In2; }\n"
                              "op get() -> Out;\n")
        self.write("new.idl", "service s;\nrecord In { x: u32; }\nrecord Out { i: In; }\n"
                              "record In2 { x: str; }\nrecord Out2 { i: In2; }\n"
                              "op get() -> Out2;\n")
        status, _, err = self.compare("--against", "old.idl", "new.idl")
        self.assertIn("new.idl:6:13: error: the type of the result of op 'get' changed from "
                      "'Out' to 'Out2': an old unit may return an integer in field 'x' of 'In' "
                      "in field 'i' of 'Out', which a new client refuses [wire-breaking]", err)
        self.assertEqual(status, 1)

    def test_equal_defaults_spelled_differently_are_no_change(self):
        self.write("old.idl", "service s;\nop f(a: u32 = 16, b: f64 = 2, c: str? = null);\n")
        self.write("new.idl", "service s;\nop f(a: u32 = 0x10, b: f64 = 2.0, c: str?);\n")
        self.assertEqual(self.compare("--against", "old.idl", "new.idl"), (0, "", NO_CHANGE))

    def test_optional_record_result_widening_is_source_breaking(self):
        self.write("old.idl", "service s;\nop f() -> u32?;\n")
        self.write("new.idl", "service s;\nop f() -> u64?;\n")
        status, _, err = self.compare("--against", "old.idl", "new.idl")
        self.assertIn("warning: the type of the result of op 'f' changed from 'u32?' to "
                      "'u64?': every old value still decodes, but the C type changes from "
                      "'s_opt_u32' to 's_opt_u64' [source-breaking]", err)
        self.assertEqual(status, 0)


class WithOutput(TempDir):
    """--against with -o: check first, then generate only if the check passed."""

    def setUp(self):
        super().setUp()
        self.calls = []
        self.fake = mock.Mock(
            render=lambda model, out, **options: self.calls.append(("render", out)) or
            [os.path.join(out, "s.ctl.h")],
            write_depfile=lambda depfile, outputs, inputs: self.calls.append(
                ("depfile", tuple(inputs))))
        patcher = mock.patch.object(cli.importlib, "import_module", return_value=self.fake)
        patcher.start()
        self.addCleanup(patcher.stop)
        self.write("old.idl", "service s;\nop get(key: str);\n")

    def test_a_breaking_change_writes_nothing(self):
        self.write("new.idl", "service s;\nop get(name: str);\n")
        status, _, _ = self.compare("--against", "old.idl", "new.idl", "-o", "out")
        self.assertEqual((status, self.calls), (1, []))

    def test_a_safe_change_generates_and_the_depfile_names_old(self):
        self.write("new.idl", "service s;\nop get(key: str);\nop put(key: str);\n")
        status, _, err = self.compare("--against", "old.idl", "new.idl", "-o", "out",
                                      "--depfile", "out/s.d")
        self.assertEqual(status, 0)
        self.assertIn("[safe]", err)
        self.assertEqual(self.calls, [("render", "out"), ("depfile", ("new.idl", "old.idl"))])

    def test_strict_source_breaking_writes_nothing(self):
        self.write("new.idl", "service t;\nop get(key: str);\n")
        status, _, _ = self.compare("--against", "old.idl", "new.idl", "-o", "out")
        self.assertEqual((status, self.calls), (0, [("render", "out")]))
        self.calls.clear()
        status, _, _ = self.compare("--against", "old.idl", "new.idl", "-o", "out", "--strict")
        self.assertEqual((status, self.calls), (1, []))


@unittest.skipUnless(shutil.which("git"), "git is not installed")
class AgainstGit(TempDir):
    """--against-git on a repository made for each test."""

    def git(self, *args, cwd=None):
        env = dict(os.environ, GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_SYSTEM=os.devnull,
                   GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.org",
                   GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.org")
        for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
            env.pop(var, None)
        subprocess.run(["git", *args], cwd=cwd or self.repo, env=env, check=True,
                       capture_output=True)

    def setUp(self):
        super().setUp()
        self.repo = os.path.join(self.tmp, "repo")
        os.makedirs(self.repo)
        self.git("init", "-q")
        self.write("repo/idl/common.idl", "record Info { size: u64; }\n")
        self.write("repo/idl/s.idl", 'service s;\nimport "common.idl";\n'
                                     "op put(key: str, pin: bool = false) -> Info;\n")
        self.git("add", ".")
        self.git("commit", "-q", "-m", "v1")

    def test_old_and_its_imports_come_from_the_revision(self):
        common = "record Info { size: u32; }\n"
        self.write("repo/idl/common.idl", common)
        main = 'service s;\nimport "common.idl";\nop put(key: str) -> Info;\n'
        self.write("repo/idl/s.idl", main)
        status, _, err = self.compare("--against-git", "HEAD", "idl/s.idl", cwd=self.repo)
        self.assertEqual(parse(err, {
            "idl/s.idl": main, "idl/common.idl": common,
            "HEAD:idl/s.idl": 'service s;\nimport "common.idl";\n'
                              "op put(key: str, pin: bool = false) -> Info;\n",
            "HEAD:idl/common.idl": "record Info { size: u64; }\n"}), [
            "idl/s.idl:3:4: error: arg 'pin' of op 'put' was removed: a call from an old client "
            "that sends it is refused with a Protocol error (unknown arg) [wire-breaking]",
            "HEAD:idl/s.idl:3:18: note: arg 'pin' was declared here",
            "idl/common.idl:1:21: error: the type of field 'size' of record 'Info' changed from "
            "'u64' to 'u32': an old peer may send values above 4294967295, which a new peer "
            "refuses [wire-breaking]",
            "HEAD:idl/common.idl:1:21: note: it was 'u64' here"])
        self.assertEqual(status, 1)

    def test_from_a_subdirectory_and_an_older_revision(self):
        self.write("repo/idl/s.idl", 'service s;\nimport "common.idl";\n'
                                     "op put(key: str, pin: bool = false) -> Info;\n"
                                     "op get(key: str) -> bin;\n")
        self.git("commit", "-q", "-am", "v2")
        status, _, err = self.compare("--against-git", "HEAD~1", "s.idl",
                                      cwd=os.path.join(self.repo, "idl"))
        self.assertEqual(status, 0)
        self.assertTrue(err.startswith("s.idl:4:4: note: op 'get' was added: "), err)
        status, out, err = self.compare("--against-git", "HEAD", "s.idl",
                                        cwd=os.path.join(self.repo, "idl"))
        self.assertEqual((status, out, err), (0, "", NO_CHANGE))

    def test_strict(self):
        self.write("repo/idl/s.idl", 'service t;\nimport "common.idl";\n'
                                     "op put(key: str, pin: bool = false) -> Info;\n")
        status, _, err = self.compare("--against-git", "HEAD", "idl/s.idl", "--strict",
                                      cwd=self.repo)
        self.assertEqual(status, 1)
        self.assertTrue(err.startswith("idl/s.idl:1:9: error: service 's' was renamed to 't'"))
        self.assertIn("HEAD:idl/s.idl:1:9: note: it was 's' here", err)

    def test_a_file_the_revision_lacks(self):
        self.write("repo/idl/n.idl", "service n;\nop ping();\n")
        status, _, err = self.compare("--against-git", "HEAD", "idl/n.idl", cwd=self.repo)
        self.assertEqual((status, err),
                         (1, "HEAD:idl/n.idl: error: cannot read file: no such file in HEAD\n"))

    def test_an_import_the_revision_lacks(self):
        self.write("repo/idl/s.idl", 'service s;\nimport "more.idl";\nop ping();\n')
        self.git("commit", "-q", "-am", "v2")
        self.write("repo/idl/more.idl", "record M { a: u32; }\n")
        status, _, err = self.compare("--against-git", "HEAD", "idl/s.idl", cwd=self.repo)
        self.assertEqual(status, 1)
        self.assertTrue(err.startswith("HEAD:idl/s.idl:2:8: error: cannot import 'more.idl': "
                                       "no such file in HEAD\n"), err)

    def test_an_import_outside_the_repository(self):
        self.write("repo/idl/s.idl", 'service s;\nimport "../../x.idl";\nop ping();\n')
        self.git("commit", "-q", "-am", "v2")
        self.write("x.idl", "record X { a: u32; }\n")
        status, _, err = self.compare("--against-git", "HEAD", "idl/s.idl", cwd=self.repo)
        self.assertEqual(status, 1)
        self.assertIn("HEAD:idl/s.idl:2:8: error: cannot import '../../x.idl': it is outside "
                      "the git repository", err)

    def test_a_directory_in_the_revision(self):
        self.write("repo/idl/s.idl", 'service s;\nimport ".";\nop ping();\n')
        self.git("commit", "-q", "-am", "v2")
        self.write("repo/idl/s.idl", "service s;\nop ping();\n")
        status, _, err = self.compare("--against-git", "HEAD", "idl/s.idl", cwd=self.repo)
        self.assertEqual(status, 1)
        self.assertIn("cannot import '.': not a file in HEAD", err)

    def test_unknown_revision(self):
        status, _, err = self.compare("--against-git", "v9", "idl/s.idl", cwd=self.repo)
        self.assertEqual((status, err), (1, "ctlrpc-gen: error: --against-git: 'v9' names no "
                                            "commit in the git repository of idl/s.idl\n"))

    def test_an_option_is_not_a_revision(self):
        status, _, err = self.compare("--against-git=--all", "idl/s.idl", cwd=self.repo)
        self.assertEqual((status, err),
                         (1, "ctlrpc-gen: error: --against-git: '--all' is not a revision\n"))

    def test_not_a_git_work_tree(self):
        self.write("alone/s.idl", "service s;\nop ping();\n")
        env = dict(os.environ, GIT_CEILING_DIRECTORIES=self.tmp)
        with mock.patch.dict(os.environ, env):
            status, _, err = self.compare("--against-git", "HEAD", "s.idl",
                                          cwd=os.path.join(self.tmp, "alone"))
        self.assertEqual(status, 1)
        self.assertTrue(err.startswith("ctlrpc-gen: error: --against-git: s.idl is not in a "
                                       "git work tree ("), err)

    def test_git_missing(self):
        with mock.patch.object(compat.subprocess, "run",
                               side_effect=FileNotFoundError(2, "No such file or directory")):
            status, _, err = self.compare("--against-git", "HEAD", "idl/s.idl", cwd=self.repo)
        self.assertEqual((status, err), (1, "ctlrpc-gen: error: --against-git needs git, which "
                                            "cannot be run: No such file or directory\n"))


if __name__ == "__main__":
    unittest.main()
