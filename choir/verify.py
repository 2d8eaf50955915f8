"""Old import path, kept for one release: the very same module object as the new one.

Aliasing (rather than re-exporting) keeps every name, private ones and monkeypatching included.
"""

import sys

from choir.app import verify as _moved

sys.modules[__name__] = _moved
