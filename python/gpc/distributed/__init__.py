"""Distributed training engines (SEP §2.3, Fig. 1 right): K shards of the data and their sites, one master q.

``make_engine(client=None, n_shards=1)`` returns an `InProcessEngine` (shards in a list, steps in order) or,
given a ``dask.distributed.Client``, a `DaskEngine` (shards persisted on the workers, pure step tasks).
Both run the same step function and add its partial results in shard order, so they agree to rounding.
``open_client`` and ``local_cluster`` start a client on a loopback ``LocalCluster`` (or connect to a
running scheduler).  See docs/distributed.md.
"""

from ._engine import InProcessEngine, add_partials, shard_bounds
from ._dask import INSTALL_HINT, DaskEngine, DistributedError, local_cluster, open_client

__all__ = ["InProcessEngine", "DaskEngine", "DistributedError", "make_engine", "add_partials", "shard_bounds",
           "open_client", "local_cluster"]


def make_engine(client=None, n_shards=None, timeout=300.0):
    """The engine for ``client``: in-process when it is None, Dask otherwise.

    Parameters
    ----------
    client : dask.distributed.Client, an engine, or None, default=None
        The cluster to run on; None runs the shards in this process, one after another; an
        `InProcessEngine` or `DaskEngine` is returned as it is.
    n_shards : int or None, default=None
        Number of row shards; None means one per worker (one in process).
    timeout : float, default=300.0
        Seconds any wait on the cluster may take before a ``DistributedError``.

    Returns
    -------
    InProcessEngine or DaskEngine

    Raises
    ------
    ImportError
        Naming ``pip install "gpc[distributed]"`` when a client is given but dask.distributed is
        not installed.
    """
    if client is None:
        return InProcessEngine(1 if n_shards is None else n_shards)
    if isinstance(client, (InProcessEngine, DaskEngine)):   # an engine made by the caller
        return client
    return DaskEngine(client, n_shards=n_shards, timeout=timeout)
