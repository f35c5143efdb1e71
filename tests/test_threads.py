"""The CPU backend inside other people's processes: Numba's threading layer left alone, other Numba parallel code
next to mmaemu calls, calls from several threads, fork during a call, Ctrl-C during a long call.

The process-level cases run in a subprocess with a timeout (an abort or a deadlock must fail the test, not the
test run). They use the warm cache of this session (the first test compiles into it if needed).
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from mmaemu.cpu import accumulate_codes, threads, torch_team
from mmaemu.model.presets import ADA, HOPPER

PRELUDE = """
import numpy as np
from mmaemu.cpu import accumulate_codes
from mmaemu.model.presets import HOPPER

def gemm(M, N, K):
    a, b = np.full((M, K), 0x38, np.uint8), np.full((N, K), 0x38, np.uint8)
    out = accumulate_codes(a, b, "e4m3", "e4m3", HOPPER, True)
    assert out[0, 0] == K and out[-1, -1] == K, out
    return out

gemm(64, 512, 1024)  # loaded from the cache, outside what is measured
"""


def run_script(body: str, timeout: float, **env):
    """PRELUDE + body in a fresh interpreter; ``env``: variables to set (None: to remove)."""
    code = PRELUDE + textwrap.dedent(body)
    environ = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env=environ)


@pytest.fixture(scope="module", autouse=True)
def warm_cache():
    """Compile (or load) the loops the scripts use, so that no script compiles them."""
    a = np.full((64, 1024), 0x38, np.uint8)
    accumulate_codes(a, np.full((512, 1024), 0x38, np.uint8), "e4m3", "e4m3", HOPPER, True)


# ----------------------------------------------------------------------------------------------------------------
# Numba's threading layer and other Numba code in the process


@pytest.mark.parametrize("layer", [None, "workqueue"])
@pytest.mark.subprocess
def test_users_parallel_numba_code_runs_next_to_mmaemu_calls(layer):
    """A user's own @njit(parallel=True) function, in a thread of its own, while mmaemu computes, on the
    ``workqueue`` layer (where two overlapping parallel regions abort the process), chosen before mmaemu was
    imported or after it ran: mmaemu neither changes Numba's threading layer nor starts it."""
    result = run_script("""
        import os, threading, time
        import numba
        from numba import njit, prange

        chosen = os.environ.get("NUMBA_THREADING_LAYER", "default")
        assert numba.config.THREADING_LAYER == chosen, numba.config.THREADING_LAYER

        @njit(parallel=True)
        def users_sum(x):
            total = 0.0
            for i in prange(x.shape[0]):
                total += x[i] * 0.5
            return total

        x = np.ones(1 << 20)
        if chosen == "default":  # mmaemu has run, yet the user may still pick the layer
            numba.config.THREADING_LAYER = "workqueue"
        assert users_sum(x) == x.size * 0.5
        stop = time.time() + 1.5
        def user_thread():
            while time.time() < stop:
                assert users_sum(x) == x.size * 0.5
        thread = threading.Thread(target=user_thread)
        thread.start()
        calls = 0
        while time.time() < stop:
            gemm(64, 512, 1024)
            calls += 1
        thread.join()
        print(numba.threading_layer(), calls)
    """, timeout=120, NUMBA_THREADING_LAYER=layer)
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
    used, calls = result.stdout.split()
    assert used == "workqueue" and int(calls) > 1


def test_calls_from_several_threads_at_once_give_the_same_bits():
    rng = np.random.default_rng(5)
    cases = [(rng.integers(0, 0x7E, (37, 300), dtype=np.uint8), rng.integers(0, 0x7E, (150, 300), dtype=np.uint8),
              preset, fast) for preset in (HOPPER, ADA) for fast in (True, False)]
    expected = [accumulate_codes(a, b, "e4m3", "e4m3", p, f).view(np.uint32) for a, b, p, f in cases]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for _ in range(3):
            got = list(pool.map(lambda c: accumulate_codes(c[0], c[1], "e4m3", "e4m3", c[2], c[3]), cases))
            assert all(np.array_equal(g.view(np.uint32), e) for g, e in zip(got, expected))


