"""mmaemu.patch: torch._scaled_mm computed by mmaemu.scaled_mm inside a block; restored after; logged."""

import threading

import pytest
import torch

import mmaemu
from mmaemu.errors import ReferenceRejectsError, UnsupportedFeatureError
from mmaemu.patching import PatchLog, PatchRecord, is_patched, original_scaled_mm
from mmaemu.testing import assert_bitwise_equal

TORCH_SCALED_MM = torch._scaled_mm
ONE = torch.tensor(1.0)


def fp8(shape, seed):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-5, 5, shape, generator=g).float())
    return (values * 20).clamp(-448, 448).to(torch.float8_e4m3fn)


A, W = fp8((16, 64), 1), fp8((32, 64), 2)
SA, SB = torch.tensor(0.5), torch.tensor(0.25)


class TinyFP8Model(torch.nn.Module):
    """A user model that calls torch._scaled_mm itself (as torchao-style FP8 layers do)."""

    def __init__(self):
        super().__init__()
        self.w1, self.w2 = fp8((32, 64), 3), fp8((16, 32), 4)

    def forward(self, x):
        h = torch._scaled_mm(x, self.w1.t(), SA, SB, out_dtype=torch.bfloat16, use_fast_accum=True)
        h = h.float().clamp(-448, 448).to(torch.float8_e4m3fn)
        return torch._scaled_mm(h, self.w2.t(), scale_a=ONE, scale_b=SB, out_dtype=torch.float32)


def expected_model_output(x, model, **settings):
    h = mmaemu.scaled_mm(x, model.w1.t(), SA, SB, out_dtype=torch.bfloat16, use_fast_accum=True, **settings)
    h = h.float().clamp(-448, 448).to(torch.float8_e4m3fn)
    return mmaemu.scaled_mm(h, model.w2.t(), ONE, SB, out_dtype=torch.float32, **settings)


@pytest.fixture(autouse=True)
def torch_is_restored():
    yield
    assert torch._scaled_mm is TORCH_SCALED_MM
    assert not is_patched()


@pytest.mark.parametrize("profile", ["hopper", "ada"])
def test_model_inside_patch_gets_the_bits_of_mmaemu(profile):
    model = TinyFP8Model()
    with mmaemu.patch(profile=profile, splitk=1) as log:
        assert torch._scaled_mm is not TORCH_SCALED_MM
        y = model(A)
    assert_bitwise_equal(y, expected_model_output(A, model, profile=profile, splitk=1))
    assert [r.profile for r in log] == [profile, profile]
    assert isinstance(log, PatchLog) and all(isinstance(r, PatchRecord) for r in log)


def test_log_records_shapes_dtypes_split_and_backend():
    with mmaemu.patch(profile="ada") as log:  # (16, 32, 64) bf16 fast e4m3 is in the RTX 4060 table
        torch._scaled_mm(A, W.t(), SA, SB, out_dtype=torch.bfloat16, use_fast_accum=True)
    (record,) = log
    assert (record.input_shape, record.mat2_shape) == ((16, 64), (64, 32))
    assert (record.input_dtype, record.mat2_dtype, record.out_dtype) == ("float8_e4m3fn", "float8_e4m3fn",
                                                                         "bfloat16")
    assert record.use_fast_accum is True and record.profile == "ada"
    assert (record.S, record.scheme, record.source) == (1, "none", "table")
    assert record.split.table_id == "heur_rtx4060_lt12.8.3.14"
    assert record.backend == "cpu" and record.device == "cpu" and record.error is None
    assert record.thread == threading.current_thread().name
    assert "M=16 N=32 K=64" in log.summary() and "S=1 none (table)" in log.summary()


