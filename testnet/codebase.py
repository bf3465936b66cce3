"""The codebase's structural rules, checked: `python -m testnet.codebase` (exit 1 when one is broken).

- **No module over `MAX_LINES` lines** (500) in the packages (`PACKAGES`); the few that were longer when the
  rule came (`KNOWN_LONG`) may not grow.
- **No two classes of one name** in different modules of the packages: a reader who sees `Outcome` knows which
  one it is. (Private classes, `_Name`, are the module's own business and are left out.)
- **No import cycles** between the packages' modules, counting only imports at module level (an import inside
  a function runs later, when both modules are loaded; one under `if __name__ == "__main__":` only when the
  module runs as a script).
- **Layers point one way**: `protocol` imports nothing of ours, `p2p` only `protocol`, `node` only `protocol` and
  `p2p`, `diloco` those three; `testnet` may use all of them, and none of them `testnet`.

Reads the source with `ast`; imports nothing it checks.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["KNOWN_LONG", "MAX_LINES", "PACKAGES", "Finding", "check", "main"]

MAX_LINES = 500
# modules past MAX_LINES when the rule came, each held to its size then until it is split (issue 50); none left:
# the ledger went under in session 42 (protocol/ledger/restore.py), the router in 43 (protocol/gossip/lazy.py)
KNOWN_LONG: dict[str, int] = {}
PACKAGES = ("protocol", "p2p", "node", "diloco", "testnet")
ALLOWED = {"protocol": set(), "p2p": {"protocol"}, "node": {"protocol", "p2p"},
           "diloco": {"protocol", "p2p", "node"}, "testnet": {"protocol", "p2p", "node", "diloco"}}


@dataclass(frozen=True)
class Finding:
    rule: str
    where: str
    detail: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.where}: {self.detail}"


def _modules(root: Path) -> Iterator[tuple[str, Path]]:
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def _top_level_imports(tree: ast.Module, module: str, is_package: bool, modules: set[str]) -> set[str]:
    """Modules of ours imported at module level (not inside functions; `if TYPE_CHECKING:` blocks left out).
    `from a import b` is an import of module `a.b` where that is a module (its package's `__init__` is not
    what it uses), else of `a`."""
    found: set[str] = set()
    base = module.split(".") if is_package else module.split(".")[:-1]

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    stem = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                for alias in node.names:
                    found.add(f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in modules else stem)
            elif isinstance(node, ast.If) and not _type_checking_or_main(node.test):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)

    visit(tree.body)
    return {name for name in found if name.split(".")[0] in PACKAGES}


def _type_checking_or_main(test: ast.expr) -> bool:
    """`if TYPE_CHECKING:` (never runs) or `if __name__ == "__main__":` (runs only as a script)."""
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def check(root: Path, known_long: dict[str, int] | None = None) -> list[Finding]:
    """Every broken rule under `root` (a checkout: `root/protocol`, `root/p2p`, ...)."""
    known_long = KNOWN_LONG if known_long is None else known_long
    findings: list[Finding] = []
    classes: dict[str, list[str]] = defaultdict(list)
    graph: dict[str, set[str]] = {}
    modules = dict(_modules(root))
    for module, path in modules.items():
        text = path.read_text()
        lines = text.count("\n")
        relative = path.relative_to(root).as_posix()
        if lines > known_long.get(relative, MAX_LINES):
            limit = known_long.get(relative, MAX_LINES)
            findings.append(Finding(f"module over {limit} lines", relative, f"{lines} lines"))
        tree = ast.parse(text, str(path))
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                classes[node.name].append(module)
        imported = _top_level_imports(tree, module, path.name == "__init__.py", set(modules))
        # `from p2p import host` names a module; `from p2p.host import Host` names an attribute: keep modules
        graph[module] = {name for name in imported if name in modules and name != module}
        layer = module.split(".")[0]
        for name in sorted(imported):
            other = name.split(".")[0]
            if other != layer and other not in ALLOWED[layer]:
                findings.append(Finding("layer", module, f"imports {name} ({layer} may use "
                                        f"{', '.join(sorted(ALLOWED[layer])) or 'nothing of ours'})"))
    for name, where in sorted(classes.items()):
        if len(where) > 1:
            findings.append(Finding("class name used twice", name, ", ".join(where)))
    for component in _cycles(graph):
        findings.append(Finding("import cycle", component[0], " <-> ".join(component)))
    return findings


def main(argv: list[str] | None = None) -> int:
    root = Path(__file__).resolve().parents[1]
    findings = check(root)
    for finding in findings:
        print(finding)
    print(f"{len(findings)} finding(s) in {', '.join(PACKAGES)}" if findings else
          f"ok: no module over {MAX_LINES} lines"
          + (f" (but {len(KNOWN_LONG)} known, not growing: {', '.join(KNOWN_LONG)})" if KNOWN_LONG else "")
          + ", no class name used twice, no import cycle, layers one way")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
