"""Entry points of the CUDA kernels: torch CUDA tensors in and out (the library path), numpy in and out (tests and
the simulator).

Torch path: no copy of the operands leaves the device. The FP8 codes are viewed as uint8, decoded by torch
indexing of the format tables (kept on the device), handed to the kernels through ``__cuda_array_interface__``
(:func:`numba.cuda.as_cuda_array`, no synchronisation) and every kernel is launched on torch's current stream of
the tensors' device, so the work is ordered with the caller's torch work and torch's caching allocator may
reuse the temporaries safely.
"""

from __future__ import annotations

import numpy as np

from ... import formats
from ...arith.epilogue import OUT_CODES
from ...arith.params import codes_gemm, preset_params, schedule_params
from ...formats import dtype_name
from . import launch
from ..catalog import CODES_KERNELS

# Output dtype name -> (bit width, signed integer view used by the kernel).
OUT_WIDTH = {"float32": 32, "bfloat16": 16, "float16": 16, "float8_e4m3fn": 8, "float8_e5m2": 8}
_NP_VIEW = {32: np.int32, 16: np.int16, 8: np.int8}

_DEVICE_TABLES = {}


def _cuda():
    from numba import cuda

    return cuda


# ----------------------------------------------------------------------------------------------------------------
# torch


def _torch_tables(device, fmt):
    """(significands int8, exponents int16, values float64, non-finite uint8) of a format, on ``device``."""
    import torch

    key = (str(device), fmt)
    tables = _DEVICE_TABLES.get(key)
    if tables is None:
        tables = (
            torch.from_numpy(np.array(formats.significands(fmt))).to(device),
            torch.from_numpy(np.array(formats.exponents(fmt))).to(device),
            torch.from_numpy(np.array(formats.values(fmt))).to(device),
            torch.from_numpy(np.array(formats.nonfinite_codes(fmt), dtype=np.uint8)).to(device),
        )
        _DEVICE_TABLES[key] = tables
    return tables


def _device_index(device) -> int:
    import torch

    device = torch.device(device)
    return device.index if device.index is not None else torch.cuda.current_device()


class _OnDevice:
    """Make ``device`` current for torch and numba, and give torch's current stream as a numba stream."""

    def __init__(self, device):
        import torch

        self.index = _device_index(device)
        self.torch_device = torch.device("cuda", self.index)
        self._torch_ctx = torch.cuda.device(self.index)
        self._numba_ctx = _cuda().gpus[self.index]

    def __enter__(self):
        import torch

        self._torch_ctx.__enter__()
        self._numba_ctx.__enter__()
        handle = torch.cuda.current_stream(self.torch_device).cuda_stream
        # torch's default stream is the legacy default stream (handle 0), which is numba's default stream too.
        self.stream = _cuda().default_stream() if handle == 0 else _cuda().external_stream(handle)
        return self

    def __exit__(self, *exc):
        self._numba_ctx.__exit__(*exc)
        self._torch_ctx.__exit__(*exc)
        return False


def _nb(tensor):
    """A numba device array over a torch CUDA tensor's memory (no copy, no synchronisation)."""
    return _cuda().as_cuda_array(tensor, sync=False)


def decode_tensor(codes, fmt):
    """Decoded significands (int8) and exponents (int16) and the per-row non-finite flags (uint8) of uint8 codes."""
    sig, exp, _, nonfinite = _torch_tables(codes.device, fmt)
    import torch

    index = codes.to(torch.int32)
    flags = nonfinite[index].amax(dim=1) if codes.shape[1] else torch.zeros(codes.shape[0], dtype=torch.uint8,
                                                                                device=codes.device)
    return sig[index], exp[index], flags.contiguous()


def _nonfinite_flags(codes, fmt):
    """Per-row non-finite flags (uint8) of uint8 codes on the device (what decode_tensor returns as flags)."""
    import torch

    nonfinite = _torch_tables(codes.device, fmt)[3]
    if not codes.shape[1]:
        return torch.zeros(codes.shape[0], dtype=torch.uint8, device=codes.device)
    return nonfinite[codes.to(torch.int32)].amax(dim=1).contiguous()


