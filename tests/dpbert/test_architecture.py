"""docs/architecture.md, checked on the source (imports parsed with `ast`; nothing is imported, so
this runs in a second without JAX): the layer order of the packages, no import cycle, a budget of
function-local imports, file sizes, the DP engine's isolation, and a map that names every
module."""

import ast
import collections
import dataclasses
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PROJECT = ("dpbert", "data_pipelines", "launch", "configs")
LIBRARY = ("dpbert", "data_pipelines")

# The layers, lowest first: a module imports only from its own layer or a lower one (module
# level or inside a function alike). The order is the one the code has (docs/architecture.md).
LAYERS = (
    ("dpbert", "dpbert.errors", "dpbert.prng", "dpbert.core"),  # leaves + typed privacy concepts
    ("data_pipelines",),     # corpora, tokenization, instances, DP vocabulary, canaries
    ("dpbert.dp",),          # the DP engine
    ("dpbert.reporting",),   # what a run may claim (report, card, lineage)
    ("dpbert.models",),      # BERT, heads, losses, HF import / export
    ("dpbert.runtime",),     # the one training loop and what it runs on
    ("dpbert.privacy",),     # input-privacy mechanisms (dχ, OME, TextHide, attacks)
    ("dpbert.tasks",),       # tasks on the loop, with tasks/input_modes
    ("dpbert.leakage",),     # exposure and the audit (train, then measure)
    ("launch",),             # thin entry points
)
# Function-local imports of the project's own modules in dpbert/ and data_pipelines/: they hide
# the import graph. The budget is what the code has; it may only go down (launchers are not
# counted: they import the library inside main() so that --help is instant).
LOCAL_IMPORT_BUDGET = 30
MAX_LIBRARY_LINES = 600
MAX_LAUNCHER_LINES = 100

# Leaf modules the DP engine may use: they import nothing from dpbert themselves.
LEAVES = ("dpbert.errors", "dpbert.prng")
# The low layer of typed privacy concepts: dpbert and data_pipelines may both import it.
CORE = "dpbert.core"
HOST_SIDE = ("sampling", "accounting", "accountants", "calibration", "ledger", "noise_modes",
             "randomness", "plan")


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for top in PROJECT for p in sorted((ROOT / top).rglob("*.py"))}


def _rel(module: str) -> str:
    return str(MODULES[module].relative_to(ROOT))


