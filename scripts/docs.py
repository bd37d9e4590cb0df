#!/usr/bin/env python3
"""Build the API reference from the docstrings (``make docs``, run by ``make test``).

Every public module of ``tiermem`` (no ``_``-prefixed part, no ``__main__``) is rendered by
pdoc (Google-style sections, reStructuredText roles) into ``docs/api/``, with every warning an
error. Then every cross-reference a docstring makes to tiermem (``:class:`~tiermem.x.Y```,
``:func:``, ``:meth:``, ``:mod:``, ``:data:``, ``:attr:``, ``:exc:``) must name something
that exists: a broken reference fails the build, naming the docstring's owner and the
reference. Exit status 1 with one line per problem.
"""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import re
import sys
import warnings
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "api"
ROLE = re.compile(r"(?::py)?:(?:mod|func|data|const|class|meth|attr|exc|obj):`~?(tiermem[\w.]*)(?:\(\))?`")


def modules() -> list[str]:
    """The public modules of the package, parents first."""
    import tiermem

    names = ["tiermem"]
    for m in pkgutil.walk_packages(tiermem.__path__, "tiermem."):
        parts = m.name.split(".")
        if any(p.startswith("_") for p in parts[1:]):
            continue
        names.append(m.name)
    return names


def resolves(ref: str) -> bool:
    """Whether ``ref`` (``tiermem.a.b.C.d``) names a module or an attribute of one."""
    parts = ref.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for p in parts[cut:]:
            if not hasattr(obj, p):
                ann = getattr(obj, "__annotations__", {}) if inspect.isclass(obj) else {}
                fields = getattr(obj, "__dataclass_fields__", {})
                if p in ann or p in fields:
                    return True
                return False
            obj = getattr(obj, p)
        return True
    return False


#: The references the last check read.
checked: set[str] = set()


def broken_references(names: list[str]) -> list[str]:
    """One line per reference that names nothing."""
    problems = []
    seen: set[int] = set()
    checked.clear()

    def visit(owner: str, obj: object) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        doc = inspect.getdoc(obj) or ""
        for ref in ROLE.findall(doc):
            checked.add(ref)
            if not resolves(ref):
                problems.append(f"{owner}: the docstring refers to {ref}, which does not exist")
        if inspect.isclass(obj):
            for k, v in vars(obj).items():
                if not k.startswith("_") or k == "__init__":
                    visit(f"{owner}.{k}", v)

    for name in names:
        mod: ModuleType = importlib.import_module(name)
        visit(name, mod)
        for k, v in vars(mod).items():
            if k.startswith("_") or getattr(v, "__module__", None) != name:
                continue
            visit(f"{name}.{k}", v)
    return problems


def main() -> int:
    sys.path.insert(0, str(ROOT / "python"))
    import pdoc
    import pdoc.extract

    names = modules()
    pdoc.render.configure(docformat="google", show_source=False)
    for n in names:
        # Names a package loads on first use (its __getattr__) are loaded now, so the
        # reference shows them where __all__ says they are.
        mod = importlib.import_module(n)
        for k in getattr(mod, "__all__", ()):
            getattr(mod, k)
    with warnings.catch_warnings():
        warnings.simplefilter(os.environ.get("TIERMEM_DOCS_WARNINGS", "error"))
        # torch.Tensor's `_is_param` is defined in C: pdoc cannot find its source file for
        # the classes that inherit it. Nothing of ours is behind this message.
        warnings.filterwarnings("ignore", message=r"Cannot determine where .*\._is_param is taken from")
        # pdoc walks a package's submodules itself (unless its __all__ leaves them out):
        # each module is named once.
        specs: list[str] = []
        covered: set[str] = set()
        for n in names:
            if n not in covered:
                specs.append(n)
                covered |= set(pdoc.extract.walk_specs([n]))
        pdoc.pdoc(*specs, output_directory=OUT)
    problems = broken_references(names)
    for p in problems:
        print(p, file=sys.stderr)
    pages = len(list(OUT.rglob("*.html")))
    if not problems:
        print(
            f"docs: {len(names)} modules, {pages} pages in {OUT.relative_to(ROOT)}; "
            f"all {len(checked)} distinct references to tiermem resolve"
        )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
