"""The offset method's row tiles (mmaemu.cpu.offset_rows: one row of A times a packed panel of B, the kept call of
a decoding step) equal the reference engine bit for bit: the prototype's input families and the adversarial blocks
on every format pair, presets, fast and slow accumulation and split schedules, shapes with partial panels and K
past whole passes; every constant of the block step matters there too; the whole kept call (compare, NaN/Inf rule,
epilogue) equals the tile engine's; the plan takes it only where it may (AVX-512, not forced to the tile engine,
few rows)."""

import numpy as np
import pytest

from mmaemu.arith.offset import ADD_MAX, OffsetConstants, offset_params
from mmaemu.arith.params import Schedule, codes_gemm, preset_params
from mmaemu.cpu import accumulate_codes, epilogue_codes
from mmaemu.cpu.features import ROUNDING_EMBEDDED, ROUNDING_MXCSR
from mmaemu.cpu.fused import ROW_KERNEL_ROWS, TensorwiseGemm, row_tiles_fit
from mmaemu.cpu.prepared import PreparedStore
from mmaemu.cpu.selftest import adversarial_rows
from mmaemu.model.presets import ADA, HOPPER

from test_fast_path import PAIRS, cancelling_codes, random_codes, spread_codes
from test_fused import Identity, codes
from test_offset_engine import MUTATIONS, PROTOTYPE_FAMILIES, _bits, _mutation_operands, _prototype_family, needs_offset


def _row_accumulators(a, b, fmt_a, fmt_b, preset, fast, splits=1, scheme="none", constants=None):
    from mmaemu.cpu.offset_engine import packing_tables, prepare_b
    from mmaemu.cpu.offset_kernel import MASKS
    from mmaemu.cpu.offset_rows import row_accumulators
    from mmaemu.cpu.simd import call_restoring_mxcsr

    gemm = codes_gemm(a, b, fmt_a, fmt_b, preset, fast, splits, scheme)
    if constants is None:
        constants = offset_params(preset_params(preset, fmt_a, fmt_b), fmt_a, fmt_b, ADD_MAX)
    out = np.full(gemm.shape[:2], np.nan, np.float32)
    call_restoring_mxcsr(row_accumulators, gemm.a_codes, packing_tables(fmt_a), prepare_b(gemm.b_codes, fmt_b).operand,
                         gemm.shape[2], Schedule(*(int(v) for v in gemm.schedule)), constants, MASKS, out)
    return out


def _rows_agree(a, b, fmt_a, fmt_b, preset, fast, splits=1, scheme="none"):
    want = accumulate_codes(a, b, fmt_a, fmt_b, preset, fast, splits, scheme, reference=True)
    got = _row_accumulators(a, b, fmt_a, fmt_b, preset, fast, splits, scheme)
    finite = ~(np.isnan(want) | np.isinf(want))  # the NaN/Inf rule is applied after the accumulators (c.4)
    bad = np.argwhere(finite & (_bits(want) != _bits(got)))
    assert not len(bad), (f"{len(bad)} outputs differ ({preset.name} {fmt_a}x{fmt_b} fast={fast} S={splits} "
                          f"{scheme}, shape {a.shape} x {b.shape}); first at {tuple(bad[0])}")


@needs_offset
@pytest.mark.parametrize("fmt_a,fmt_b", PAIRS)
def test_prototype_families_on_row_tiles(fmt_a, fmt_b):
    """Every family of the offset prototype on one to five rows (a tile's rows 0-3 and the next tile's row 0),
    partial panels, one block, several and a K past whole passes."""
    rng = np.random.default_rng(abs(hash(("rows", fmt_a, fmt_b))) % 2**32)
    shapes = [(1, 1, 1), (1, 70, 33), (2, 130, 100), (3, 64, 577), (5, 65, 95), (1, 200, 1920)]
    for kind in PROTOTYPE_FAMILIES:
        for (M, N, K), (preset, fast) in zip(shapes, [(HOPPER, True), (ADA, False), (HOPPER, True), (ADA, True),
                                                       (HOPPER, False), (HOPPER, True)]):
            a = _prototype_family(kind, rng, fmt_a, (M, K))
            b = _prototype_family(kind, rng, fmt_b, (N, K), negative=True)
            _rows_agree(a, b, fmt_a, fmt_b, preset, fast)


