"""Checks on Python source, shared by tests of compiled and generated code."""
import ast


def slice_assignments(source):
    """The statements of ``source`` assigning to a slice of an array
    (``a[i:j] = b``), whose error path Numba compiles with string formatting
    (seconds per pair of ranks in a cold process)."""
    return [ast.unparse(node) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Subscript) and any(
                    isinstance(part, ast.Slice) for part in ast.walk(target.slice))
                for target in node.targets)]
