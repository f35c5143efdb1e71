"""A fake recording machine for ``mmaemu record`` tests without a GPU.

Its cuBLASLt (tests/fake_cublaslt.py) answers with :func:`decide`, a made-up split rule; its descriptor probe
writes the cuBLASLt trace lines a real torch._scaled_mm would log for the probe calls; its "GPU" GEMM is mmaemu's
own CPU emulation of the decision it made (hopper preset, contiguous splits), optionally corrupted.
"""

import numpy as np

from mmaemu.platform.heuristic import build_query
from mmaemu.record.machine import Machine
from mmaemu.record.probe import probe_calls
from mmaemu.record.replay import mmaemu_emulation
from mmaemu.record.trace import ProbeCall, parse_matmul_trace

from fake_cublaslt import config, fake_api

MiB = 1 << 20
TORCH_WS = MiB
TE_WS = 32 * MiB
PLATFORM = {"gpu": "NVIDIA Fake H200", "sm_count": 132, "capability": [9, 0], "driver": "999.1",
            "cublaslt": "12.9.9.9", "torch": "2.99.0+fake"}
_TYPE_FMT = {"CUDA_R_8F_E4M3": "e4m3", "CUDA_R_8F_E5M2": "e5m2"}
_OUT_OF = {"CUDA_R_32F": "float32", "CUDA_R_16BF": "bfloat16", "CUDA_R_16F": "float16",
           "CUDA_R_8F_E4M3": "float8_e4m3fn", "CUDA_R_8F_E5M2": "float8_e5m2"}
_TILES = {20: "TILE_64x64", 209: "TILE_128x128"}


def decide(M, N, K, fa, fb, out, fast, ws):
    """(status, config): E4M3 x E4M3 -> E5M2 refused (15), and float16 fast with M = 2; split only with a
    workspace, small M*N, K >= 2048."""
    if fa == fb == "e4m3" and out == "float8_e5m2" or (M == 2 and out == "float16" and fast):
        return 15, None  # the first as on every recorded GPU, the second to exercise dropped rows
    if ws == 0 or M * N > 4096 or K < 2048:
        return 0, config(splitK=1, custom=4, tile=209)
    return 0, config(splitK=2 if K < 8192 else 3, custom=1 if fast else 0, tile=20)


def key_of(problem):
    """The (M, N, K, fa, fb, out, fast, ws) a fake-bindings problem asks (torch's layout, see build_query)."""
    (ta, K, N, _), (tb, _, M, _), d = problem["a"], problem["b"], problem["d"]
    return M, N, K, _TYPE_FMT[tb], _TYPE_FMT[ta], _OUT_OF[d[0]], bool(problem["FAST_ACCUM"]), \
        problem["pref"]["MAX_WORKSPACE_BYTES"]


def answer(problem):
    return decide(*key_of(problem))


def torch_refuses(fa, fb, out):
    if fa == fb == "e5m2":
        return "ValueError: Multiplication of two Float8_e5m2 matrices is not supported"
    if fa == fb == "e4m3" and out == "float8_e5m2":
        return "RuntimeError: CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmulAlgoGetHeuristic"
    return None


def trace_line(call, ws=TORCH_WS, extra="", custom_delta=0):
    """The cuBLASLt trace line of a probe call as the fake GPU runs it."""
    q = build_query(call.M, call.N, call.K, call.fa, call.fb, call.out, call.fast, ws, None)
    cfg = decide(call.M, call.N, call.K, call.fa, call.fb, call.out, call.fast, ws)[1]
    layouts = " ".join(f"{n}=0X1 {n}desc=[type={x.dtype[5:]} rows={x.rows} cols={x.cols} ld={x.ld}]"
                       for n, x in zip("ABCD", (q.a, q.b, q.c, q.d)))
    fast = " fastAccumulationMode=1" if call.fast else ""
    split = f" splitK={cfg['splitK']} reductionScheme=COMPUTE_TYPE" if cfg["splitK"] > 1 else ""
    return (f"[2026-12-01 10:00:00][cublasLt][4242][Trace][cublasLtMatmul] {layouts} computeDesc=[computeType="
            f"COMPUTE_32F scaleType=R_32F transa=OP_T aScalePointer=0x7f00 bScalePointer=0x7f04{fast}{extra}] "
            f"algo=[algoId={cfg['algo']} tile=MATMUL_{_TILES[cfg['tile']]} stages=MATMUL_STAGES_128xAUTO "
            f"customOption={cfg['custom'] + custom_delta}{split}] workSpace=0X7F00 workSpaceSizeInBytes={ws} beta=0 "
            f"outOfPlace=1 stream=0X0")


def probe(**kwargs):
    calls = [ProbeCall(c.M, c.N, c.K, c.fa, c.fb, c.out, c.fast, torch_refuses(c.fa, c.fb, c.out))
             for c in probe_calls()]
    text = "\n".join(["[2026-12-01 10:00:00][cublasLt][4242][Info][cublasLtCreate] ok"]
                     + [trace_line(c, **kwargs) for c in calls if c.error is None])
    return calls, parse_matmul_trace(text), text


def emulating_gpu(corrupt=None):
    """A "GPU" computing mmaemu's emulation of its own decision; ``corrupt(case)`` True flips one output bit."""
    emulate = mmaemu_emulation("hopper", PLATFORM["capability"])

    def run(case, a, b, scale_a, scale_b):
        S = decide(case.M, case.N, case.K, case.fa, case.fb, case.out, case.fast, case.ws)[1]["splitK"]
        out = emulate(case, a, b, scale_a, scale_b, 1 if S == 1 else (S, "contiguous"))
        if corrupt is not None and corrupt(case):
            out = out.copy()
            out.flat[0] ^= 1
        return out

    return run


def fake_machine(answer_fn=answer, probe_fn=probe, gpu_gemm=None, **platform):
    return Machine(dict(PLATFORM, **platform), fake_api(answer_fn), 0x7F00, probe_fn,
                   gpu_gemm if gpu_gemm is not None else emulating_gpu(), (TE_WS, "fake TE rule"), "cuda:0")


def counting(answer_fn, stop_after=None):
    """An answer function that counts its calls and raises KeyboardInterrupt after ``stop_after`` of them."""
    state = {"calls": 0}

    def run(problem):
        state["calls"] += 1
        if stop_after is not None and state["calls"] > stop_after:
            raise KeyboardInterrupt("simulated interruption")
        return answer_fn(problem)

    return run, state


def split_shapes():
    """A tiny grid with split and unsplit shapes (M*N <= 4096 splits for K >= 2048)."""
    return np.array([(1, 16, 2048), (16, 64, 4096), (48, 64, 8192), (64, 128, 1024), (256, 256, 2048),
                     (2, 32, 16384)], dtype=np.int64)
