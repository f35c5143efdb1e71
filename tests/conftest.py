import pathlib
import sys

import pytest

# Test helpers (oracle.py, vectors.py) live next to the tests.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
# The repository's developer tooling (tools/: offline PTX and SASS) is not installed with the package: found last,
# after whatever mmaemu the interpreter imports (``python -m pytest`` from the root puts the root first anyway).
sys.path.append(str(pathlib.Path(__file__).resolve().parent.parent))


def pytest_collection_modifyitems(config, items):
    """Skip the tests marked ``cuda`` where torch sees no CUDA device (asked only when such a test is collected)."""
    needing = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not needing:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marker cuda); torch sees none here")
    for item in needing:
        item.add_marker(skip)


@pytest.fixture
def fresh_warnings():
    """Free once-per-process warning slots (the one registry of mmaemu.warn) before and after the test: for tests
    that assert what the first call warns. A module whose every test needs them says so with
    ``pytestmark = pytest.mark.usefixtures("fresh_warnings")``."""
    from mmaemu import warn

    warn.reset()
    yield
    warn.reset()


@pytest.fixture
def fresh_dispatcher(monkeypatch, tmp_path):
    """The CUDA dispatcher without a past: no verdict, selection or probed device of earlier tests (before and
    after), no backend variable in the process environment, and a private cache folder for the verdicts."""
    import mmaemu.cuda as cuda_backend

    for name in ("MMAEMU_BACKEND", "MMAEMU_DISABLE_CUDA", "MMAEMU_TEST_FORCE_FAIL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MMAEMU_CACHE_DIR", str(tmp_path / "cache"))
    cuda_backend.reset()
    yield
    cuda_backend.reset()


# The external oracle: MMA-Sim (PyPI mmasim), an independent instruction model of NVIDIA tensor cores. Where it is
# missing the tests that use it skip, unless MMAEMU_TEST_REQUIRE_MMASIM=1 (.ci/run) makes that a failure.
REQUIRE_MMASIM_ENV = "MMAEMU_TEST_REQUIRE_MMASIM"


@pytest.fixture(scope="session")
def sim():
    """MMA-Sim's NVIDIA PTX models (``mmasim.nv_ptx.sim``), or a skip (a failure where required) that says why
    not."""
    import os
    import warnings

    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from mmasim.nv_ptx import sim as models
    except Exception as exc:  # not installed, or its C++ helper (built at import) cannot be compiled here
        reason = (f"MMA-Sim is not available ({type(exc).__name__}: {exc}); install it with "
                  f"`pip install mmasim torch=={torch.__version__.split('+')[0]}` to run the external oracle")
        if os.environ.get(REQUIRE_MMASIM_ENV) == "1":
            pytest.fail(f"{REQUIRE_MMASIM_ENV}=1 but {reason}")
        pytest.skip(reason)
    return models
