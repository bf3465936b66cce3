"""Tier (a): the structural rules (`testnet.codebase`): each is caught on a small tree made for it, and this
repository keeps them all."""

from __future__ import annotations

from pathlib import Path

from testnet.codebase import MAX_LINES, check


def _tree(root: Path, files: dict[str, str]) -> Path:
    for package in ("protocol", "p2p", "node", "diloco", "testnet"):
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / "__init__.py").touch()
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def test_each_rule_is_caught(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "p2p/big.py": "x = 1\n" * (MAX_LINES + 1),
        "p2p/a.py": "from p2p import b\nclass Thing:\n    pass\n",
        "p2p/b.py": "import p2p.a\n",
        "node/c.py": "class Thing:\n    pass\nclass _Private:\n    pass\n",
        "node/d.py": "class _Private:\n    pass\n",
        "protocol/up.py": "from p2p import a\n",
        "node/late.py": "def f():\n    import testnet\nif __name__ == '__main__':\n    import testnet.x\n",
    })
    found = {(f.rule, f.where) for f in check(root, known_long={})}
    assert ("module over 500 lines", "p2p/big.py") in found
    assert ("class name used twice", "Thing") in found and ("class name used twice", "_Private") not in found
    assert ("import cycle", "p2p.a") in found
    assert ("layer", "protocol.up") in found
    assert not any(where == "node.late" for _, where in found), "imports in functions and __main__ blocks are late"
    assert ("module over 600 lines", "p2p/big.py") not in {(f.rule, f.where) for f in
                                                           check(root, known_long={"p2p/big.py": 600})}


def test_this_repository_keeps_the_rules() -> None:
    findings = check(Path(__file__).resolve().parents[2])
    assert findings == [], "\n".join(map(str, findings))
