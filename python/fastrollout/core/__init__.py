"""Names shared by episodes, connectors, modules and runners."""

from fastrollout.core.columns import Columns

# The module id of a single-agent runner's only module (RLlib's name for it).
DEFAULT_MODULE_ID = "default_policy"

__all__ = ["DEFAULT_MODULE_ID", "Columns"]