def test_failed_calls_are_logged_and_raised():
    with mmaemu.patch(splitk=1) as log:
        with pytest.raises(ReferenceRejectsError):
            torch._scaled_mm(A, W.t(), ONE, ONE, out_dtype=torch.float8_e5m2)
        with pytest.raises(UnsupportedFeatureError):
            torch._scaled_mm(A, W.t(), ONE, ONE, bias=torch.zeros(32, dtype=torch.bfloat16),
                             out_dtype=torch.bfloat16)
        with pytest.raises(TypeError, match="missing required argument 'scale_b'"):
            torch._scaled_mm(A, W.t(), ONE)
    assert [r.error.split(":")[0] for r in log[:2]] == ["ReferenceRejectsError", "UnsupportedFeatureError"]
    assert log[0].split is None and log[0].out_dtype == "float8_e5m2"
    assert len(log) == 2  # argument errors of the Python call itself are not GEMM calls


def test_restored_after_an_exception():
    with pytest.raises(RuntimeError, match="boom"):
        with mmaemu.patch():
            raise RuntimeError("boom")
    assert torch._scaled_mm is TORCH_SCALED_MM


def test_nesting_inner_wins_outer_comes_back_and_unset_settings_inherit():
    with mmaemu.patch(profile="ada", splitk=1) as outer:
        torch._scaled_mm(A, W.t(), ONE, ONE, out_dtype=torch.float32)
        with mmaemu.patch(profile="hopper") as inner:  # splitk=1 inherited
            torch._scaled_mm(A, W.t(), ONE, ONE, out_dtype=torch.float32)
            with mmaemu.patch() as innermost:  # everything inherited
                torch._scaled_mm(A, W.t(), ONE, ONE, out_dtype=torch.float32)
        assert torch._scaled_mm is not TORCH_SCALED_MM
        y = torch._scaled_mm(A, W.t(), ONE, ONE, out_dtype=torch.float32)
    assert [r.profile for r in outer] == ["ada", "hopper", "hopper", "ada"]
    assert [r.profile for r in inner] == ["hopper", "hopper"]
    assert [(r.profile, r.source) for r in innermost] == [("hopper", "explicit")]
    assert_bitwise_equal(y, mmaemu.scaled_mm(A, W.t(), ONE, ONE, out_dtype=torch.float32, profile="ada", splitk=1))


def test_decorator_form():
    patcher = mmaemu.patch(profile="ada", splitk=1)

    @patcher
    def run(x):
        assert torch._scaled_mm is not TORCH_SCALED_MM
        return torch._scaled_mm(x, W.t(), SA, SB, out_dtype=torch.bfloat16)

    assert torch._scaled_mm is TORCH_SCALED_MM
    y = run(A)
    assert torch._scaled_mm is TORCH_SCALED_MM
    assert_bitwise_equal(y, mmaemu.scaled_mm(A, W.t(), SA, SB, out_dtype=torch.bfloat16, profile="ada", splitk=1))
    assert len(patcher.log) == 1 and patcher.log[0].profile == "ada"
    run(A)
    assert len(patcher.log) == 1  # the log of the latest call


def test_out_argument_and_positional_arguments_pass_through():
    out = torch.empty(16, 32)
    with mmaemu.patch(splitk=1):
        result = torch._scaled_mm(A, W.t(), SA, SB, None, None, torch.float32, True, out=out)
    assert result is out
    assert_bitwise_equal(out, mmaemu.scaled_mm(A, W.t(), SA, SB, out_dtype=torch.float32, use_fast_accum=True,
                                               splitk=1))


def test_zero_size_calls_return_zeros_and_are_logged():
    a0, w0 = torch.zeros(16, 0, dtype=torch.float8_e4m3fn), torch.zeros(32, 0, dtype=torch.float8_e4m3fn)
    with mmaemu.patch() as log:
        y = torch._scaled_mm(a0, w0.t(), ONE, ONE, out_dtype=torch.bfloat16)
    assert y.shape == (16, 32) and y.dtype == torch.bfloat16 and not y.any()
    assert log[0].split is None and log[0].backend == "none (zero-size result)" and log[0].error is None


def test_only_the_python_attribute_is_patched():
    aten_op = torch.ops.aten._scaled_mm
    with mmaemu.patch():
        assert torch.ops.aten._scaled_mm is aten_op
        assert original_scaled_mm() is TORCH_SCALED_MM


def test_bad_settings_fail_at_construction():
    with pytest.raises(KeyError, match="unknown profile"):
        mmaemu.patch(profile="h100-sxm")
    with pytest.raises(ValueError, match="unknown backend"):
        mmaemu.patch(backend="tpu")