@needs_offset
@pytest.mark.parametrize("fmt_a,fmt_b", PAIRS)
def test_adversarial_blocks_and_schedules_on_row_tiles(fmt_a, fmt_b):
    """The self-test's adversarial rows (one huge product among tiny ones, exact cancellation, subnormals), spread
    exponents and cancelling operands, zero rows, each row of A alone, under every split scheme."""
    rng = np.random.default_rng(11)
    K = 300
    b = np.concatenate([adversarial_rows(fmt_b, K), spread_codes(rng, fmt_b, (40, K)), random_codes(rng, fmt_b,
                                                                                                  (30, K)),
                        np.zeros((3, K), np.uint8)])
    rows = np.concatenate([adversarial_rows(fmt_a, K), spread_codes(rng, fmt_a, (2, K)),
                           cancelling_codes(rng, fmt_a, fmt_b, 2, 1, K)[0], np.zeros((1, K), np.uint8)])
    for m in range(rows.shape[0]):
        a = np.ascontiguousarray(rows[m:m + 1])
        for preset, fast in ((HOPPER, True), (ADA, False)):
            for k in (K, 33, 129):
                _rows_agree(np.ascontiguousarray(a[:, :k]), np.ascontiguousarray(b[:, :k]), fmt_a, fmt_b, preset,
                            fast)
    a = np.ascontiguousarray(rows[:2])
    _rows_agree(a, b, fmt_a, fmt_b, HOPPER, True, 3, "contiguous")
    _rows_agree(a, b, fmt_a, fmt_b, HOPPER, False, 5, "contiguous")
    _rows_agree(a, b, fmt_a, fmt_b, ADA, False, 5, "pairwise")
    _rows_agree(a, b, fmt_a, fmt_b, ADA, True, 24, "serial")  # splits made of padding tiles only


@needs_offset
@pytest.mark.parametrize("name,delta", MUTATIONS, ids=[f"{n}{d:+d}" for n, d in MUTATIONS])
def test_every_constant_matters_on_row_tiles(name, delta):
    """Each constant of offset_params moved changes some output of the adversarial families on row tiles (the same
    mutations as the 4-row tile's test), and the unchanged constants give the reference's bits."""
    from test_offset_engine import MIN_EXP_0

    a, b = _mutation_operands()
    preset = MIN_EXP_0 if name == "floor_bits" else HOPPER
    want = accumulate_codes(a, b, "e4m3", "e4m3", preset, True, reference=True)
    constants = list(offset_params(preset_params(preset, "e4m3", "e4m3"), "e4m3", "e4m3", ADD_MAX))
    i = OffsetConstants._fields.index(name)
    step = {"floor_bits": 1 << 23, "m_add": 1 << 23, "top4": 1, "mantissa": 1 << 21, "nfma": 16}.get(name, 1)
    constants[i] = int(np.array((constants[i] + delta * step) % 2**32, np.uint32).view(np.int32))
    got = _row_accumulators(a, b, "e4m3", "e4m3", preset, True, constants=OffsetConstants(*constants))
    assert not np.array_equal(_bits(got), _bits(want)), f"{name} {delta:+d} went unnoticed"
    assert np.array_equal(_bits(_row_accumulators(a, b, "e4m3", "e4m3", preset, True)), _bits(want))


