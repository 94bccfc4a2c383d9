"""Entry point: ``python -I -S boot.py CMD_FD RESP_FD`` (started by the parent's ``Sandbox``).

``-I`` puts no script directory on ``sys.path``, so this file registers its own directory as the
package ``sandbox_child`` by hand: the sibling modules import each other relatively, and nothing
else of the project (``tasks.py`` above all) becomes importable.
"""

import os
import sys
import types

if __name__ == "__main__":
    _package = types.ModuleType("sandbox_child")
    _package.__path__ = [os.path.dirname(os.path.abspath(__file__))]
    sys.modules["sandbox_child"] = _package
    sys.dont_write_bytecode = True  # never write __pycache__ next to the env's sources

    from sandbox_child import supervisor

    supervisor.main(int(sys.argv[1]), int(sys.argv[2]))
