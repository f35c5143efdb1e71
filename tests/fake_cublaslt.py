"""A stand-in for NVIDIA's cuBLASLt bindings (nvmath.bindings.cublasLt and the enums it takes), for tests without
a GPU.

It keeps the bindings' calling convention: opaque integer handles, attribute values passed as (pointer, size) of
buffers typed by ``get_*_attribute_dtype``, results written through pointers. It reads what the code under test
wrote into those buffers and answers with a configuration chosen by a test function (``answer(problem)`` returns
``(status, config dict or None)``). Enum values are arbitrary here on purpose: the code must use the names.
"""

import ctypes
import enum

import numpy as np

from mmaemu.platform.heuristic import LtApi

DataType = enum.IntEnum("DataType", {"CUDA_R_32F": 100, "CUDA_R_16F": 102, "CUDA_R_16BF": 114,
                                     "CUDA_R_8F_E4M3": 128, "CUDA_R_8F_E5M2": 129})
ComputeType = enum.IntEnum("ComputeType", {"COMPUTE_32F": 168, "COMPUTE_16F": 164})
Operation = enum.IntEnum("Operation", {"N": 200, "T": 201})


class FakeLtError(Exception):
    def __init__(self, status):
        super().__init__(f"cuBLASLt status {status}")
        self.status = status


