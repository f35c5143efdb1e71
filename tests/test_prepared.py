"""B decoded once (mmaemu.cpu.prepared, mmaemu.cpu.engine.prepare_b): a kept B gives the bits of a fresh decode,
and a changed weight is never served stale."""

import copy
import gc

import numpy as np
import pytest
import torch

import mmaemu
import mmaemu.api
from mmaemu.recipes import tensorwise
from mmaemu.cpu import engine, prepared
from mmaemu.cpu.engine import TILE, accumulate_codes, prepare_b
from mmaemu.model.presets import ADA, HOPPER
from mmaemu.nn import EmulatedFP8Linear
from mmaemu.plan import cache

ONE = torch.tensor(1.0)
NONFINITE = {"e4m3": [0x7F, 0xFF], "e5m2": [0x7C, 0xFC, 0x7D]}


@pytest.fixture(autouse=True)
def empty_store(monkeypatch):
    """An empty store, used for every size of B (small ones are otherwise decoded at each call)."""
    monkeypatch.setattr(tensorwise, "_PREPARED_MIN_CODES", 0)
    prepared.WEIGHTS.clear()
    cache.clear()
    yield
    prepared.WEIGHTS.clear()


def codes(rng, shape, fmt, nonfinite=0):
    c = rng.integers(0, 256, shape).astype(np.uint8)
    bad = NONFINITE[fmt]
    c[np.isin(c, bad)] = 0x30  # finite codes first, then the chosen NaN/Inf positions
    for _ in range(nonfinite):
        c[rng.integers(shape[0]), rng.integers(shape[1])] = bad[rng.integers(len(bad))]
    return c


def bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


@pytest.mark.parametrize("M,N,K", [(1, 16, 32), (3, 200, 96), (9, 130, 257), (5, 512, 64)])
@pytest.mark.parametrize("fmt_b", ["e4m3", "e5m2"])
@pytest.mark.parametrize("nonfinite", [0, 3])
def test_a_prepared_b_gives_the_reference_bits(M, N, K, fmt_b, nonfinite):
    rng = np.random.default_rng(M * N + K + nonfinite)
    a, b = codes(rng, (M, K), "e4m3", nonfinite), codes(rng, (N, K), fmt_b, nonfinite)
    kept = prepare_b(b, fmt_b)
    assert kept.nonfinite.tolist() == engine.nonfinite_flags(b, fmt_b).tolist()
    assert kept.nbytes == engine.prepared_b_nbytes(N, K)
    for preset, fast, S, scheme in [(HOPPER, True, 1, "none"), (HOPPER, False, 2, "contiguous"),
                                    (ADA, False, 3, "pairwise")]:
        want = accumulate_codes(a, b, "e4m3", fmt_b, preset, fast, S, scheme, reference=True)
        got = accumulate_codes(a, b, "e4m3", fmt_b, preset, fast, S, scheme, prepared_b=kept)
        fresh = accumulate_codes(a, b, "e4m3", fmt_b, preset, fast, S, scheme)
        assert (bits(got) == bits(want)).all() and (bits(fresh) == bits(want)).all()


def test_a_prepared_b_of_other_codes_is_refused():
    rng = np.random.default_rng(1)
    a, b = codes(rng, (2, 32), "e4m3"), codes(rng, (16, 32), "e4m3")
    with pytest.raises(ValueError, match="prepared"):
        accumulate_codes(a, b, "e4m3", "e5m2", HOPPER, True, prepared_b=prepare_b(b, "e4m3"))
    with pytest.raises(ValueError, match="prepared"):
        accumulate_codes(a, b[:8], "e4m3", "e4m3", HOPPER, True, prepared_b=prepare_b(b, "e4m3"))


# --------------------------------------------------------------------------------------------------------------
# The process-wide store of scaled_mm


def fp8(shape, seed, dtype=torch.float8_e4m3fn):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 40).clamp(-448, 448).to(dtype)


def product(a, mat2):
    return mmaemu.scaled_mm(a, mat2, ONE, ONE, out_dtype=torch.float32, splitk=1)


def same(x, y):
    return torch.equal(x.view(torch.int32), y.view(torch.int32))


