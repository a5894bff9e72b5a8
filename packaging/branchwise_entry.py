"""PyInstaller entry point for the frozen Branchwise app.

The engine runs in a child process started with the ``spawn`` method. In a frozen
app that child is this same executable re-run with multiprocessing's arguments, so
``multiprocessing.freeze_support()`` must run before anything else: it turns the
child into the engine worker instead of a second window. (The bundled default model
at ``<bundle>/models/`` is found by engine/model_file.py's ``default_model_path()``.)
"""

import multiprocessing
import sys

if __name__ == "__main__":
    multiprocessing.freeze_support()

    from app.cli import main

    sys.exit(main())