def accumulate_tensors(kernel, a, b_rows, fmt_a, fmt_b, preset, use_fast_accum, splits=1, scheme="none"):
    """fp32 accumulators [M, N] (a CUDA tensor) of a [M, K] times b_rows [N, K]^T, FP8 CUDA tensors."""
    import torch

    M, K = a.shape
    N = b_rows.shape[0]
    schedule = schedule_params(preset, K, use_fast_accum, splits, scheme)
    params = preset_params(preset, fmt_a, fmt_b)
    with _OnDevice(a.device) as on:
        out = torch.zeros((M, N), dtype=torch.float32, device=on.torch_device)
        if M == 0 or N == 0 or K == 0:
            return out
        a_codes = a.detach().contiguous().view(torch.uint8)
        b_codes = b_rows.detach().contiguous().view(torch.uint8)
        if kernel in CODES_KERNELS:  # decodes the codes itself
            a_flags = _nonfinite_flags(a_codes, fmt_a)
            b_flags = _nonfinite_flags(b_codes, fmt_b)
            work = []  # torch's caching allocator, stream-ordered; kept alive until every launch is queued

            def alloc(shape, dtype):
                work.append(torch.empty(shape, dtype=getattr(torch, np.dtype(dtype).name), device=on.torch_device))
                return _nb(work[-1])

            launch.launch_codes(kernel, _nb(a_codes), _nb(b_codes), fmt_a, fmt_b, schedule, params, _nb(out),
                                 on.stream, alloc=alloc)
        else:
            sa, ea, a_flags = decode_tensor(a_codes, fmt_a)
            sb, eb, b_flags = decode_tensor(b_codes, fmt_b)
            launch.launch_gemm(kernel, _nb(sa), _nb(ea), _nb(sb), _nb(eb), schedule, params, _nb(out), on.stream)
        a_values = _torch_tables(on.torch_device, fmt_a)[2]
        b_values = _torch_tables(on.torch_device, fmt_b)[2]
        launch.launch_override(_nb(a_codes), _nb(a_flags), _nb(a_values), _nb(b_codes), _nb(b_flags),
                                _nb(b_values), _nb(out.view(torch.int32)), on.stream)
    return out


def epilogue_tensors(acc, scale_a, scale_b, scale_result, out_dtype):
    """Output tensor (dtype out_dtype, on acc's device) of the scaled_mm epilogue of fp32 accumulators ``acc``.

    The scales are one-element fp32 CUDA tensors on the same device; their bits are read by the kernel, so nothing
    is synchronised or copied to the host.
    """
    import torch

    name = dtype_name(out_dtype)
    width = OUT_WIDTH[name]
    view = {32: torch.int32, 16: torch.int16, 8: torch.int8}[width]
    with _OnDevice(acc.device) as on:
        scales = [scale_a, scale_b, scale_result if scale_result is not None else scale_a]
        bits = torch.stack([s.detach().reshape(()).to(device=on.torch_device, dtype=torch.float32)
                            for s in scales]).view(torch.int32).contiguous()
        result = torch.empty(acc.shape, dtype=out_dtype, device=on.torch_device)
        flat = acc.detach().contiguous().reshape(-1)
        launch.launch_epilogue(_nb(flat), _nb(bits), scale_result is not None, OUT_CODES[name], width,
                                _nb(result.view(view).reshape(-1)), on.stream)
    return result


def rowwise_epilogue_tensors(acc, scale_a, scale_b, bias, x_first):
    """bf16 tensor (on acc's device) of torch's row-wise epilogue of fp32 accumulators ``acc`` [M, N]; scale_a
    [M, 1], scale_b [1, N] fp32 and bias [N] bf16 (or None) on the same device, read as bits by the kernel."""
    import torch

    with _OnDevice(acc.device) as on:
        def bits(t, dtype, view):
            return t.detach().reshape(-1).to(device=on.torch_device, dtype=dtype).contiguous().view(view)

        x_bits = bits(scale_a, torch.float32, torch.int32)
        w_bits = bits(scale_b, torch.float32, torch.int32)
        b_bits = bits(bias, torch.bfloat16, torch.int16) if bias is not None else torch.zeros(1, dtype=torch.int16,
                                                                                               device=on.torch_device)
        result = torch.empty(acc.shape, dtype=torch.bfloat16, device=on.torch_device)
        launch.launch_rowwise_epilogue(_nb(acc.detach().contiguous()), _nb(x_bits), _nb(w_bits), _nb(b_bits),
                                       bias is not None, x_first, _nb(result.view(torch.int16)), on.stream)
    return result


