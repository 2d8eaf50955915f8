"""A real TLS Dask cluster for the distributed tests: a scheduler and two worker processes
(``choir.distributed.local_cluster``), its CA in a folder of its own so that every test's
private ``CHOIR_HOME`` reaches it through ``CHOIR_SCHEDULER_CERTS``."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from choir.distributed.local_cluster import LocalCluster


def need_bwrap() -> None:
    if not shutil.which("bwrap"):
        if os.environ.get("CI"):
            pytest.fail("CI is set but bubblewrap is not installed")
        pytest.skip("bubblewrap is not installed")


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    from choir.distributed.local_cluster import LocalCluster
    from choir.distributed.pki import ClusterPKI

    need_bwrap()
    root = tmp_path_factory.mktemp("dask")
    with LocalCluster(root / "cluster", workers=2, threads=2,
                      pki=ClusterPKI(root / "certs")) as running:
        yield running


@pytest.fixture
def cluster(dask_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> LocalCluster:
    """The module's cluster, named by ``CHOIR_SCHEDULER`` with its certificates."""
    from choir.distributed.pki import CERTS_ENV

    monkeypatch.setenv("CHOIR_SCHEDULER", dask_cluster.address)
    monkeypatch.setenv(CERTS_ENV, str(dask_cluster.pki.directory))
    return dask_cluster
