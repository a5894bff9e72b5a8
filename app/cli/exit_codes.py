"""The exit codes every ``branchwise`` command shares."""

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_CRASHED = 70  # EX_SOFTWARE (sysexits.h): an internal software error
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a command ended by Ctrl+C
