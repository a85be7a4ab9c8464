"""The storage demo (examples/storage/demo.sh) as a newcomer runs it with its output in a pipe or
a log: it completes, writes no terminal escapes, and every command it prints reads back, through
a shell's quoting rules, as the words it ran (so a pasted command does what the demo did).
Where etcd and etcdctl are installed, its fleet part too: three units register, `ctlrpc units`
lists them, `ctl-storage --etcd ... --service storage stats` reaches each of them, and the unit
it stops is gone from the next listing and the next call. Without etcd the demo says it skips
that part (a failure instead with CTLRPC_REQUIRE_ETCD=1, as in CI).

    test_demo.py BUILD_DIR
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
DEMO = os.path.join(HERE, "..", "..", "examples", "storage", "demo.sh")
BUILD = None


class Demo(unittest.TestCase):
    def test_output(self):
        r = subprocess.run(["bash", DEMO, BUILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=240, env=dict(os.environ, CTLRPC_PYTHON=sys.executable))
        out = r.stdout.decode()
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        self.assertNotIn("\033", out)
        self.assertIn("\n## Four storage units", out)
        commands = [line[2:] for line in out.splitlines() if re.match(r"^\$ ctl(-storage|rpc) ",
                                                                       line)]
        self.assertGreater(len(commands), 20)
        for line in commands:
            shlex.split(line)  # a quote left open would raise
        describe = [c for c in commands if c.startswith("ctlrpc call ") and " describe " in c]
        self.assertEqual(len(describe), 1, commands)
        self.assertEqual(shlex.split(describe[0])[-1], 'keys=["weights/shard-1"]')
        self.assertTrue(describe[0].endswith(""" describe 'keys=["weights/shard-1"]'"""),
                        describe[0])
        if shutil.which("etcd") and shutil.which("etcdctl"):
            self.check_fleet(out)
        else:
            self.assertNotEqual(os.environ.get("CTLRPC_REQUIRE_ETCD"), "1",
                                "etcd or etcdctl not found, and CTLRPC_REQUIRE_ETCD=1")
            self.assertIn("\n## A fleet: skipped, etcd and etcdctl are not installed", out)

    def check_fleet(self, out):
        head = "\n## A fleet: a private etcd, and three units that register in it\n"
        self.assertIn(head, out)
        fleet = out[out.index(head) + len(head):]
        fleet = fleet[:fleet.index("\n## Stopping the units")]
        self.assertNotIn("(exit status", fleet)
        units = dict(re.findall(r"^(unit-\d): (tcp://127\.0\.0\.1:\d+)$", fleet, re.M))
        self.assertEqual(sorted(units), ["unit-1", "unit-2", "unit-3"], fleet)
        etcd = re.search(r"^etcd on (http://127\.0\.0\.1:\d+)$", fleet, re.M).group(1)
        blocks = command_blocks(fleet)
        listing = f"ctlrpc units --etcd {etcd} --service storage"
        stats = f"ctl-storage --etcd {etcd} --service storage stats"
        self.assertEqual([c for c, _ in blocks], [listing, stats, listing, stats], fleet)
        (_, before), (_, stats_before), (_, after), (_, stats_after) = blocks

        def listed(lines):
            self.assertTrue(lines and lines[0].split()[:3] == ["UNIT_ID", "ADDRESS", "STATE"],
                            lines)
            return {w[0]: (w[1], w[2]) for w in (line.split() for line in lines[1:])}

        def called(lines):
            self.assertTrue(lines and lines[0].split()[0] == "UNIT", lines)
            return sorted(line.split()[0] for line in lines[1:])

        everyone = {u: (a, "serving") for u, a in units.items()}
        self.assertEqual(listed(before), everyone, fleet)
        self.assertEqual(called(stats_before), sorted(units.values()), fleet)
        del everyone["unit-2"]
        self.assertEqual(listed(after), everyone, fleet)
        self.assertEqual(called(stats_after), sorted(a for a, _ in everyone.values()), fleet)


def command_blocks(text):
    """[(command, [output lines])] for each `$ ` line of `text`, up to the next one or the next
    `## ` heading; blank lines left out."""
    blocks = []
    lines = None
    for line in text.splitlines():
        if line.startswith("$ "):
            lines = []
            blocks.append((line[2:], lines))
        elif line.startswith("## "):
            lines = None
        elif lines is not None and line.strip():
            lines.append(line)
    return blocks


if __name__ == "__main__":
    BUILD = sys.argv.pop(1)
    unittest.main(verbosity=2)
