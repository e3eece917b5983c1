"""House sizes, held against the code: no file over 600 lines, no function over 60.

A file or function past them is doing more than one thing; split it where the concepts
part (docs/architecture.md names where each lives). Tests and load tests are not held.
"""

from __future__ import annotations

import ast
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HELD = ("homeserver", "budget", "app.py")
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 60


def held_files(root: str = REPO) -> list[str]:
    found = []
    for entry in HELD:
        path = os.path.join(root, entry)
        if path.endswith(".py"):
            found.append(path)
            continue
        for directory, _, names in os.walk(path):
            found += [os.path.join(directory, n) for n in names if n.endswith(".py")]
    return sorted(found)


def oversized(path: str) -> list[str]:
    """What in `path` is over the sizes, as "file:line what (n lines)"."""
    with open(path) as f:
        source = f.read()
    name = os.path.relpath(path, REPO)
    found = []
    lines = source.count("\n")
    if lines > MAX_FILE_LINES:
        found.append(f"{name} ({lines} lines)")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            length = (node.end_lineno or node.lineno) - first + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"{name}:{node.lineno} {node.name}() ({length} lines)")
    return found


def test_no_file_or_function_is_over_the_house_sizes():
    found = [line for path in held_files() for line in oversized(path)]
    assert not found, "over the house sizes:\n" + "\n".join(found)


def test_a_long_function_and_a_long_file_are_caught(tmp_path):
    long_function = "def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES
    path = tmp_path / "long.py"
    path.write_text(long_function + "\n" * (MAX_FILE_LINES - MAX_FUNCTION_LINES))
    found = oversized(str(path))
    assert len(found) == 2
    assert found[0].endswith(f"({MAX_FILE_LINES + 1} lines)")
    assert found[1].endswith(f"f() ({MAX_FUNCTION_LINES + 1} lines)")
