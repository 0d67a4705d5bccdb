"""The package's shape: no import cycle between its modules, every file small enough to read.

Imports are read from the source (module level only: an import inside a function is a lazy
one, taken when the function runs, and ``if TYPE_CHECKING:`` blocks never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "code2wav"
MAX_LINES = 400


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The package modules ``path`` imports at module level."""
    tree = ast.parse(path.read_text())
    me = _module(path)
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, (ast.If, ast.Try)):
                for block in (node.body, getattr(node, "orelse", []), *[h.body for h in getattr(node, "handlers", [])]):
                    visit(block)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative
                    pkg = me.split(".")[: len(me.split(".")) - node.level + (path.name == "__init__.py")]
                    base = ".".join(pkg + ([base] if base else []))
                found.add(base)
                found.update(f"{base}.{a.name}" for a in node.names)

    visit(tree.body)
    return {m for m in found if m in modules and m != me}


def test_no_import_cycle():
    files = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph = {m: _imports(p, set(files)) for m, p in files.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def walk(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            assert state.get(n) != 1, "import cycle: " + " -> ".join(path[path.index(n):] + [n]) if n in path else n
            if n not in state:
                walk(n, path + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            walk(m, [m])


def test_the_cycle_check_sees_a_cycle(tmp_path):
    """The reader itself: two modules importing each other are a cycle it reports."""
    pkg = tmp_path / "code2wav"
    pkg.mkdir()
    (pkg / "a.py").write_text("from code2wav.b import x\n")
    (pkg / "b.py").write_text("import code2wav.a\nx = 1\n")
    mods = {"code2wav.a", "code2wav.b"}
    global PACKAGE
    saved, PACKAGE = PACKAGE, pkg
    try:
        assert _imports(pkg / "a.py", mods) == {"code2wav.b"} and _imports(pkg / "b.py", mods) == {"code2wav.a"}
    finally:
        PACKAGE = saved


def test_every_package_file_is_small_enough_to_hold_in_your_head():
    long = {str(p.relative_to(PACKAGE.parent)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long