# ----------------------------------------------------------------------------------------------------------------
# fork and Ctrl-C


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.subprocess
def test_fork_while_another_thread_is_inside_a_call():
    """The child of a fork made during a call in another thread computes (before: it hung on the backend's lock)."""
    result = run_script("""
        import os, sys, threading, time
        inside, stop = threading.Event(), threading.Event()
        def calls():  # one call after another: the fork comes during one of them
            while not stop.is_set():
                inside.set()
                gemm(256, 2048, 4096)
        thread = threading.Thread(target=calls, daemon=True)
        thread.start()
        inside.wait()
        time.sleep(0.2)
        pid = os.fork()
        if pid == 0:
            gemm(64, 512, 1024)  # several tasks: the child's own pool of threads
            os._exit(0)
        deadline = time.time() + 15
        while time.time() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        stop.set()
        if not done:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            sys.exit("the forked child hung")
        thread.join()
        sys.exit(os.waitstatus_to_exitcode(status))
    """, timeout=60)
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])


@pytest.mark.parametrize("prelude", ["", "import torch\n"], ids=["pool", "torch-team"])
@pytest.mark.subprocess
def test_ctrl_c_interrupts_a_long_call_before_it_ends(prelude):
    """SIGINT during a call that takes many seconds (about 69 G products) raises KeyboardInterrupt before the call
    has computed its result: the call returns to Python between its tasks and lets the signal through, on
    mmaemu's pool and on torch's team. (How soon is measured by scripts/bench.py, not asserted here.)"""
    proc = subprocess.Popen([sys.executable, "-c", prelude + PRELUDE + "print('start', flush=True)\n"
                             "gemm(1024, 4096, 16384)\n"
                             "print('finished', flush=True)\n"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline() == "start\n"
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=300)  # a hang guard only
    finally:
        proc.kill()
        proc.wait()
    assert "KeyboardInterrupt" in stderr and "finished" not in stdout, stderr[-3000:]


# ----------------------------------------------------------------------------------------------------------------
# How loops are cut into tasks


def test_tasks_cover_every_job_once_and_errors_stop_the_rest(monkeypatch):
    for n_jobs, job_work, n_threads in [(1, 1, 2), (10, 1 << 30, 2), (1000, 3, 4), (45, 1 << 20, 2), (7, 1, 1)]:
        ranges = threads.job_ranges(n_jobs, job_work, n_threads)
        assert ranges[0][0] == 0 and ranges[-1][1] == n_jobs
        assert all(hi == lo for (_, hi), (lo, _) in zip(ranges, ranges[1:]))
        step = threads.jobs_per_task(n_jobs, job_work, n_threads)
        assert step == 1 or step * job_work <= max(threads.TASK_WORK, threads.MIN_TASK_WORK)
    assert threads.jobs_per_task(16, 1 << 20, 2) == 2  # 8 tasks: 4 for each of 2 threads
    seen = []
    monkeypatch.setattr(threads, "num_threads", lambda: 3)
    threads.parallel_for(lambda lo, hi, out: out.extend(range(lo, hi)), 1000, 1 << 16, seen)
    assert sorted(seen) == list(range(1000))
    ran = []

    def task(i):
        ran.append(i)
        if i == 2:
            raise ValueError("task 2")

    with pytest.raises(ValueError, match="task 2"):
        threads.run_tasks([lambda i=i: task(i) for i in range(1000)])
    assert 2 in ran and len(ran) < 1000


def test_small_tasks_are_handed_out_in_groups(monkeypatch):
    """Tasks below MIN_TASK_WORK go out together (consecutive, each task once, in order within a group); a call of
    less than two groups' work runs on the calling thread, never on the pool."""
    least = threads.MIN_TASK_WORK
    assert threads.task_groups([least // 4] * 3) == [(0, 3)]
    assert threads.task_groups([least // 4] * 9) == [(0, 4), (4, 9)]
    assert threads.task_groups([least, least, 1]) == [(0, 1), (1, 3)]
    assert threads.task_groups([2 * least] * 3) == [(0, 1), (1, 2), (2, 3)]
    assert threads.task_groups([]) == []
    monkeypatch.setattr(threads, "num_threads", lambda: 2)
    monkeypatch.setattr(torch_team, "team", lambda n_threads: None)  # the pool's threads, not torch's team
    ran = []
    threads.run_tasks([lambda i=i: ran.append((i, threading.get_ident())) for i in range(5)], [least // 8] * 5)
    assert ran == [(i, threading.get_ident()) for i in range(5)]
    ran.clear()
    threads.run_tasks([lambda i=i: ran.append((i, threading.get_ident())) for i in range(40)], [least // 8] * 40)
    assert sorted(i for i, _ in ran) == list(range(40))
    assert threading.get_ident() not in {thread for _, thread in ran}


@pytest.mark.subprocess
def test_pool_threads_never_inherit_flush_to_zero_mode():
    """A new thread copies the floating-point mode of the thread that starts it: a pool started from a thread in
    flush-to-zero mode must still run its tasks with gradual underflow (the callers' threads are checked by
    mmaemu.plan.flush; the pool threads are mmaemu's own)."""
    code = textwrap.dedent("""
        import threading, torch
        from mmaemu.cpu import threads
        from mmaemu.plan.flush import fp32_subnormals_flushed

        seen = {}
        both = threading.Barrier(2, timeout=60)  # each of the two tasks waits for the other: two pool threads

        def task():
            seen[threading.current_thread().name] = fp32_subnormals_flushed()
            both.wait()

        torch.set_flush_denormal(True)
        threads.run_tasks([task] * 2)  # the pool starts here, from a flush-to-zero thread
        torch.set_flush_denormal(False)
        assert len(seen) == 2 and not any(seen.values()), seen
    """)
    environ = {**os.environ, "NUMBA_NUM_THREADS": "2"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=environ)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.subprocess
def test_pool_threads_start_without_importing_torch():
    """The pool's start sets the threads' mode through torch only where they flush: a process that computes on
    numpy arrays and never imported torch does not pay its import at its first call on the pool."""
    code = textwrap.dedent("""
        import sys, threading
        from mmaemu.cpu import threads

        both = threading.Barrier(2, timeout=60)  # each of the two tasks waits for the other: two pool threads
        threads.run_tasks([both.wait] * 2)
        assert "torch" not in sys.modules, "starting the pool imported torch"
    """)
    environ = {**os.environ, "NUMBA_NUM_THREADS": "2"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=environ)
    assert proc.returncode == 0, proc.stderr[-2000:]


# ----------------------------------------------------------------------------------------------------------------
# torch's OpenMP team (mmaemu.cpu.torch_team)


def run_with_torch(body: str, timeout: float = 120, first: str = ""):
    """``body`` in a fresh interpreter that imported torch, on two threads (``first``: code before PRELUDE's
    call)."""
    code = "import torch\n" + textwrap.dedent(first) + PRELUDE + textwrap.dedent(body)
    environ = {**os.environ, "NUMBA_NUM_THREADS": "2", "OMP_NUM_THREADS": "2"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env=environ)


@pytest.mark.subprocess
def test_with_torch_loaded_a_call_runs_on_torchs_team_not_on_a_pool():
    """Where torch runs on GNU OpenMP, the calling thread and torch's worker take the tasks: no pool thread of
    mmaemu's starts (a pool beside torch's spinning workers was three busy threads on two cores)."""
    result = run_with_torch("""
        import threading
        from mmaemu.cpu import threads, torch_team

        torch_team.LATE_JOIN = 1e9  # on a busy machine too (test_a_late_worker_sends_the_calls_to_the_pool...)
        torch_team.team(2)
        if torch_team._TEAM is not None:
            torch_team._TEAM.avoid_until = None  # a late join in PRELUDE's call
        if torch_team.team(2) is None:
            print("no team:", torch_team.team_decline())
            raise SystemExit(0)
        seen = set()
        both = threading.Barrier(2, timeout=60)  # each of the two tasks waits for the other: two threads at once

        def task():
            seen.add(threading.get_ident())
            both.wait()

        threads.run_tasks([task] * 2)
        gemm(256, 1024, 1024)  # the bits are checked in gemm
        assert threads._POOL is None, "mmaemu's pool started"
        assert threading.get_ident() in seen and len(seen) == 2, seen
        assert len(threading.enumerate()) == 1, threading.enumerate()  # no dummy threads registered
        print("team")
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    if torch_openmp_libgomp():
        assert result.stdout.split() == ["team"], result.stdout


def torch_openmp_libgomp() -> bool:
    """Whether this torch runs on GNU OpenMP from its own lib folder (the CPU wheels on Linux do)."""
    import torch

    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    return ("ATen parallel backend: OpenMP" in torch.__config__.parallel_info()
            and sys.platform.startswith("linux") and any(n.startswith("libgomp") for n in os.listdir(lib)))


@pytest.mark.subprocess
def test_a_member_of_torchs_team_that_flushes_subnormals_takes_no_task():
    """torch's workers started from a flush-to-zero thread keep that mode (mmaemu does not change their state): such
    a worker takes no task; the calling thread, in IEEE mode, takes them all."""
    result = run_with_torch("""
        import threading, time
        from mmaemu.cpu import threads, torch_team
        from mmaemu.base.fpmode import fp32_subnormals_flushed

        torch_team.LATE_JOIN = 1e9  # on a busy machine too
        torch_team.team(2)
        if torch_team._TEAM is not None:
            torch_team._TEAM.avoid_until = None  # a late join in PRELUDE's call
        seen = []

        def task():
            seen.append((threading.get_ident(), fp32_subnormals_flushed()))
            time.sleep(0.02)  # leaves the GIL: a worker that took tasks would take some of these

        threads.run_tasks([task] * 12)
        assert len(seen) == 12 and not any(flushed for _, flushed in seen), seen
        if torch_team.team(2) is not None:
            assert {ident for ident, _ in seen} == {threading.get_ident()}, seen
    """, first="""
        torch.set_flush_denormal(True)
        torch.ones(1 << 22).sum()  # torch's first parallel region: its workers start in this mode
        torch.set_flush_denormal(False)
    """)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.subprocess
def test_a_child_forked_after_calls_on_torchs_team_computes():
    """GNU OpenMP's team does not survive a fork: a child forked after calls on it computes on a pool of its
    own."""
    result = run_with_torch("""
        import os, sys, time
        from mmaemu.cpu import torch_team

        gemm(256, 1024, 1024)
        pid = os.fork()
        if pid == 0:
            gemm(256, 1024, 1024)
            os._exit(0 if torch_team.team(2) is None else 3)
        deadline = time.time() + 30
        while time.time() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            sys.exit("the forked child hung")
        sys.exit(os.waitstatus_to_exitcode(status))
    """)
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])


@pytest.mark.subprocess
def test_an_error_in_a_task_on_torchs_team_reaches_the_caller():
    result = run_with_torch("""
        import threading
        from mmaemu.cpu import threads

        ran = []

        def task(i):
            ran.append(i)
            if i == 3:
                raise ValueError("task 3")

        try:
            threads.run_tasks([lambda i=i: task(i) for i in range(2000)])
        except ValueError as error:
            assert str(error) == "task 3" and 3 in ran and len(ran) < 2000, len(ran)
        else:
            raise AssertionError("no error")
        threads.run_tasks([lambda: None] * 4)  # the team is usable after an error
    """)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.subprocess
def test_a_late_worker_sends_the_calls_to_the_pool_for_a_while():
    """A worker of torch's team that joins LATE_STREAK regions in a row late (no core for it: a busy machine, where
    the caller then waits for it at each region's end) makes the next calls run on mmaemu's pool, until
    AVOID_SECONDS have passed."""
    result = run_with_torch("""
        import time
        from mmaemu.cpu import threads, torch_team

        torch_team.team(2)
        team = torch_team._TEAM
        if team is None:
            raise SystemExit(0)
        team.avoid_until, team.late_streak = None, 0  # late joins in PRELUDE's calls
        torch_team.LATE_JOIN = -1.0  # every join is late
        torch_team.AVOID_SECONDS = 0.5
        for _ in range(torch_team.LATE_STREAK - 1):  # not yet a busy machine
            threads.run_tasks([lambda: None] * 4)
            assert torch_team.team(2) is team
        threads.run_tasks([lambda: None] * 4)
        assert torch_team.team(2) is None and team.avoided()
        threads.run_tasks([lambda: None] * 4)
        assert threads._POOL is not None, "the pool did not take the call"
        time.sleep(0.6)
        assert torch_team.team(2) is team
    """)
    assert result.returncode == 0, result.stderr[-3000:]
