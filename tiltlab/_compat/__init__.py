"""The ground floor: array namespaces, devices, argument parsing, validation, pickling.

Every public function of tiltlab resolves its array namespace, device and floating dtype
through the helpers here, so that NumPy, CuPy, PyTorch, array-api-strict and Dask inputs
are handled in one way and a result always lives in the namespace, dtype and device of its
input. The package is the only place that imports ``array_api_compat``
(:mod:`~tiltlab._compat.namespaces`); its modules are

* :mod:`~tiltlab._compat.namespaces`: which library an array belongs to, its device, what
  the library can do (lazy evaluation, writes through ``out=``, a GPU device);
* :mod:`~tiltlab._compat.parsing`: user input as arrays of one namespace, and parameters
  (tilts, thresholds, penalties) as numbers;
* :mod:`~tiltlab._compat.validation`: finite values, non-negative prior weights;
* :mod:`~tiltlab._compat.pickling`: objects that hold a namespace pickle by its name.
"""

from __future__ import annotations

from .namespaces import (
    apply_inplace,
    array_namespace,
    array_result,
    default_float,
    device,
    float_dtype,
    is_array_api_obj,
    is_cupy_namespace,
    is_dask_namespace,
    is_jax_namespace,
    is_lazy,
    is_numpy_namespace,
    is_torch_namespace,
    library_namespace,
    materialize,
    namespace_of,
    on_accelerator,
    size,
    tiny_sqrt,
    to_device,
    to_numpy,
    writes_in_place,
)
from .parsing import (
    as_array,
    as_float_array,
    as_parameter,
    host_labels,
    host_real,
    normalize_axis,
    real_number,
    scalar,
    seq_of_arrays,
)
from .pickling import PicklableNamespace
from .pickling import _ModuleRef as _ModuleRef  # the name older pickles refer to
from .validation import check_finite, check_nonneg_weights

__all__ = [
    "array_namespace",
    "namespace_of",
    "device",
    "size",
    "to_numpy",
    "default_float",
    "float_dtype",
    "as_float_array",
    "as_array",
    "check_finite",
    "check_nonneg_weights",
    "real_number",
    "as_parameter",
    "host_labels",
    "host_real",
    "PicklableNamespace",
    "scalar",
    "is_lazy",
    "materialize",
    "is_numpy_namespace",
    "is_cupy_namespace",
    "is_torch_namespace",
    "is_dask_namespace",
    "is_array_api_obj",
    "apply_inplace",
    "array_result",
    "is_jax_namespace",
    "library_namespace",
    "normalize_axis",
    "on_accelerator",
    "seq_of_arrays",
    "tiny_sqrt",
    "to_device",
    "writes_in_place",
]
