import pytest
import torch


@pytest.fixture
def one_thread():
    """Tiny shapes: one thread avoids OpenMP barrier stalls when the shared machine is busy."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
