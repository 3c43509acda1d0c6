"""Shared fixtures for the benchmarks, and the ratio table printed at the end of a run.

Every benchmark records its median under a (group, label) key; the summary prints each label's median
as a ratio to the group's baseline (a LAPACK Cholesky of the same K), so the figures mean the same
on a fast or a slow, quiet or busy machine.  BLAS threads are pinned to ``GPC_BENCH_THREADS`` (default 1)
for both sides of every comparison (threadpoolctl).
"""

import os

import pytest

MEDIANS = {}
THREADS = int(os.environ.get("GPC_BENCH_THREADS", "1"))

@pytest.fixture(scope="session", autouse=True)
def pinned_threads():
    from threadpoolctl import threadpool_limits
    with threadpool_limits(THREADS):
        yield

@pytest.fixture
def record(benchmark, request):
    """Run ``benchmark.pedantic`` and remember the median under the benchmark's group."""

    def run(label, fn, rounds=5, warmup=1):
        result = benchmark.pedantic(fn, rounds=rounds, warmup_rounds=warmup, iterations=1)
        if benchmark.stats is not None:  # None with --benchmark-disable
            MEDIANS.setdefault(benchmark.group, {})[label] = benchmark.stats.stats.median
        return result

    return run

def pytest_terminal_summary(terminalreporter):
    if not MEDIANS:
        return
    tr = terminalreporter
    tr.section(f"gpc ratios (medians; BLAS threads = {THREADS})")
    for group in sorted(MEDIANS):
        meds = MEDIANS[group]
        base = meds.get("lapack dpotrf")
        tr.write_line(f"[{group}]")
        for label, med in sorted(meds.items(), key=lambda kv: kv[1]):
            ratio = f"{med / base:8.2f} x dpotrf" if base else ""
            tr.write_line(f"  {label:<44} {med * 1e3:10.1f} ms {ratio}")
        if "sklearn" in " ".join(meds):
            sk = [v for k, v in meds.items() if k.startswith("sklearn")]
            for label, med in meds.items():
                if label.startswith("gpc"):
                    tr.write_line(f"  {label} / sklearn = {med / sk[0]:.3f}")
