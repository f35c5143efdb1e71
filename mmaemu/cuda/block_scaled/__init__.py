"""The block-scaled (MXFP8, NVFP4) reference kernels on CUDA, ``cuda:simple``'s only: :mod:`.kernel`.

Importing this package imports nothing; its modules import ``numba.cuda``.
"""