def test_threads_each_with_their_own_block_and_a_thread_without_one():
    expected = {p: mmaemu.scaled_mm(A, W.t(), SA, SB, out_dtype=torch.float32, profile=p, splitk=1)
                for p in ("hopper", "ada")}
    barrier = threading.Barrier(2)
    results, logs, errors = {}, {}, []

    def worker(profile):
        try:
            with mmaemu.patch(profile=profile, splitk=1) as log:
                barrier.wait(timeout=30)  # both blocks are open at the same time
                for _ in range(3):
                    results.setdefault(profile, []).append(
                        torch._scaled_mm(A, W.t(), SA, SB, out_dtype=torch.float32))
                barrier.wait(timeout=30)
            logs[profile] = log
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(p,), name=f"worker-{p}") for p in ("hopper", "ada")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    for profile, outputs in results.items():
        for y in outputs:
            assert_bitwise_equal(y, expected[profile])
        assert [(r.profile, r.thread) for r in logs[profile]] == [(profile, f"worker-{profile}")] * 3

    # A thread without a block of its own uses the most recently opened block (process-wide effect).
    seen = {}

    def bystander():
        seen["patched"] = torch._scaled_mm is not TORCH_SCALED_MM
        seen["y"] = torch._scaled_mm(A, W.t(), SA, SB, out_dtype=torch.float32)

    with mmaemu.patch(profile="ada", splitk=1) as log:
        t = threading.Thread(target=bystander, name="bystander")
        t.start()
        t.join(timeout=60)
    assert seen["patched"]
    assert_bitwise_equal(seen["y"], expected["ada"])
    assert [(r.profile, r.thread) for r in log] == [("ada", "bystander")]


# ----------------------------------------------------------------------------------------------------------------
# Settings live in context variables: asyncio tasks, threads, blocks closed elsewhere


def test_asyncio_tasks_on_one_loop_keep_their_own_profile_and_log():
    import asyncio

    expected = {p: mmaemu.scaled_mm(A, W.t(), SA, SB, out_dtype=torch.float32, profile=p, splitk=1)
                for p in ("hopper", "ada")}
    both_open = asyncio.Event()
    opened = []

    async def worker(profile):
        with mmaemu.patch(profile=profile, splitk=1) as log:
            opened.append(profile)
            if len(opened) == 2:
                both_open.set()
            await both_open.wait()  # the other task's block is open now, on the same thread
            outputs = []
            for _ in range(2):
                outputs.append(torch._scaled_mm(A, W.t(), SA, SB, out_dtype=torch.float32))
                await asyncio.sleep(0)  # let the other task run between calls
        return outputs, log

    async def main():
        return await asyncio.gather(worker("hopper"), worker("ada"))

    for profile, (outputs, log) in zip(("hopper", "ada"), asyncio.run(main())):
        for y in outputs:
            assert_bitwise_equal(y, expected[profile])
        assert [r.profile for r in log] == [profile, profile]


def test_a_task_started_inside_a_block_inherits_it():
    import asyncio

    async def call():
        return torch._scaled_mm(A, W.t(), SA, SB, out_dtype=torch.float32)

    async def main():
        with mmaemu.patch(profile="ada", splitk=1) as log:
            y = await asyncio.create_task(call())
        return y, log

    y, log = asyncio.run(main())
    assert_bitwise_equal(y, mmaemu.scaled_mm(A, W.t(), SA, SB, out_dtype=torch.float32, profile="ada", splitk=1))
    assert [r.profile for r in log] == ["ada"]


def test_decorated_coroutine_keeps_the_block_across_awaits():
    import asyncio

    @mmaemu.patch(profile="ada", splitk=1)
    async def run():
        await asyncio.sleep(0)
        assert torch._scaled_mm is not TORCH_SCALED_MM
        return torch._scaled_mm(A, W.t(), SA, SB, out_dtype=torch.float32)

    assert_bitwise_equal(asyncio.run(run()),
                         mmaemu.scaled_mm(A, W.t(), SA, SB, out_dtype=torch.float32, profile="ada", splitk=1))