def _resolve(name: str) -> str | None:
    """The project module that importing `name` loads (its longest prefix that is a module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


@dataclasses.dataclass(frozen=True)
class Import:
    source: str      # the importing module
    target: str      # the project module imported
    line: int
    local: bool      # inside a function
    at_import: bool  # runs when the module is imported (not under TYPE_CHECKING / __main__)

    def where(self) -> str:
        return f"{_rel(self.source)}:{self.line} imports {self.target}"


def _guard(node: ast.If) -> bool:
    """`if TYPE_CHECKING:` or `if __name__ == "__main__":`: its body does not run on import."""
    test = node.test
    if isinstance(test, (ast.Name, ast.Attribute)):
        return (test.id if isinstance(test, ast.Name) else test.attr) == "TYPE_CHECKING"
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
            and test.left.id == "__name__")


def _project_imports(module: str) -> list[Import]:
    out = []

    def visit(node, local: bool, at_import: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                targets = [_resolve(alias.name) for alias in child.names]
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                targets = [_resolve(f"{child.module}.{alias.name}") for alias in child.names]
            else:
                targets = []
            out.extend(Import(module, t, child.lineno, local, at_import)
                       for t in dict.fromkeys(targets) if t and t != module)
            visit(child, local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                     ast.Lambda)),
                  at_import and not (isinstance(child, ast.If) and _guard(child)))

    visit(ast.parse(MODULES[module].read_text()), False, True)
    return out


IMPORTS = {m: _project_imports(m) for m in MODULES}


def _layer(module: str) -> int | None:
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or (prefix != "dpbert" and module.startswith(prefix + ".")):
                return i
    return None


def _layer_name(i: int) -> str:
    return " / ".join(p for p in LAYERS[i] if p != "dpbert")


# ------------------------------------------------------------------------------- layers

def test_every_library_and_launcher_module_has_a_layer():
    homeless = [_rel(m) for m in MODULES if not m.startswith("configs") and _layer(m) is None]
    assert not homeless, f"modules in no layer of LAYERS (add the package to it): {homeless}"


def test_modules_import_only_their_own_layer_or_lower_ones():
    order = " < ".join(_layer_name(i) for i in range(len(LAYERS)))
    upward = [f"{imp.where()} ({_layer_name(_layer(imp.target))}), above its layer "
              f"{_layer_name(_layer(imp.source))}"
              for m in MODULES if _layer(m) is not None for imp in IMPORTS[m]
              if _layer(imp.target) is not None and _layer(imp.target) > _layer(m)]
    assert not upward, f"imports against the layer order {order}:\n" + "\n".join(upward)


def test_configs_import_nothing_of_the_project():
    found = [imp.where() for m in MODULES if m.startswith("configs") for imp in IMPORTS[m]
             if not imp.target.startswith("configs")]
    assert not found, "configs/ are plain ml_collections:\n" + "\n".join(found)


def test_no_import_cycle():
    graph = {m: sorted({imp.target for imp in IMPORTS[m] if imp.at_import and not imp.local})
             for m in MODULES}
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def connect(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
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
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    lines = [f"{', '.join(_rel(m) for m in c)}: " + "; ".join(
        imp.where() for m in c for imp in IMPORTS[m]
        if imp.target in c and imp.at_import and not imp.local) for c in cycles]
    assert not cycles, "module-level import cycles:\n" + "\n".join(lines)


def test_function_local_imports_stay_within_their_budget():
    local = [imp.where() for m in MODULES if m.startswith(LIBRARY) for imp in IMPORTS[m]
             if imp.local]
    # One per import statement (`from a import b, c` of two modules counts once).
    statements = sorted(set(re.sub(r" imports .*", "", w) for w in local))
    assert len(statements) <= LOCAL_IMPORT_BUDGET, (
        f"{len(statements)} function-local imports of project modules (budget "
        f"{LOCAL_IMPORT_BUDGET}); import at the top of the module instead (a cycle means the "
        "code is in the wrong module):\n" + "\n".join(sorted(local)))


# ------------------------------------------------------------------------------- sizes

def _lines(path: pathlib.Path) -> int:
    return len(path.read_text().splitlines())


def test_no_library_module_is_over_600_lines():
    long = [f"{_rel(m)}: {_lines(p)} lines" for m, p in MODULES.items()
            if m.startswith(LIBRARY) and _lines(p) > MAX_LIBRARY_LINES]
    assert not long, (f"library modules over {MAX_LIBRARY_LINES} lines (split along a seam): "
                      f"{long}")


def test_launchers_are_at_most_100_lines():
    long = [f"{_rel(m)}: {_lines(p)} lines" for m, p in MODULES.items()
            if m.startswith("launch") and _lines(p) > MAX_LAUNCHER_LINES]
    assert not long, (f"launchers over {MAX_LAUNCHER_LINES} lines (move the logic into the "
                      f"library): {long}")


# ------------------------------------------------------------------------------- the map

def _sections(text: str) -> dict[str, str]:
    """{package named in backticks in a heading: the text of that section}."""
    out = collections.defaultdict(str)
    names: list[str] = []
    for line in text.splitlines():
        if line.startswith("#"):
            names = re.findall(r"`([\w.]+)`", line)
        for name in names:
            out[name] += line + "\n"
    return out


def test_the_architecture_doc_names_every_module_in_its_package_section():
    sections = _sections(DOC.read_text())
    missing = []
    for m, path in MODULES.items():
        if not m.startswith(LIBRARY) or path.name == "__init__.py":
            continue
        package = m.rpartition(".")[0]
        if not re.search(rf"(?<![\w.]){re.escape(path.stem)}\.py\b", sections.get(package, "")):
            missing.append(f"{_rel(m)} (in the section headed `{package}`)")
    assert not missing, f"{DOC.relative_to(ROOT)} does not name: {missing}"


def test_the_architecture_doc_states_the_enforced_layer_order():
    text = " ".join(DOC.read_text().split())  # lines may wrap
    order = " < ".join(" / ".join(f"`{p}`" for p in layer if p != "dpbert") for layer in LAYERS)
    assert order in text, f"{DOC.relative_to(ROOT)} does not state the layer order: {order}"


# ------------------------------------------------------------------------------- the DP engine

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
