"""Old path of :mod:`choir.executors._python_child`, kept for one release.

``python -m choir._exec_python module:function`` still runs the child; imported, it is the
very same module object.
"""

import sys

from choir.executors import _python_child as _moved

if __name__ == "__main__":
    sys.exit(_moved.main(sys.argv[1:]))
sys.modules[__name__] = _moved
