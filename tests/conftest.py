import contextlib

import pytest


@contextlib.contextmanager
def _cluster_client():
    """A real LocalCluster with one LEARNER and two EXPLORER worker processes, and its client."""
    from distributed import Client

    from tianji_dask.launch.cluster import local_cluster

    cluster = local_cluster(explorer_workers=2, dashboard_address=None)
    client = Client(cluster)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


@pytest.fixture(scope="session")
def tianji_client():
    """The cluster most tests share."""
    with _cluster_client() as client:
        yield client


@pytest.fixture
def own_client():
    """A cluster of its own, for tests that kill worker processes (the shared one stays whole)."""
    with _cluster_client() as client:
        yield client

def settle(client, timeout: float = 120) -> None:
    """Wait until the shared cluster has its learner and both explorers back and answering (a test
    that kills worker processes leaves their nannies restarting them)."""
    import time

    deadline = time.time() + timeout
    while time.time() < deadline:
        workers = client.scheduler_info(n_workers=-1)["workers"].values()
        roles = sorted(next(iter(w["resources"]), "") for w in workers)
        if roles == ["EXPLORER", "EXPLORER", "LEARNER"]:
            client.run(lambda: None)  # every worker answers
            return
        time.sleep(0.2)
    seen = {a: (w["name"], w["resources"]) for a, w in client.scheduler_info(n_workers=-1)["workers"].items()}
    raise TimeoutError(f"the test cluster did not settle in {timeout:.0f}s: {seen}")


@pytest.fixture(scope="module")
def one_torch_thread():
    """As in the roles that host the algorithms: tiny ops run fastest on one thread."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
