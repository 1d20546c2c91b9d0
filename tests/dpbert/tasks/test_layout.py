"""docs/architecture.md's rules for tasks and input modes, checked on the source (issue 30): the
runtime imports no task, the tasks' modules import each other without a cycle (and never at the
bottom of a module), input modes name no task, modules stay readable, and capabilities are the
only link between a task and a mode."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
TASKS = ROOT / "dpbert" / "tasks"
MAX_LINES = 600


def _module(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path) -> set[str]:
    """Every dpbert module `path` imports, at module level or inside a function."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                # `from pkg import module` imports the module; `from module import name` the module
                out.add(sub if (ROOT / (sub.replace(".", "/") + ".py")).is_file()
                        or (ROOT / sub.replace(".", "/")).is_dir() else node.module)
    return {m for m in out if m.startswith("dpbert")}


def _task_modules() -> list[pathlib.Path]:
    return sorted(TASKS.rglob("*.py"))


@pytest.mark.parametrize("path", sorted((ROOT / "dpbert" / "runtime").glob("*.py")),
                         ids=lambda p: p.name)
def test_the_runtime_imports_no_task(path):
    assert not {m for m in _imports(path) if m.startswith("dpbert.tasks")}


def test_the_task_modules_import_each_other_without_a_cycle():
    graph = {_module(p): {m for m in _imports(p) if m.startswith("dpbert.tasks")}
             for p in _task_modules()}
    done, path = set(), []

    def visit(node):
        if node in path:
            raise AssertionError(f"import cycle: {' -> '.join(path[path.index(node):] + [node])}")
        if node in done:
            return
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            visit(nxt)
        path.pop()
        done.add(node)

    for node in sorted(graph):
        visit(node)


@pytest.mark.parametrize("path", _task_modules(), ids=lambda p: str(p.relative_to(TASKS)))
def test_no_module_imports_after_its_code(path):
    """Imports at the top only: nothing imported at the bottom to close a loop."""
    body = ast.parse(path.read_text()).body
    first_code = next((i for i, node in enumerate(body) if isinstance(
        node, (ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign))), len(body))
    late = [node.lineno for node in body[first_code:]
            if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert not late, f"imports after the module's code at lines {late}"


@pytest.mark.parametrize("path", sorted((TASKS / "input_modes").glob("*.py")),
                         ids=lambda p: p.name)
def test_input_modes_name_no_task(path):
    tasks = {"dpbert.tasks.classification", "dpbert.tasks.ner", "dpbert.tasks.pretraining",
             "dpbert.tasks.finetuning", "dpbert.tasks"}
    assert not _imports(path) & tasks
    assert '"classification"' not in path.read_text() and '"ner"' not in path.read_text()


@pytest.mark.parametrize("path", [*_task_modules(), ROOT / "dpbert" / "runtime" / "loop.py"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_stay_readable(path):
    assert len(path.read_text().splitlines()) <= MAX_LINES


def test_tasks_declare_capabilities_and_modes_their_needs():
    from dpbert import tasks
    from dpbert.tasks import finetuning
    from dpbert.tasks.input_modes import base, registry

    fine_tuning = [tasks.get_task(n) for n in tasks.task_names()
                   if isinstance(tasks.get_task(n), finetuning.FineTuningTask)]
    assert {"classification", "ner"} <= {t.name for t in fine_tuning}
    for task in fine_tuning:
        assert set(task.capabilities) <= set(base.CAPABILITIES), task.name
        assert tasks.get_task(task.name) is task   # one object for every run
    for mode in registry.MODES.values():
        assert set(mode.needs) <= set(base.CAPABILITIES), mode.name
    # What the modes' task lists used to say, now derived from the declarations.
    offered = {t.name: {m.name for m in registry.MODES.values()
                        if set(m.needs) <= set(t.capabilities)} for t in fine_tuning}
    assert offered["classification"] == set(registry.names())
    assert {"none", "token_rep", "text_to_text"} <= offered["ner"]
    assert not {"seq_rep", "ome", "texthide"} & offered["ner"]