def uncached(a, mat2):
    """The product decoded for this call alone (the store bypassed)."""
    from mmaemu.api import run_scaled_mm_plan
    from mmaemu.context import for_call
    from mmaemu.plan.planner import plan_scaled_mm

    return run_scaled_mm_plan(plan_scaled_mm(a, mat2, ONE, ONE, None, None, torch.float32, False, splitk=1,
                                             context=for_call()))


def test_a_small_b_is_decoded_at_each_call(monkeypatch):
    monkeypatch.setattr(tensorwise, "_PREPARED_MIN_CODES", 48 * 64 + 1)
    a, w = fp8((2, 64), 1), fp8((48, 64), 2)
    for _ in range(3):
        product(a, w.t())
    assert prepared.WEIGHTS.prepares == 0


def test_a_weight_is_kept_the_second_time_it_is_seen():
    a, w = fp8((2, 64), 1), fp8((48, 64), 2)
    results = [product(a, w.t()) for _ in range(4)]
    assert prepared.WEIGHTS.prepares == 1 and len(prepared.WEIGHTS) == 1
    assert all(same(r, uncached(a, w.t())) for r in results)


@pytest.mark.parametrize("change", ["copy_", "setitem", "data", "numpy", "view"])
def test_an_updated_weight_is_never_served_stale(change):
    a, w = fp8((3, 64), 3), fp8((48, 64), 4)
    for _ in range(3):
        product(a, w.t())
    assert prepared.WEIGHTS.prepares == 1
    new = fp8((48, 64), 5)
    if change == "copy_":
        w.copy_(new)
    elif change == "setitem":
        w[0, 0] = torch.tensor(-448.0).to(w.dtype)
    elif change == "data":  # a write torch's version counter does not see
        w.data[7, 3] = torch.tensor(240.0).to(w.dtype)
    elif change == "numpy":  # nor does it see a write through memory shared with numpy
        w.view(torch.uint8).numpy()[5, 9] ^= 0x11
    else:  # through a view of the same storage
        w[1:].view(torch.uint8)[2, 2] = 0x7F
    got = product(a, w.t())
    assert same(got, uncached(a, w.t()))
    assert same(product(a, w.t()), got)


def test_views_of_one_storage_with_other_strides_or_offsets():
    a = fp8((2, 64), 6)
    storage = fp8((64, 96), 7)
    views = [storage[:32, :64], storage[32:, :64], storage[:, 16:80][:32], storage[:32, :64].contiguous()]
    for _ in range(2):
        for v in views:
            assert same(product(a, v.t()), uncached(a, v.t()))
    assert len(prepared.WEIGHTS) == len(views)


def test_a_transposed_ref_is_the_ref_of_the_transposed_view():
    """scaled_mm's mat2 finds B's kept panels by transposed_weight_ref(mat2), without making mat2.t(): the same
    identity and version as weight_ref(mat2.t()), also after an in-place update and for an inference tensor."""
    w = fp8((32, 64), 4)
    wide = torch.zeros((48, 80), dtype=torch.float32)
    for mat2 in (w.t(), w[:, 8:40].t(), w.t()[4:20], wide[3:35, 5:69].t(), wide.t()[2:60:2]):
        ref = prepared.transposed_weight_ref(mat2)
        assert ref == prepared.weight_ref(mat2.t()) and prepared.weight_ref(ref) is ref
        assert ref.identity == prepared.tensor_identity(mat2.t()) and ref.version == mat2.t()._version
    before = prepared.transposed_weight_ref(wide.t())
    wide.add_(1)
    after = prepared.transposed_weight_ref(wide.t())
    assert after.identity == before.identity and after.version == before.version + 1
    with torch.inference_mode():
        frozen = torch.zeros((16, 32))
    assert prepared.transposed_weight_ref(frozen.t()) == prepared.weight_ref(frozen) == (
        prepared.tensor_identity(frozen), None)


