"""torch._inductor.config's setting names, and which are booleans, read from its source without importing torch.

The driver checks ``train.inductor`` keys before launch. Importing torch._inductor for that costs seconds (and
more on an image whose torch has no compiled bytecode); parsing ``torch/_inductor/config.py`` costs milliseconds.
A setting is a public assignment at the module's top level or inside one of its classes (``triton.cudagraphs``;
a class's bases defined in the same file contribute their settings too), as torch's config module collects them.
A test checks the result against ``get_config_copy()`` of the installed torch.
"""

from __future__ import annotations

import ast
import importlib.util
from functools import lru_cache
from pathlib import Path

BOOL = True     # the placeholder default of a boolean setting (the check only asks whether it is a bool)
OTHER = None    # any other type


def _kind(annotation: ast.expr | None, value: ast.expr | None) -> bool | None:
    if isinstance(annotation, ast.Name) and annotation.id == "bool":
        return BOOL
    if (isinstance(annotation, ast.BinOp) and isinstance(annotation.left, ast.Name)
            and annotation.left.id == "bool"):  # ``bool | None``: a tristate, set with a boolean
        return BOOL
    if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "Config":
        for kw in value.keywords:
            if kw.arg == "default":
                value = kw.value
    if isinstance(value, ast.Constant) and isinstance(value.value, bool):
        return BOOL
    if isinstance(value, ast.Compare) or (isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.Not)):
        return BOOL  # e.g. os.environ.get("TORCHINDUCTOR_MAX_AUTOTUNE") == "1"
    if isinstance(value, ast.BoolOp) and all(_kind(None, v) is BOOL for v in value.values):
        return BOOL
    if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "bool":
        return BOOL
    return OTHER


def _collect(body: list[ast.stmt], prefix: str, classes: dict[str, ast.ClassDef], out: dict[str, bool | None]) -> None:
    for node in body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names, annotation, value = [node.target.id], node.annotation, node.value
        elif isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            annotation, value = None, node.value
        elif isinstance(node, ast.ClassDef):
            for base in node.bases:  # e.g. ``class cuda(cutlass)``: cutlass's settings are cuda's too
                if isinstance(base, ast.Name) and base.id in classes:
                    _collect(classes[base.id].body, f"{prefix}{node.name}.", classes, out)
            _collect(node.body, f"{prefix}{node.name}.", classes, out)
            continue
        else:
            continue
        for name in names:
            if not name.startswith("__"):
                out[f"{prefix}{name}"] = _kind(annotation, value)


@lru_cache(maxsize=1)
def settings() -> dict[str, bool | None] | None:
    """Every setting's dotted name -> ``BOOL`` for a boolean, ``OTHER`` otherwise; None when torch's source is
    not there to read (the driver then asks torch itself)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return None
    path = Path(spec.origin).parent / "_inductor" / "config.py"
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    out: dict[str, bool | None] = {}
    _collect(tree.body, "", classes, out)
    return out
