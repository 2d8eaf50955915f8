"""Choir: agentic work that proves what it did.

Importing ``choir`` stays light: litellm, langgraph and docker are imported only where used.
"""

from choir._version import __version__
from choir.models import Mood, WorkItem

__all__ = [
    "Mood",
    "WorkItem",
    "__version__",
]
