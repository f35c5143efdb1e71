"""The chunked (block-wise FP8) reference kernel on CUDA, ``cuda:simple``'s only: :mod:`.kernel`.

Importing this package imports nothing; its modules import ``numba.cuda``.
"""
