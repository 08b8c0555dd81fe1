"""The worker's modules import each other as a tree: no cycle, counting
the imports made inside functions too (a cycle broken by a function-level
import is still a cycle, one that only shows when the function runs)."""

import ast
import unittest
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "stepserve_worker"


def imports(source: str, modules: set[str]) -> set[str]:
    """The package's modules source imports, anywhere in it."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:  # from .x import y
                out.add(node.module.split(".")[0])
            elif node.level == 1:  # from . import x, y
                out.update(a.name for a in node.names if a.name in modules)
            elif node.module and node.module.startswith("stepserve_worker."):
                out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("stepserve_worker."):
                    out.add(a.name.split(".")[1])
    return out & modules


def graph(sources: dict[str, str]) -> dict[str, set[str]]:
    modules = set(sources)
    return {name: imports(src, modules) - {name} for name, src in sources.items()}


def cycle(g: dict[str, set[str]]) -> list[str]:
    """A cycle in g, as the modules along it, or [] for none."""
    state: dict[str, int] = {}  # 1 on the path, 2 done
    path: list[str] = []

    def visit(m: str) -> list[str]:
        state[m] = 1
        path.append(m)
        for n in sorted(g[m]):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        path.pop()
        state[m] = 2
        return []

    for m in sorted(g):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return []


class ImportsTest(unittest.TestCase):
    def test_the_worker_imports_without_a_cycle(self):
        sources = {p.stem: p.read_text() for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
        self.assertIn("nets", sources)
        g = graph(sources)
        self.assertEqual(cycle(g), [], "the worker's modules import each other in a cycle")

    def test_a_cycle_is_found(self):
        # The check itself: a function-level import that closes a loop.
        g = graph({"a": "from . import b\n", "b": "def f():\n    from .a import x\n"})
        self.assertEqual(cycle(g), ["a", "b", "a"])


if __name__ == "__main__":
    unittest.main()
