"""pytest fixtures for the fastattn tests (the helpers are in fa_testutil.py)."""
import zlib

import numpy as np
import pytest

from fa_testutil import reference


@pytest.fixture
def rng(request):
    """A NumPy Generator seeded from the test's node id (reproducible per test)."""
    seed = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng(seed)


@pytest.fixture(scope="session")
def ref():
    return reference
