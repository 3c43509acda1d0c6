"""What both sparse models' distributed fits share (gpc.distributed): what the master sends to the
shards of q and the factor, and how the sites come home at the end of a fit."""

import copy

from ...distributed import DistributedError

#: seconds an interrupted fit waits for its sites (:func:`sites_home`)
INTERRUPTED_WAIT = 10.0


def sites_home(engine, home, interrupted):
    """Every shard's ``home(sites)`` (``engine.sites``), or None when the fit was interrupted and
    the cluster did not answer within INTERRUPTED_WAIT seconds: after a Ctrl-C nothing is
    recovered, because a Ctrl-C in the terminal of a LocalCluster reaches its workers too and
    rebuilding their shards would wait for workers that are gone."""
    try:
        return engine.sites(home, **({"timeout": INTERRUPTED_WAIT, "recover": False}
                                     if interrupted else {}))
    except DistributedError:
        if not interrupted:
            raise
        return None


def light(q, factor):
    """q and the factor without what the shards do not read (P, K_uu): less to send per step."""
    q, factor = copy.copy(q), copy.copy(factor)
    if q is not None:
        q.P = None
    factor.Kuu = None
    return q, factor
