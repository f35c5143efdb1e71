"""mmaemu inside torch.distributed: a small tensor-parallel FP8 linear layer on two CPU processes (gloo), each
computing its ``torch._scaled_mm`` under ``mmaemu.patch``, gives the single-process result bit for bit.

The layer is sequence- and column-parallel, as Megatron/Transformer Engine shard it: every rank holds a slice of
the tokens and a slice of the weight's output rows; the FP8 input scale comes from the amax reduced over the ranks
(TE's ``reduce_amax``), the quantised input is all-gathered, each rank multiplies it with its weight shard, and the
output columns are all-gathered. Both ways state ``splitk=1``: a shard has another N than the whole weight, and
cuBLASLt's split decision depends on N, on the GPU as here.
"""

import subprocess
import sys

import pytest
import torch

import mmaemu
from mmaemu.testing import assert_bitwise_equal

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with the gloo backend is not available", allow_module_level=True)

WORLD = 2
SETTINGS = dict(profile="hopper", splitk=1)

LAYER = r'''
import torch
import mmaemu
from mmaemu.quantize import quantize, scale_from_amax, scale_inv, compute_amax


def operands():
    """The layer's input (16 tokens x 64 features, bf16) and FP8 weight [64 out, 64 in] with its inverse scale."""
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(16, 64, generator=g) * torch.exp2(torch.randint(-4, 4, (16, 64), generator=g).float()))
    w = (torch.randn(64, 64, generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn)
    return x.to(torch.bfloat16), w, torch.tensor(2.0 ** -5)


def fp8_linear(x8, x_scale_inv, w_rows, w_scale_inv):
    """The GEMM as an FP8 layer calls it: torch._scaled_mm (computed by mmaemu inside a patch block)."""
    return torch._scaled_mm(x8, w_rows.t(), x_scale_inv, w_scale_inv, out_dtype=torch.bfloat16,
                            use_fast_accum=True)


def input_scale(amax):
    return scale_from_amax(amax, "e4m3", recipe="current")
'''

WORKER = LAYER + r'''
import sys
import torch.distributed as dist

rank, world, rendezvous, result = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", init_method="file://" + rendezvous, rank=rank, world_size=world)
x, w, w_scale_inv = operands()
x_local = x.chunk(world, dim=0)[rank]  # sequence parallel: this rank's tokens
w_local = w.chunk(world, dim=0)[rank]  # column parallel: this rank's output rows of the weight

amax = compute_amax(x_local)
dist.all_reduce(amax, op=dist.ReduceOp.MAX)  # one scale for the whole input (TE's reduce_amax)
scale = input_scale(amax)
x8_local = quantize(x_local, scale)
gathered = [torch.empty_like(x8_local.view(torch.uint8)) for _ in range(world)]
dist.all_gather(gathered, x8_local.view(torch.uint8))
x8 = torch.cat(gathered, dim=0).view(torch.float8_e4m3fn)

with mmaemu.patch(**SETTINGS) as log:
    y_local = fp8_linear(x8, scale_inv(scale), w_local, w_scale_inv)
columns = [torch.empty_like(y_local.view(torch.uint8)) for _ in range(world)]
dist.all_gather(columns, y_local.view(torch.uint8).contiguous())
y = torch.cat(columns, dim=1).view(torch.bfloat16)  # byte columns of bf16 pairs: the shards side by side
if rank == 0:
    torch.save({"y": y, "calls": [(r.profile, r.S, r.input_shape, r.mat2_shape) for r in log]}, result)
dist.barrier()
dist.destroy_process_group()
'''


def single_process():
    namespace = {}
    exec(LAYER, namespace)
    x, w, w_scale_inv = namespace["operands"]()
    scale = namespace["input_scale"](namespace["compute_amax"](x))
    with mmaemu.patch(**SETTINGS):
        return namespace["fp8_linear"](namespace["quantize"](x, scale), namespace["scale_inv"](scale), w,
                                       w_scale_inv)


@pytest.mark.subprocess
def test_tensor_parallel_fp8_linear_matches_one_process(tmp_path):
    code = f"SETTINGS = {SETTINGS!r}\n" + WORKER
    result = tmp_path / "y.pt"
    workers = [subprocess.Popen([sys.executable, "-c", code, str(rank), str(WORLD), str(tmp_path / "rendezvous"),
                                 str(result)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for rank in range(WORLD)]
    try:
        outputs = [w.communicate(timeout=180) for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
    for w, (_, err) in zip(workers, outputs):
        assert w.returncode == 0, err[-3000:]
    saved = torch.load(result)
    assert saved["calls"] == [("hopper", 1, (16, 64), (64, 32))]  # rank 0's shard: N = 64 / 2
    expected = single_process()
    assert expected.shape == (16, 64) and expected.dtype == torch.bfloat16
    assert_bitwise_equal(saved["y"], expected)
