"""Scale-out on Ray Serve: one engine replica per GPU, sessions pinned to their replica, resumes
routed to their owner (``README.md``, "Scaling out"; ``docs/cluster.md``).

* ``duplex.cluster.config``  the ``cluster`` section of the configuration file (Ray-free);
* ``duplex.cluster.replica`` ``DuplexReplica``: one engine and the whole app, behind Serve's proxy;
* ``duplex.cluster.router``  ``SessionRouter``: Serve's request router that pins sessions;
* ``duplex.cluster.relay``   a socket carried to the replica that owns its session;
* ``duplex.cluster.app``     the Serve application (``duplex serve --gpus N``, ``serve deploy``);
* ``duplex.cluster.local``   ``duplex serve --gpus N`` on one host.

Ray is an optional extra (``pip install duplex-runtime[cluster]``): only this package imports it,
and only ``duplex serve`` with more than one GPU imports this package. The package may import the
engine and the server; neither imports it.
"""

from duplex.cluster.config import SECRET_ENV, ClusterConfig, shared_secret

__all__ = ["SECRET_ENV", "ClusterConfig", "shared_secret"]
