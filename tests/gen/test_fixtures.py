"""The IDL fixtures: every bad/*.idl fails with exactly the diagnostics its `// expect:` lines
name, in order, and exit status 1; every good/*.idl (and idl/storage.idl) passes, printing only
the warnings it expects.

One test method per fixture file, generated below, so a failure names the fixture.
"""

import glob
import os
import unittest

import support


def _fixtures(directory):
    return sorted(glob.glob(os.path.join(directory, "*.idl")))


class BadFixtures(unittest.TestCase):
    def check_bad(self, path):
        expected = support.expectations(path)
        self.assertTrue(any(": error: " in e for e in expected),
                        f"{path} has no '// expect: ... error:' line")
        status, out, err = support.run(["--check", os.path.basename(path)],
                                       cwd=os.path.dirname(path))
        headers, why = support.diagnostics(err)
        self.assertIsNotNone(headers, f"{why}\n--- stderr ---\n{err}")
        self.assertEqual(headers, expected, f"\n--- stderr ---\n{err}")
        self.assertEqual(status, 1, err)
        self.assertEqual(out, "")


class GoodFixtures(unittest.TestCase):
    def check_good(self, path):
        status, out, err = support.run(["--check", os.path.basename(path)],
                                       cwd=os.path.dirname(path))
        headers, why = support.diagnostics(err)
        self.assertIsNotNone(headers, f"{why}\n--- stderr ---\n{err}")
        self.assertEqual(headers, support.expectations(path), err)
        self.assertEqual(status, 0, err)
        self.assertEqual(out, "")


def _name(path):
    return "test_" + os.path.splitext(os.path.basename(path))[0]


for _path in _fixtures(support.BAD):
    setattr(BadFixtures, _name(_path), lambda self, p=_path: self.check_bad(p))
for _path in _fixtures(support.GOOD) + [support.STORAGE_IDL]:
    setattr(GoodFixtures, _name(_path), lambda self, p=_path: self.check_good(p))


class FixtureSet(unittest.TestCase):
    def test_there_are_fixtures(self):
        self.assertGreaterEqual(len(_fixtures(support.BAD)), 40)
        self.assertIn(os.path.join(support.GOOD, "everything.idl"), _fixtures(support.GOOD))

    def test_a_fixture_reports_several_errors(self):
        expected = support.expectations(os.path.join(support.BAD, "multiple_errors.idl"))
        self.assertGreaterEqual(len(expected), 5)


if __name__ == "__main__":
    unittest.main()
