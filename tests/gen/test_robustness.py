"""Robustness: mutated and truncated fixtures (good and bad) never crash the generator.

Every case either passes (status 0, no error printed) or fails cleanly (status 1 with well-formed
diagnostics); never status 2, never a traceback, never a hang. The seed is fixed, so a failure
reproduces; its message carries the mutated text. $CTLRPC_ROBUST_SEED and $CTLRPC_ROBUST_CASES
override the seed and the number of cases for longer runs (docs/RELIABILITY.md).
"""

import os
import random
import shutil
import signal
import tempfile
import unittest

import support

SEED = int(os.environ.get("CTLRPC_ROBUST_SEED", "20240611"))
CASES = int(os.environ.get("CTLRPC_ROBUST_CASES", "400"))
TIMEOUT_S = 10

SNIPPETS = [
    ";", "{", "}", "(", ")", "<", ">", "?", "??", ",", ":", "=", "->", "-", "[", "]", '"', "\\",
    "/*", "*/", "//", "///", "\n", "\t", "\r", " ", "0", "-1", "0x", "1e", "1.5", "007",
    "99999999999999999999999", "list<", "map<", "map<str, ", "op ", "notify ", "record ",
    "service x;", 'import "inc/common.idl";', 'import "everything.idl";', "import ", "raises ",
    "raises Busy", "Protocol", "null", "true", "[]", "{}", "u64", "str", "bin", "f64", "i32",
    "Node", "Stamp", "_x", "ctl_x", "int", "client", "é", "\u2028", "\x00", "\x0c", "$",
]


def mutate(rng, data):
    """One random edit of `data` (bytes)."""
    choice = rng.randrange(7)
    pos = rng.randrange(len(data) + 1)
    if choice == 0:  # truncate
        return data[:pos]
    if choice == 1:  # delete a span
        return data[:pos] + data[pos + rng.randint(1, 24):]
    if choice == 2:  # insert a snippet
        return data[:pos] + rng.choice(SNIPPETS).encode("utf-8") + data[pos:]
    if choice == 3:  # insert random bytes (invalid UTF-8 included)
        return data[:pos] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 3))) + data[pos:]
    lines = data.split(b"\n")
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    if choice == 4:  # duplicate a line
        lines.insert(j, lines[i])
    elif choice == 5:  # swap two lines
        lines[i], lines[j] = lines[j], lines[i]
    else:  # replace a word with another word of the file
        words = data.replace(b"\n", b" ").split()
        if words:
            a, b = rng.choice(words), rng.choice(words)
            return data.replace(a, b, 1)
    return b"\n".join(lines)


def _timeout(signum, frame):
    raise TimeoutError("ctlrpc-gen did not finish")


class Robustness(unittest.TestCase):
    def test_mutated_fixtures_fail_cleanly(self):
        sources = [os.path.join(d, n) for d in (support.GOOD, support.BAD)
                   for n in sorted(os.listdir(d)) if n.endswith(".idl")] + [support.STORAGE_IDL]
        rng = random.Random(SEED)
        outcomes = {0: 0, 1: 0}
        with tempfile.TemporaryDirectory() as tmp:
            for d in (support.GOOD, support.BAD):  # what the fixtures import
                shutil.copytree(os.path.join(d, "inc"), os.path.join(tmp, "inc"),
                                dirs_exist_ok=True)
            shutil.copy(os.path.join(support.GOOD, "everything.idl"), tmp)
            old = signal.signal(signal.SIGALRM, _timeout)
            try:
                for case in range(CASES):
                    with open(rng.choice(sources), "rb") as f:
                        data = f.read()
                    for _ in range(rng.randint(1, 3)):
                        data = mutate(rng, data)
                    name = f"case{case}.idl"
                    with open(os.path.join(tmp, name), "wb") as f:
                        f.write(data)
                    signal.alarm(TIMEOUT_S)
                    try:
                        status, out, err = support.run(["--check", name], cwd=tmp)
                    finally:
                        signal.alarm(0)
                    self.check_outcome(case, data, status, out, err)
                    outcomes[status] += 1
            finally:
                signal.signal(signal.SIGALRM, old)
        # The mutations must exercise both outcomes, or this test proves little.
        self.assertGreater(outcomes[1], CASES // 2, outcomes)
        self.assertGreater(outcomes[0], 0, outcomes)

    def check_outcome(self, case, data, status, out, err):
        context = f"case {case}, input {data!r}\n--- stderr ---\n{err}"
        self.assertIn(status, (0, 1), context)
        self.assertNotIn("Traceback", err, context)
        self.assertNotIn("internal error", err, context)
        self.assertEqual(out, "", context)
        if err.startswith(f"case{case}.idl: error: "):  # a whole-file error has no source line
            self.assertEqual(status, 1, context)
            return
        headers, why = support.diagnostics(err)
        self.assertIsNotNone(headers, f"{why}\n{context}")
        errors = [h for h in headers if ": error: " in h]
        self.assertEqual(status, 1 if errors else 0, context)


if __name__ == "__main__":
    unittest.main()
