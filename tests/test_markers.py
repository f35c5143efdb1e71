"""The test markers (setup.cfg: slow, sim, cuda, subprocess) are on the tests that need them, so that the quick loop
``python -m pytest -m "not slow and not sim and not subprocess"`` leaves out every test that starts a process."""

import ast
import configparser
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
TESTS = sorted((ROOT / "tests").glob("test_*.py"))
# Names whose use in a test (or in a helper or fixture of its file it calls) means a new process.
PROCESS_NAMES = {"subprocess", "Popen", "fork", "get_context", "multiprocessing"}


def registered_markers():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    section = config["tool:pytest"]
    assert "--strict-markers" in section["addopts"]
    return {line.split(":")[0].strip() for line in section["markers"].strip().splitlines()}


def _marks(node):
    """The pytest.mark.<name> decorators of a function, and the module's pytestmark."""
    names = set()
    for deco in node.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Attribute) \
                and target.value.attr == "mark":
            names.add(target.attr)
    return names


def _module_marks(tree):
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            return {n.attr for n in ast.walk(node.value) if isinstance(n, ast.Attribute) and n.attr != "mark"}
    return set()


def _starts_a_process(node, functions, seen=()):
    used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    used |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
    if used & PROCESS_NAMES:
        return True
    arguments = {a.arg for a in node.args.args} if isinstance(node, ast.FunctionDef) else set()
    if "workers" in arguments:  # tests/subprocess_workers.py: a report of a worker subprocess
        return True
    return any(_starts_a_process(functions[name], functions, seen + (name,))
               for name in (used | arguments) & set(functions) if name not in seen and len(seen) < 3)


def collected_tests():
    """[(file, test name, its markers, whether it starts a process)]."""
    rows = []
    for path in TESTS:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        functions = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        module = _module_marks(tree)
        for name, node in functions.items():
            if name.startswith("test_"):
                rows.append((path.name, name, _marks(node) | module, _starts_a_process(node, functions, (name,))))
    return rows


def test_the_four_markers_are_registered():
    assert registered_markers() >= {"slow", "sim", "cuda", "subprocess"}


def test_every_test_that_starts_a_process_is_marked_subprocess():
    unmarked = [f"{file}::{name}" for file, name, marks, process in collected_tests() if process
                and "subprocess" not in marks]
    assert not unmarked, unmarked


def _switches_on_the_simulator(node):
    """The test itself sets NUMBA_ENABLE_CUDASIM (a string or a keyword argument of that name)."""
    return any(isinstance(n, ast.Constant) and n.value == "NUMBA_ENABLE_CUDASIM" or
               isinstance(n, ast.keyword) and n.arg == "NUMBA_ENABLE_CUDASIM" for n in ast.walk(node))


def test_simulator_tests_are_marked_sim():
    rows = collected_tests()
    simulated = {f"{file}::{name}" for file, name, marks, _ in rows if "sim" in marks}
    assert {file for file, _, marks, _ in rows if "sim" in marks} >= {
        "test_cuda_sim.py", "test_native_sim.py", "test_blackwell_cuda_sim.py"}
    assert all("subprocess" in marks for _, _, marks, _ in rows if "sim" in marks)
    for path in TESTS:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_") and _switches_on_the_simulator(node):
                assert f"{path.name}::{node.name}" in simulated, f"{path.name}::{node.name} runs the simulator"


def test_the_scanner_sees_a_process():
    tree = ast.parse("import subprocess\ndef helper():\n    subprocess.run(['x'])\ndef test_a():\n    helper()\n"
                     "def test_b(workers):\n    pass\ndef test_c():\n    pass\n")
    functions = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert [_starts_a_process(functions[t], functions, (t,)) for t in ("test_a", "test_b", "test_c")] == \
        [True, True, False]
