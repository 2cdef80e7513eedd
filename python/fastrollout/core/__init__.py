"""Names shared by episodes, connectors, modules and runners."""

from fastrollout.core.columns import Columns

__all__ = ["Columns"]
