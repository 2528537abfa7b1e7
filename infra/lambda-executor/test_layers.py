"""Tests of the host executor's layers (no LocalStack needed):

    python3 -m unittest discover -s infra/lambda-executor -p 'test_*.py'

(`make test-python`, hence CI, runs them with pytest.)
"""

from __future__ import annotations

import os
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sas_lambda_executor import layers


class MergeAndRewrite(unittest.TestCase):
    def setUp(self) -> None:
        self._tmp = tempfile.TemporaryDirectory()
        self.root = Path(self._tmp.name)

    def tearDown(self) -> None:
        self._tmp.cleanup()

    def layer(self, name: str, files: dict[str, str]) -> Path:
        d = self.root / "unpacked" / name
        for rel, text in files.items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_text(text)
        return d

    def test_later_layers_win_and_every_file_is_kept(self) -> None:
        first = self.layer("a", {"workflows.json": "old", "agents.json": "agents", "lib/x.so": "x"})
        second = self.layer("b", {"workflows.json": "new", "lib/y.so": "y"})
        os.chmod(second / "lib" / "y.so", 0o755)
        target = layers.merged_dir(self.root / "merged", [first, second])
        self.assertEqual(layers.merge([first, second], target), target)
        got = {str(p.relative_to(target)): p.read_text() for p in target.rglob("*") if p.is_file()}
        self.assertEqual(
            got, {"workflows.json": "new", "agents.json": "agents", "lib/x.so": "x", "lib/y.so": "y"}
        )
        self.assertTrue(os.access(target / "lib" / "y.so", os.X_OK), "modes are kept")
        self.assertEqual([p.name for p in target.parent.iterdir()], ["opt"], "no staging left behind")

    def test_the_merge_is_made_once_per_set_of_layers(self) -> None:
        a = self.layer("a", {"f": "1"})
        b = self.layer("b", {"f": "2"})
        ab = layers.merged_dir(self.root / "merged", [a, b])
        self.assertEqual(ab, layers.merged_dir(self.root / "merged", [a, b]))
        self.assertNotEqual(ab, layers.merged_dir(self.root / "merged", [b, a]), "order matters")
        self.assertNotEqual(ab, layers.merged_dir(self.root / "merged", [a]))
        layers.merge([a, b], ab)
        (b / "f").write_text("changed after the merge")
        layers.merge([a, b], ab)
        self.assertEqual((ab / "f").read_text(), "2", "an existing merge is reused, not redone")

    def test_a_missing_layer_fails_and_leaves_nothing(self) -> None:
        a = self.layer("a", {"f": "1"})
        target = layers.merged_dir(self.root / "merged", [a, self.root / "gone"])
        with self.assertRaises(FileNotFoundError):
            layers.merge([a, self.root / "gone"], target)
        self.assertEqual(list(target.parent.iterdir()), [])

    def test_values_under_opt_point_at_the_merge(self) -> None:
        env = {
            "SAS_WORKFLOWS_FILE": "/opt/workflows.json",
            "SAS_AGENTS_FILE": "/opt/agents.json",
            "LIB": "/opt",
            "OTHER": "/optional/x",
            "URL": "http://h/opt/x",
            "EMPTY": "",
        }
        got = layers.rewrite_opt(env, Path("/tmp/m/opt"))
        self.assertEqual(
            got,
            {
                "SAS_WORKFLOWS_FILE": "/tmp/m/opt/workflows.json",
                "SAS_AGENTS_FILE": "/tmp/m/opt/agents.json",
                "LIB": "/tmp/m/opt",
                "OTHER": "/optional/x",
                "URL": "http://h/opt/x",
                "EMPTY": "",
            },
        )
        self.assertEqual(env["SAS_WORKFLOWS_FILE"], "/opt/workflows.json", "the input is left alone")


if __name__ == "__main__":
    unittest.main()