def test_entered_on_one_thread_and_left_on_another_restores_torch():
    patcher = mmaemu.patch(profile="ada", splitk=1)
    log = patcher.__enter__()
    assert torch._scaled_mm is not TORCH_SCALED_MM
    errors = []

    def leave():
        try:
            patcher.__exit__(None, None, None)
        except Exception as exc:  # reported below
            errors.append(exc)

    t = threading.Thread(target=leave)
    t.start()
    t.join(timeout=60)
    assert not errors and torch._scaled_mm is TORCH_SCALED_MM and not is_patched()
    # The entering thread's context still lists the block, but a closed block is never used again.
    y = torch._scaled_mm(A, W.t(), ONE, ONE, out_dtype=torch.float32)
    assert y.dtype == torch.float32 and len(log) == 0


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(splitk="bad"), TypeError, "splitk must be 'auto'"),
    (dict(splitk=0), ValueError, "splitk must be >= 1"),
    (dict(splitk=4), ValueError, "needs a reduction scheme"),
    (dict(splitk=(2, "zigzag")), ValueError, "needs a scheme"),
    (dict(profile="ada", splitk=(2, "contiguous")), ValueError, "serial"),
    (dict(profile=3), TypeError, "profile"),
    (dict(backend=7), TypeError, "backend must be a string"),
])
def test_every_bad_setting_fails_at_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        mmaemu.patch(**kwargs)


def test_an_inherited_profile_is_checked_against_the_inner_split_on_entry():
    with mmaemu.patch(profile="ada"):
        inner = mmaemu.patch(splitk=(2, "contiguous"))  # fine for the default profile (hopper) ...
        with pytest.raises(ValueError, match="serial"):
            with inner:  # ... but this block would inherit ada
                pass
        assert torch._scaled_mm is not TORCH_SCALED_MM  # the outer block is still open and intact
        with mmaemu.patch(splitk=(2, "serial")) as log:  # refused for hopper, right for the inherited ada
            torch._scaled_mm(A, W.t(), ONE, ONE, out_dtype=torch.float32)
    assert [(r.profile, r.S, r.scheme) for r in log] == [("ada", 2, "serial")]


# -- the log's bound ---------------------------------------------------------------------------------------------


def _calls(rows):
    for m in rows:
        torch._scaled_mm(A[:m], W.t(), ONE, ONE, out_dtype=torch.float32)


def test_the_log_keeps_the_latest_calls_and_counts_the_dropped_ones():
    with mmaemu.patch(splitk=1, log_limit=3) as log:
        _calls([1, 2, 3, 4, 5])
        with mmaemu.patch() as inner:  # an inner block has its own bound (the default)
            _calls([6])
    assert [r.input_shape[0] for r in log] == [4, 5, 6] and log.dropped == 3 and log.limit == 3
    assert inner.limit == mmaemu.patching.DEFAULT_LOG_LIMIT and inner.dropped == 0 and len(inner) == 1
    lines = log.summary().splitlines()
    assert lines[0].startswith("(3 earlier calls dropped") and lines[1].startswith("3: M=4 ")
    with mmaemu.patch(splitk=1, log_limit=0) as nothing:
        _calls([1, 2])
    assert list(nothing) == [] and nothing.dropped == 2
    with mmaemu.patch(splitk=1, log_limit=None) as everything:
        _calls([1, 2])
    assert len(everything) == 2 and everything.limit is None


def test_the_default_bound_is_documented_and_applies():
    assert mmaemu.patching.DEFAULT_LOG_LIMIT == 10_000
    assert mmaemu.patch().log.limit == 10_000
    log = PatchLog(limit=10_000)
    record = object()
    for _ in range(10_005):
        log._add(record)
    assert len(log) == 10_000 and log.dropped == 5


@pytest.mark.parametrize("bad", [-1, 1.5, True, "10"])
def test_a_bad_log_limit_is_refused(bad):
    with pytest.raises((TypeError, ValueError), match="log_limit must be"):
        mmaemu.patch(log_limit=bad)


# -- generators --------------------------------------------------------------------------------------------------


