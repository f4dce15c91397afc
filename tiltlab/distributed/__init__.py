"""Tilted objectives, risks and solvers on Dask (laptop ``LocalCluster`` or a real cluster).

Dask arrays reach this package through the dispatch tables of the layers below it: the
objective's engine table (:class:`tiltlab.TiltedObjective` evaluations go to the Dask
engine), the solvers' driver table (:func:`tiltlab.minimize`), and the risk functions
(:func:`tiltlab.tilted_risk`, :func:`tiltlab.hierarchical_risk`):

* every evaluation of a linear-predictor objective (value, value and gradient,
  Hessian-vector product, dense Hessian) is **one task graph**: per row chunk a tilted
  accumulator state, merged by a tree reduction (for a hierarchy: per-group states, then
  in the same graph one product ``X_b^T c`` per chunk with each sample's final weight);
  only scalars and ``d``-vectors reach the client. The objective's methods return lazy
  Dask arrays whose graph is the whole evaluation: nothing runs at call time, and
  ``dask.compute(*obj.value_and_gradient(theta))`` runs one graph (each result computed
  on its own runs the evaluation again);
* ``tilted_risk`` / ``hierarchical_risk`` of Dask losses return lazy Dask arrays whose
  graph is the same per-chunk reduction (nothing is computed at call time; see
  :func:`dask_tilted_risk` and :func:`dask_hierarchical_risk` for the cases covered);
* ``minimize`` drives its solvers from the client: the ``d``-dimensional algebra runs in
  NumPy and each evaluation (including every line-search trial) calls the cluster once.

The user guide's page *Scale-out with Dask* walks through a fit on a laptop cluster.
"""

from ..risk import HIERARCHICAL_RISK, TILTED_RISK, TILTED_WEIGHTS
from ._api import objective_call
from ._chunk_engine import CHUNK_ROUTES, DECLINE, ChunkRoute
from ._objective import DaskPlan, distribute, evaluate, supported
from ._risk import dask_hierarchical_risk, dask_tilted_risk, dask_tilted_weights
from ._solvers import ClientObjective, client_minimize, is_dask_objective

TILTED_RISK.register("dask", dask_tilted_risk)
HIERARCHICAL_RISK.register("dask", dask_hierarchical_risk)
TILTED_WEIGHTS.register("dask", dask_tilted_weights)

__all__ = [
    "CHUNK_ROUTES",
    "DECLINE",
    "ChunkRoute",
    "ClientObjective",
    "DaskPlan",
    "client_minimize",
    "dask_hierarchical_risk",
    "dask_tilted_risk",
    "distribute",
    "evaluate",
    "is_dask_objective",
    "objective_call",
    "supported",
]
