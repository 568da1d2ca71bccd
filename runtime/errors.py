"""The runtime's one user-facing error type.

Why its own: ngcx-runtime ships inside slim images without the `ngcx` package, but follows the
same rule: bad input gets one clear line and exit code 2, never a traceback.
"""

from __future__ import annotations


class RuntimeUserError(Exception):
    """A problem the user can fix (bad model file, wrong flag, plan built for another GPU).

    The message is one line: what is wrong, where, and how to fix it. cli.main prints it and
    exits 2.
    """


class InvalidInput(Exception):  # noqa: N818 - the name a handler author reads in their code
    """Raised by a handler's predict() for a request the CLIENT got wrong (an image that does not
    decode, text too long): the server answers 400 with this message to that request alone, and
    requests merged into the same batch are run again without it (batching.py)."""
