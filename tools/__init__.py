"""Developer tooling of the repository, not part of the installed package: offline PTX and SASS of mmaemu's CUDA
kernels without a GPU (:mod:`.ptx_offline`, :mod:`.sass`), for ``scripts/sass_report.py`` and the CI checks of
``tests/test_cuda_sim.py`` and ``tests/test_native_sim.py``. Importable from the repository root (``python -m
pytest`` and the scripts put it on ``sys.path``).
"""
