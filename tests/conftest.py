import pytest


@pytest.fixture(scope="session")
def tianji_client():
    """A real LocalCluster with one LEARNER and two EXPLORER worker processes, shared by tests."""
    from distributed import Client

    from tianji_dask.cluster import local_cluster

    cluster = local_cluster(explorer_workers=2, dashboard_address=None)
    client = Client(cluster)
    yield client
    client.close()
    cluster.close()