# ----------------------------------------------------------------------------------------------------------------
# numpy (numba device arrays; runs on a device or under the simulator)


def accumulate_numpy(kernel, a_codes, b_codes, fmt_a, fmt_b, preset, use_fast_accum, splits=1, scheme="none"):
    """Like :func:`mmaemu.cpu.accumulate_codes`, computed by a CUDA kernel (operands decoded on the host)."""
    cuda = _cuda()
    gemm = codes_gemm(a_codes, b_codes, fmt_a, fmt_b, preset, use_fast_accum, splits, scheme)
    a_codes, b_codes, schedule, params = gemm.a_codes, gemm.b_codes, gemm.schedule, gemm.params
    out = np.zeros(gemm.shape[:2], np.float32)
    if gemm.empty:
        return out
    d_out = cuda.to_device(out)
    if kernel in CODES_KERNELS:
        launch.launch_codes(kernel, cuda.to_device(a_codes), cuda.to_device(b_codes), fmt_a, fmt_b, schedule, params,
                             d_out)
    else:
        sig_a, exp_a = formats.significands(fmt_a)[a_codes], formats.exponents(fmt_a)[a_codes]
        sig_b, exp_b = formats.significands(fmt_b)[b_codes], formats.exponents(fmt_b)[b_codes]
        launch.launch_gemm(kernel, cuda.to_device(sig_a), cuda.to_device(exp_a), cuda.to_device(sig_b),
                            cuda.to_device(exp_b), schedule, params, d_out)
    a_flags = formats.nonfinite_mask(a_codes, fmt_a).any(axis=1).astype(np.uint8)
    b_flags = formats.nonfinite_mask(b_codes, fmt_b).any(axis=1).astype(np.uint8)
    bits = d_out.view(np.int32) if hasattr(d_out, "view") else d_out
    launch.launch_override(cuda.to_device(a_codes), cuda.to_device(a_flags),
                            cuda.to_device(np.array(formats.values(fmt_a))), cuda.to_device(b_codes),
                            cuda.to_device(b_flags), cuda.to_device(np.array(formats.values(fmt_b))), bits)
    return d_out.copy_to_host()


def epilogue_numpy(acc, scale_a_bits, scale_b_bits, scale_result_bits, out_dtype_name):
    """Like :func:`mmaemu.cpu.epilogue_codes` (same arguments and result), computed by the CUDA epilogue kernel."""
    cuda = _cuda()
    acc = np.ascontiguousarray(acc, dtype=np.float32)
    width = OUT_WIDTH[out_dtype_name]
    has_sr = scale_result_bits is not None
    bits = np.array([scale_a_bits, scale_b_bits, scale_result_bits if has_sr else 0], dtype=np.uint32)
    out = cuda.to_device(np.zeros(acc.size, _NP_VIEW[width]))
    launch.launch_epilogue(cuda.to_device(acc.reshape(-1)), cuda.to_device(bits.view(np.int32)), has_sr,
                            OUT_CODES[out_dtype_name], width, out)
    unsigned = {32: np.uint32, 16: np.uint16, 8: np.uint8}[width]
    return out.copy_to_host().view(unsigned).reshape(acc.shape)


def rowwise_epilogue_numpy(acc, x_scale_bits, w_scale_bits, bias_bits, x_first):
    """Like :func:`mmaemu.cpu.rowwise_epilogue_codes` (same arguments and result), computed by the CUDA kernel."""
    cuda = _cuda()
    acc = np.ascontiguousarray(acc, dtype=np.float32)
    has_bias = bias_bits is not None
    bias = np.ascontiguousarray(bias_bits if has_bias else np.zeros(1, np.uint16), dtype=np.uint16).view(np.int16)
    out = cuda.to_device(np.zeros(acc.shape, np.int16))
    launch.launch_rowwise_epilogue(cuda.to_device(acc), cuda.to_device(np.ascontiguousarray(x_scale_bits, np.uint32)
                                                                        .view(np.int32)),
                                   cuda.to_device(np.ascontiguousarray(w_scale_bits, np.uint32).view(np.int32)),
                                   cuda.to_device(bias), has_bias, x_first, out)
    return out.copy_to_host().view(np.uint16)
