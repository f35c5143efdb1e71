"""Run a torch expression on the CPU with the CUDA kernel's bits for ``tensor / python_number``.

torch's CUDA ``div_true_kernel_cuda`` (pytorch/pytorch ``aten/src/ATen/native/cuda/BinaryDivTrueKernel.cu`` at
commit 0f57f050df0e969d03e76495ace7ea90ba2b05d8, the ``iter.is_cpu_scalar(2)`` branch) computes
``inv_b = opmath(1) / b`` once, then ``a * inv_b`` in opmath (fp32 for fp32, bf16 and fp16 tensors), rounded to
the tensor's dtype. Under :class:`CudaScalarDivision` every true division of a floating tensor by a Python number
is computed that way, so that DeepGEMM's and torchao's own source, run on the CPU, gives the bits it gives on the
GPU. Written for the tests from the kernel's source; it shares no code with mmaemu.
"""

import numbers

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

_DIVISIONS = {torch.Tensor.div, torch.Tensor.__truediv__, torch.div, torch.true_divide, torch.divide,
              torch.Tensor.true_divide, torch.Tensor.divide}
_OPMATH_FP32 = (torch.float32, torch.bfloat16, torch.float16)


def cuda_inverse(number) -> float:
    """The fp32 multiplier ``1.0f / float(number)`` that the kernel computes on the host, as a Python float."""
    return float(np.float32(1.0) / np.float32(number))


class CudaScalarDivision(TorchFunctionMode):
    """Inside ``with CudaScalarDivision():``, ``t / number`` of an fp32/bf16/fp16 tensor is the CUDA kernel's
    ``t * (1.0f / number)`` (one fp32 multiplication, then the tensor's dtype). Counts the divisions it replaced."""

    def __init__(self):
        super().__init__()
        self.replaced = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _DIVISIONS and len(args) == 2 and not kwargs.get("rounding_mode") and \
                isinstance(args[0], torch.Tensor) and args[0].dtype in _OPMATH_FP32 and \
                isinstance(args[1], numbers.Real) and not isinstance(args[1], bool):
            self.replaced += 1
            tensor = args[0]
            return (tensor.to(torch.float32) * cuda_inverse(args[1])).to(tensor.dtype)
        return func(*args, **kwargs)
