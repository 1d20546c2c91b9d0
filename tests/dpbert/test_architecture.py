"""docs/architecture.md's import rules for the DP engine, checked on the source."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Leaf modules the DP engine may use: they import nothing from dpbert themselves.
LEAVES = ("dpbert.errors", "dpbert.prng")
# The low layer of typed privacy concepts: dpbert and data_pipelines may both import it.
CORE = "dpbert.core"
HOST_SIDE = ("sampling", "accounting", "accountants", "calibration", "ledger", "noise_modes",
             "randomness", "plan")


def _imports(path: pathlib.Path, top_level_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    out = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out |= {f"{node.module}.{alias.name}" if node.module == "dpbert" else node.module
                    for alias in node.names}
    return out


@pytest.mark.parametrize("path", sorted((ROOT / "dpbert" / "dp").glob("*.py")),
                         ids=lambda p: p.name)
def test_the_dp_engine_imports_only_itself_and_the_leaf_modules(path):
    foreign = {m for m in _imports(path) if m.startswith("dpbert")
               and not m.startswith(("dpbert.dp", CORE)) and m not in LEAVES}
    assert not foreign, f"{path.name} imports {sorted(foreign)}"
    if path.stem in HOST_SIDE:
        assert not {m for m in _imports(path, top_level_only=True)
                    if m == "jax" or m.startswith("jax.")}, f"{path.name} imports JAX"


@pytest.mark.parametrize("leaf", LEAVES)
def test_the_leaf_modules_import_nothing_from_dpbert(leaf):
    path = ROOT / (leaf.replace(".", "/") + ".py")
    assert not {m for m in _imports(path) if m.startswith("dpbert")}


@pytest.mark.parametrize("path", sorted((ROOT / "dpbert" / "core").glob("*.py")),
                         ids=lambda p: p.name)
def test_the_core_imports_only_itself_and_errors_and_no_jax(path):
    imports = _imports(path)
    foreign = {m for m in imports if m.startswith("dpbert")
               and not m.startswith(CORE) and m != "dpbert.errors"}
    assert not foreign, f"{path.name} imports {sorted(foreign)}"
    heavy = {m for m in imports if m.split(".")[0] in ("jax", "flax", "dp_accounting")}
    assert not heavy, f"{path.name} imports {sorted(heavy)}"


@pytest.mark.parametrize("path", sorted((ROOT / "data_pipelines").glob("*.py")),
                         ids=lambda p: p.name)
def test_the_data_pipelines_import_only_the_low_layer_of_dpbert(path):
    foreign = {m for m in _imports(path) if m.startswith("dpbert")
               and not m.startswith(CORE) and m != "dpbert.errors"}
    assert not foreign, f"{path.name} imports {sorted(foreign)}"
