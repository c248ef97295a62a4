"""Options of the benchmark suite (bench/test_bench.py)."""
import pytest


def pytest_addoption(parser):
    parser.addoption("--bench-threads", type=int, default=2,
                     help="threads for fastattn in bench/ (default 2, the standard cases' setting)")


@pytest.fixture(scope="session")
def bench_threads(request):
    return request.config.getoption("--bench-threads")