def test_a_freed_and_reused_address_is_not_served_the_old_panels():
    """A tensor stand-in with the identity and version of a kept one and other codes (what a freed weight whose
    memory a new one reuses looks like) gets its own panels."""

    class Alike:
        def __init__(self, real):
            self._real, self._version = real, real._version

        def __getattr__(self, name):
            return getattr(self._real, name)

    store = prepared.PreparedStore()
    rng = np.random.default_rng(8)
    old, new = codes(rng, (32, 64), "e4m3"), codes(rng, (32, 64), "e4m3")
    tensor = torch.from_numpy(old).view(torch.float8_e4m3fn)
    for _ in range(2):
        kept = store.prepared(TILE, "e4m3", tensor, old)
    assert kept is not None and store.prepares == 1
    assert store.prepared(TILE, "e4m3", Alike(tensor), new) is None  # the old panels are dropped, not served
    served = store.prepared(TILE, "e4m3", Alike(tensor), new)  # seen twice: its own panels
    assert store.prepares == 2 and (served.val == prepare_b(new, "e4m3").val).all()
    assert (served.nonfinite == prepare_b(new, "e4m3").nonfinite).all()


def test_a_real_reused_address_gives_the_new_weights_bits():
    a = fp8((2, 64), 9)
    for seed in range(6):  # allocator reuse is likely; the result must be right whether or not it happens
        w = fp8((32, 64), 10 + seed)
        for _ in range(2):
            got = product(a, w.t())
        assert same(got, uncached(a, w.t()))
        del w
        gc.collect()


def test_the_store_is_bounded():
    store = prepared.PreparedStore(max_bytes=3 * engine.prepared_b_nbytes(32, 64) + 3 * 32 * 64)
    rng = np.random.default_rng(11)
    tensors = [torch.from_numpy(codes(rng, (32, 64), "e4m3")) for _ in range(5)]
    for t in tensors:
        for _ in range(2):
            store.prepared(TILE, "e4m3", t, t.numpy())
    assert len(store) == 3 and store.nbytes <= store.max_bytes
    big = torch.from_numpy(codes(rng, (512, 64), "e4m3"))
    assert all(store.prepared(TILE, "e4m3", big, big.numpy()) is None for _ in range(3))


def test_inference_tensors_have_no_version_and_still_work():
    a = fp8((2, 64), 12)
    with torch.inference_mode():
        w = fp8((32, 64), 13)
        results = [product(a, w.t()) for _ in range(3)]
        w.copy_(fp8((32, 64), 14))
        changed = product(a, w.t())
    assert prepared.WEIGHTS.prepares >= 1
    assert same(results[-1], uncached(a, fp8((32, 64), 13).t()))
    assert same(changed, uncached(a, fp8((32, 64), 14).t()))


# --------------------------------------------------------------------------------------------------------------
# A layer's slot


def layer(seed=15, **options):
    g = torch.Generator().manual_seed(seed)
    linear = torch.nn.Linear(64, 48)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(48, 64, generator=g))
        linear.bias.copy_(torch.randn(48, generator=g))
    return EmulatedFP8Linear.from_linear(linear, splitk=1, **options)


def test_a_layer_decodes_its_weight_once_and_follows_changes():
    kept, plain = layer(), layer()
    plain.keep_prepared_weight = False
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for _ in range(3):
            assert same(kept(x), plain(x))
        assert kept._prepared_weight.prepares == 1 and "_prepared_weight" not in plain.__dict__
        new = layer(16)
        kept.load_state_dict(new.state_dict())
        plain.load_state_dict(new.state_dict())
        assert same(kept(x), plain(x)) and kept._prepared_weight.prepares == 2
        kept.weight.data[3, 3] = torch.tensor(-2.0).to(kept.weight.dtype)  # unseen by the version counter
        plain.weight.data[3, 3] = torch.tensor(-2.0).to(plain.weight.dtype)
        assert same(kept(x), plain(x)) and kept._prepared_weight.prepares == 3


def test_a_copied_layer_starts_with_an_empty_slot():
    original = layer()
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = original(x)
        twin = copy.deepcopy(original)
        assert twin._prepared_weight.prepares == 0
        assert same(twin(x), want)


@pytest.mark.parametrize("size", [8, 64, 331776, 13, 1001])
def test_one_changed_byte_anywhere_is_seen(size):
    """The kept codes' comparison (8 bytes at a time where the size allows) sees a change in any byte, the first
    and the last included, in both directions of the bits."""
    rng = np.random.default_rng(size)
    kept = rng.integers(0, 256, size, dtype=np.uint8)
    assert prepared.same_bytes(kept, kept.copy())
    for position in sorted({0, 1, size // 2, size - 2, size - 1}):
        for flip in (0x01, 0x80):
            other = kept.copy()
            other[position] ^= flip
            assert not prepared.same_bytes(kept, other), (position, flip)