@needs_offset
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("K", [64, 100])  # whole 8-byte words per row (the word pass), and not (the byte pass)
def test_codes_compared_and_nonfinite_rows_found_in_one_pass(fmt, K):
    from mmaemu.cpu.engine import NONFINITE_PATTERN, nonfinite_flags
    from mmaemu.cpu.offset_rows import same_codes_flags

    rng = np.random.default_rng(K)
    b = random_codes(rng, fmt, (40, K))
    specials = {"e4m3": [0x7F, 0xFF], "e5m2": [0x7C, 0xFC, 0x7D, 0xFE, 0x7F]}[fmt]
    for n, c in zip((0, 7, 8, 39, 20), specials + specials):
        b[n, (3 * n) % K] = c
    b[12, K - 1] = specials[-1]  # in the last byte of a row
    mask, pattern = NONFINITE_PATTERN[fmt]
    flags = np.zeros(40, np.bool_)
    kept = b.reshape(-1).copy()
    assert same_codes_flags(kept, b, mask, pattern, flags)
    assert np.array_equal(flags, nonfinite_flags(b, fmt)) and flags.sum() >= 5
    for n, k in ((0, 0), (39, K - 1), (17, K // 2)):
        changed = kept.copy()
        changed[n * K + k] ^= 0x10
        assert not same_codes_flags(changed, b, mask, pattern, np.zeros(40, np.bool_))


@needs_offset
@pytest.mark.parametrize("M", list(range(1, ROW_KERNEL_ROWS + 1)))
@pytest.mark.parametrize("preset,fast,out_name,fmt_b", [(HOPPER, True, "bfloat16", "e4m3"),
                                                        (ADA, False, "float32", "e5m2"),
                                                        (HOPPER, True, "float8_e4m3fn", "e4m3")])
@pytest.mark.parametrize("specials", [False, True])
def test_kept_call_on_row_tiles_gives_the_tile_engines_bits(M, preset, fast, out_name, fmt_b, specials):
    """The whole kept call (B seen, prepared, kept; then a code changed behind the version counter) on row tiles
    against accumulate_codes then epilogue_codes on the tile engine; NaN and Inf codes in A and B."""
    rng = np.random.default_rng(M + 17 * specials)
    N, K = 200, 96
    a, b = codes(rng, (M, K), specials), codes(rng, (N, K), specials)
    if specials:
        a[0, 5], b[3, 0], b[150, K - 1] = 0x7F, 0xFC if fmt_b == "e5m2" else 0xFF, 0x7F
    bits = (0x3F000000, 0x40400000, 0x3E800000)
    fp8_out = out_name.startswith("float8")

    def want():
        return epilogue_codes(accumulate_codes(a, b, "e4m3", fmt_b, preset, fast, cpu_engine="tile"), bits[0],
                              bits[1], bits[2] if fp8_out else None, out_name)

    gemm = TensorwiseGemm("tile", preset, "e4m3", fmt_b, M, N, K, fast, 1, "none", out_name, row_tiles=True)
    assert gemm.rows is not None
    scales = np.array([bits[0], bits[1], bits[2], fp8_out], np.int64)
    store, tensor = PreparedStore(), Identity(b)
    expected = want()
    for _ in range(3):  # seen (decoded by the tile engine), prepared, kept
        assert np.array_equal(gemm.run(a, b, scales, store, tensor), expected)
    assert store.prepares == 1
    assert len(store) == 1  # the offset engine's panels only: no tile panels kept beside them
    b[N - 1, 0] ^= 1
    assert np.array_equal(gemm.run(a, b, scales, store, tensor), want())


def test_row_tiles_only_where_the_plan_allows_them():
    assert row_tiles_fit("tile", 1, "offset", ROUNDING_EMBEDDED)
    assert row_tiles_fit("tile", ROW_KERNEL_ROWS, "offset", ROUNDING_EMBEDDED)
    assert not row_tiles_fit("tile", ROW_KERNEL_ROWS + 1, "offset", ROUNDING_EMBEDDED)
    assert not row_tiles_fit("tile", 1, "tile", ROUNDING_EMBEDDED)  # forced tile, or the method does not fit
    assert not row_tiles_fit("offset", 1, "offset", ROUNDING_EMBEDDED)
    assert not row_tiles_fit("tile", 1, "offset", ROUNDING_MXCSR)  # not measured faster on AVX2
    assert not row_tiles_fit("tile", 1, "offset", None)


@needs_offset
def test_scaled_mm_kept_weight_on_row_tiles_and_forced_tile_agree(monkeypatch):
    """mmaemu.scaled_mm with a kept weight, M = 1: the default (row tiles where the CPU has AVX-512) and
    MMAEMU_CPU_ENGINE=tile give the same bits, also after the weight changed in place."""
    torch = pytest.importorskip("torch")
    import mmaemu
    from mmaemu.cpu import prepared

    gen = torch.Generator().manual_seed(5)
    a = (torch.randn(1, 576, generator=gen) * 8).to(torch.float8_e4m3fn)
    w = (torch.randn(576, 576, generator=gen) * 8).to(torch.float8_e4m3fn)
    one = torch.tensor(1.0)

    def call():
        return mmaemu.scaled_mm(a, w.t(), one, one, out_dtype=torch.bfloat16, use_fast_accum=True, splitk=1)

    results = {}
    for engine in ("auto", "tile"):
        monkeypatch.setenv("MMAEMU_CPU_ENGINE", engine)
        prepared.WEIGHTS.clear()
        results[engine] = [call() for _ in range(3)]
    for x, y in zip(*results.values()):
        assert torch.equal(x.view(torch.int16), y.view(torch.int16))
    monkeypatch.setenv("MMAEMU_CPU_ENGINE", "auto")
    prepared.WEIGHTS.clear()
    for _ in range(3):
        call()
    w.view(torch.uint8)[0, 0] ^= 1  # an in-place change (the version counter moves)
    got = call()
    monkeypatch.setenv("MMAEMU_CPU_ENGINE", "tile")
    assert torch.equal(got.view(torch.int16), call().view(torch.int16))


@needs_offset
@pytest.mark.parametrize("with_bias", [False, True])
def test_kept_rowwise_call_on_row_tiles_gives_the_tile_engines_bits(with_bias, monkeypatch):
    """A kept row-wise plan's call (:class:`mmaemu.cpu.fused.RowwiseScales`: its epilogue per row) on row tiles
    against the same call on the tile engine's kept panels, huge and tiny scales, NaN/Inf codes, both orders."""
    from mmaemu.cpu import offset_rows
    from mmaemu.cpu.fused import RowwiseScales

    calls = []
    kernel = offset_rows.rows_call
    monkeypatch.setattr(offset_rows, "rows_call", lambda *args: calls.append(1) or kernel(*args))
    rng = np.random.default_rng(23 + with_bias)
    M, N, K = 1, 150, 160
    a, b = codes(rng, (M, K), False), codes(rng, (N, K), False)
    b[4, 7], b[90, 0] = 0xFF, 0x7F  # NaN codes in two rows of B: those outputs NaN, the others finite
    x = np.array([2.0 ** 100], np.float32)
    w = (rng.uniform(1, 2, N) * 2.0 ** -120).astype(np.float32)
    # RowwiseScales takes the bias's values (bf16 values widened to fp32); no bias: zeros
    bias = ((rng.standard_normal(N).astype(np.float32).view(np.uint32) >> 16) << 16).view(np.float32) \
        if with_bias else np.zeros(N, np.float32)
    for x_first in (False, True):
        scales = RowwiseScales(x, w, bias, x_first)
        results = []
        for row_tiles in (False, True):
            gemm = TensorwiseGemm("tile", HOPPER, "e4m3", "e4m3", M, N, K, True, 1, "none", "bfloat16",
                                  row_tiles=row_tiles)
            store, tensor = PreparedStore(), Identity(b)
            assert (gemm.rows is not None) == row_tiles
            results.append([gemm.run(a, b, scales, store, tensor) for _ in range(3)])
            assert len(store) == 1 and store.prepares == 1
            assert len(calls) == 2 * row_tiles  # prepared, then kept: the row tiles computed them
            calls.clear()
        for tile_bits, row_bits in zip(*results):
            assert np.array_equal(tile_bits, row_bits)
        values = (tile_bits.astype(np.uint32) << 16).view(np.float32)
        assert np.isnan(values[0, [4, 90]]).all() and np.isfinite(np.delete(values[0], [4, 90])).all()
        assert len(np.unique(values)) > N // 2  # not a constant output


@needs_offset
def test_row_tiles_only_where_the_tile_engines_kept_call_is_one_task(monkeypatch):
    """Row tiles run on the calling thread: a kept call that the tile engine cuts into several tasks on several
    threads keeps its tile panels (and its threads); on one thread the row tiles compute it. Same bits."""
    from mmaemu.cpu import threads

    rng = np.random.default_rng(31)
    M, N, K = 1, 2048, 576
    a, b = codes(rng, (M, K), False), codes(rng, (N, K), False)
    scales = np.array([0x3F800000, 0x3F800000, 0, 0], np.int64)
    results = {}
    for n_threads in (2, 1):
        monkeypatch.setattr(threads, "num_threads", lambda: n_threads)
        gemm = TensorwiseGemm("tile", HOPPER, "e4m3", "e4m3", M, N, K, True, 1, "none", "bfloat16", row_tiles=True)
        if n_threads == 2:
            assert len(gemm._cut(n_threads).prepared_tasks) > 1  # the case this test is about
        calls = []
        kernel = gemm.rows.kernel
        gemm.rows = gemm.rows._replace(kernel=lambda *args: calls.append(1) or kernel(*args))
        store, tensor = PreparedStore(), Identity(b)
        results[n_threads] = [gemm.run(a, b, scales, store, tensor) for _ in range(3)]
        assert len(calls) == (0 if n_threads == 2 else 2)
    for x, y in zip(results[2], results[1]):
        assert np.array_equal(x, y)