def test_a_decorated_generator_runs_patched_and_outside_code_does_not_see_the_patch():
    seen = []

    patcher = mmaemu.patch(profile="ada", splitk=1)

    @patcher
    def steps(n):
        for m in range(1, n + 1):
            seen.append(is_patched())
            received = yield torch._scaled_mm(A[:m], W.t(), ONE, ONE, out_dtype=torch.float32)
            seen.append(received)

    import inspect

    assert inspect.isgeneratorfunction(steps)
    gen = steps(3)
    assert not is_patched()  # nothing runs before the first step
    first = next(gen)
    assert not is_patched() and torch._scaled_mm is TORCH_SCALED_MM  # between steps: torch's own function
    second = gen.send("hello")
    rest = list(gen)
    assert seen == [True, "hello", True, None, True, None]
    for m, y in zip((1, 2, 3), [first, second] + rest):
        assert_bitwise_equal(y, mmaemu.scaled_mm(A[:m], W.t(), ONE, ONE, out_dtype=torch.float32, profile="ada",
                                                 splitk=1))
    assert [r.input_shape[0] for r in patcher.log] == [1, 2, 3]  # one log for the whole iteration
    assert all(r.profile == "ada" for r in patcher.log)


def test_a_decorated_generator_handles_throw_close_and_return_inside_the_block():
    events = []

    @mmaemu.patch(splitk=1)
    def worker():
        try:
            try:
                yield 1
            except KeyError:
                events.append(("caught", is_patched()))
                yield 2
            yield 3
        finally:
            events.append(("finally", is_patched()))
        return "never"

    gen = worker()
    assert next(gen) == 1
    assert gen.throw(KeyError("x")) == 2
    gen.close()
    assert events == [("caught", True), ("finally", True)] and not is_patched()

    @mmaemu.patch(splitk=1)
    def returns():
        yield 1
        return "value"

    def outer():
        result = yield from returns()
        events.append(result)

    assert list(outer()) == [1] and events[-1] == "value"


def test_a_decorated_async_generator_runs_patched_between_its_awaits():
    import asyncio
    import inspect

    seen = []

    patcher = mmaemu.patch(profile="ada", splitk=1)

    @patcher
    async def stream(n):
        for m in range(1, n + 1):
            await asyncio.sleep(0)
            seen.append(is_patched())
            yield torch._scaled_mm(A[:m], W.t(), ONE, ONE, out_dtype=torch.float32)

    assert inspect.isasyncgenfunction(stream)

    async def consume():
        results = []
        async for y in stream(2):
            seen.append(("outside", is_patched()))
            results.append(y)
        return results

    results = asyncio.run(consume())
    assert seen == [True, ("outside", False), True, ("outside", False)]
    assert_bitwise_equal(results[1], mmaemu.scaled_mm(A[:2], W.t(), ONE, ONE, out_dtype=torch.float32,
                                                      profile="ada", splitk=1))
    assert [r.input_shape[0] for r in patcher.log] == [1, 2]


def test_a_plain_function_returning_a_generator_gets_its_body_patched_too():
    patcher = mmaemu.patch(splitk=1)

    @patcher
    def lazy(rows):
        return (torch._scaled_mm(A[:m], W.t(), ONE, ONE, out_dtype=torch.float32) for m in rows)

    results = list(lazy([1, 2]))
    assert len(results) == 2 and [r.input_shape[0] for r in patcher.log] == [1, 2]


def test_a_decorated_async_generator_takes_athrow_and_aclose_inside_the_block():
    import asyncio

    events = []

    @mmaemu.patch(splitk=1)
    async def worker():
        try:
            try:
                yield 1
            except KeyError:
                await asyncio.sleep(0)
                events.append(("caught", is_patched()))
                yield 2
            yield 3
        finally:
            await asyncio.sleep(0)
            events.append(("finally", is_patched()))

    async def drive():
        gen = worker()
        assert await gen.asend(None) == 1 and not is_patched()
        assert await gen.athrow(KeyError("x")) == 2 and not is_patched()
        await gen.aclose()

    asyncio.run(drive())
    assert events == [("caught", True), ("finally", True)] and not is_patched()