class FakeLt:
    """The subset of nvmath.bindings.cublasLt the heuristic query uses."""

    MatmulDescAttribute = enum.IntEnum("MatmulDescAttribute", {
        "TRANSA": 303, "TRANSB": 304, "A_SCALE_POINTER": 317, "B_SCALE_POINTER": 318, "FAST_ACCUM": 325})
    MatmulPreferenceAttribute = enum.IntEnum("MatmulPreferenceAttribute", {
        "MAX_WORKSPACE_BYTES": 401, "MIN_ALIGNMENT_A_BYTES": 405, "MIN_ALIGNMENT_B_BYTES": 406,
        "MIN_ALIGNMENT_C_BYTES": 407, "MIN_ALIGNMENT_D_BYTES": 408})
    MatmulAlgoConfigAttribute = enum.IntEnum("MatmulAlgoConfigAttribute", {
        "ID": 500, "TILE_ID": 501, "SPLITK_NUM": 502, "REDUCTION_SCHEME": 503, "CTA_SWIZZLING": 504,
        "CUSTOM_OPTION": 505, "STAGES_ID": 506})
    MatmulTile = enum.IntEnum("MatmulTile", {"TILE_UNDEFINED": 0, "TILE_64x64": 20, "TILE_128x128": 209})
    MatmulStages = enum.IntEnum("MatmulStages", {"STAGES_UNDEFINED": 0, "STAGES_128xAUTO": 36})
    ReductionScheme = enum.IntEnum("ReductionScheme", {"NONE": 0, "INPLACE": 1, "COMPUTE_TYPE": 2})
    matmul_heuristic_result_dtype = np.dtype([("algo", [("data_", "<u8", (8,))]), ("workspace_size", "<u8"),
                                              ("state", "<i4"), ("waves_count", "<f4"), ("reserved", "<i4", (4,))])
    _DESC_TYPES = {"TRANSA": np.int32, "TRANSB": np.int32, "A_SCALE_POINTER": np.int64,
                   "B_SCALE_POINTER": np.int64, "FAST_ACCUM": np.int8}
    _CONFIG_TYPES = {"ID": np.int32}

    def __init__(self, answer=None):
        self.answer = answer or (lambda problem: (0, dict(algo=66, tile=209, splitK=1, custom=0, stages=36,
                                                          reduction=0, swizzle=0)))
        self.objects = {}  # handle -> (kind, data)
        self.destroyed = []
        self.problems = []  # every problem the heuristic was asked, as a dict
        self._next = 0x1000
        self._configs = {}  # algo pointer -> config of the last answer written there

    # -- handles -------------------------------------------------------------------------------------------

    def _new(self, kind, data):
        self._next += 16
        self.objects[self._next] = (kind, data)
        return self._next

    def _destroy(self, handle):
        assert handle in self.objects and handle not in self.destroyed, "destroyed twice or never created"
        self.destroyed.append(handle)

    def create(self):
        return self._new("handle", None)

    destroy = matmul_desc_destroy = matmul_preference_destroy = matrix_layout_destroy = _destroy

    def live(self, kind):
        return [h for h, (k, _) in self.objects.items() if k == kind and h not in self.destroyed]

    # -- attribute types (as the vendor's get_*_attribute_dtype) -------------------------------------------------

    def get_matmul_desc_attribute_dtype(self, attr):
        return self._DESC_TYPES[self.MatmulDescAttribute(attr).name]

    def get_matmul_preference_attribute_dtype(self, attr):
        name = self.MatmulPreferenceAttribute(attr).name
        return np.uint64 if name == "MAX_WORKSPACE_BYTES" else np.uint32

    def get_matmul_algo_config_attribute_dtype(self, attr):
        return self._CONFIG_TYPES.get(self.MatmulAlgoConfigAttribute(attr).name, np.uint32)

    @staticmethod
    def _read(pointer, size, dtype):
        dtype = np.dtype(dtype)
        assert size == dtype.itemsize, f"buffer of {size} bytes for a {dtype} attribute"
        return np.frombuffer(ctypes.string_at(pointer, size), dtype=dtype)[0].item()

    # -- descriptors -------------------------------------------------------------------------------------------

    def matmul_desc_create(self, compute_type, scale_type):
        return self._new("desc", {"compute": ComputeType(compute_type).name, "scale": DataType(scale_type).name,
                                  "attrs": {}})

    def matmul_desc_set_attribute(self, desc, attr, buf, size):
        value = self._read(buf, size, self.get_matmul_desc_attribute_dtype(attr))
        name = self.MatmulDescAttribute(attr).name
        self.objects[desc][1]["attrs"][name] = Operation(value).name if name.startswith("TRANS") else value

    def matrix_layout_create(self, dtype, rows, cols, ld):
        return self._new("layout", (DataType(dtype).name, rows, cols, ld))

    def matmul_preference_create(self):
        return self._new("pref", {})

    def matmul_preference_set_attribute(self, pref, attr, buf, size):
        value = self._read(buf, size, self.get_matmul_preference_attribute_dtype(attr))
        self.objects[pref][1][self.MatmulPreferenceAttribute(attr).name] = value

    # -- the heuristic -------------------------------------------------------------------------------------------

    def MatmulHeuristicResult(self, size=1):
        return _Results(np.zeros(size, self.matmul_heuristic_result_dtype))

    def matmul_algo_get_heuristic(self, handle, desc, a, b, c, d, pref, count, results, returned):
        for h, kind in ((handle, "handle"), (desc, "desc"), (a, "layout"), (b, "layout"), (c, "layout"),
                        (d, "layout"), (pref, "pref")):
            assert self.objects[h][0] == kind and h not in self.destroyed, f"bad {kind} handle"
        desc_data = self.objects[desc][1]
        problem = {"compute": desc_data["compute"], "scale": desc_data["scale"], **desc_data["attrs"],
                   "a": self.objects[a][1], "b": self.objects[b][1], "c": self.objects[c][1],
                   "d": self.objects[d][1], "pref": dict(self.objects[pref][1]), "count": count}
        self.problems.append(problem)
        status, config = self.answer(problem)
        if status:
            raise FakeLtError(status)
        n = np.array([0 if config is None else 1], np.int32)
        ctypes.memmove(returned, n.ctypes.data, 4)
        if config is not None:
            self._configs[results] = config

    def matmul_algo_config_get_attribute(self, algo, attr, buf, size, written):
        name = self.MatmulAlgoConfigAttribute(attr).name
        field = {"ID": "algo", "TILE_ID": "tile", "SPLITK_NUM": "splitK", "REDUCTION_SCHEME": "reduction",
                 "CTA_SWIZZLING": "swizzle", "CUSTOM_OPTION": "custom", "STAGES_ID": "stages"}[name]
        value = np.array([self._configs[algo][field]], self.get_matmul_algo_config_attribute_dtype(attr))
        assert size == value.itemsize
        ctypes.memmove(buf, value.ctypes.data, size)
        ctypes.memmove(written, np.array([size], np.uint64).ctypes.data, 8)


class _Results:
    def __init__(self, array):
        self.array = array
        self.ptr = array.ctypes.data


def fake_api(answer=None) -> LtApi:
    return LtApi(FakeLt(answer), DataType, ComputeType, Operation, FakeLtError)


def config(splitK=1, custom=0, algo=66, tile=209, stages=36, reduction=None, swizzle=0):
    """A heuristic answer as the fake returns it (reduction defaults to 2, fp32 partials, when split)."""
    reduction = (2 if splitK > 1 else 0) if reduction is None else reduction
    return dict(algo=algo, tile=tile, splitK=splitK, custom=custom, stages=stages, reduction=reduction,
                swizzle=swizzle)
