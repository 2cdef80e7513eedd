"""The old stack's observation filters, re-exported from :mod:`fastrollout.evaluation.filters`.

``fastrollout.filters`` is the name the guides use; the code lives with the RolloutWorker.
"""

# The module's whole public API, under this name.
from fastrollout.evaluation.filters import *  # noqa: F403
from fastrollout.evaluation.filters import __all__ as __all__
