"""The package's logger: ``logging.getLogger("gssgd")``, for progress and information.

gssgd tells what it does (the hook's switch from dense warm-up to compression, a loaded
state, the settings a one-call recipe derived) through this logger at ``INFO``; misuse (a
combination of settings that measured badly) stays a ``warnings.warn``. The logger has a
``NullHandler``, so nothing prints unless the application configures logging, e.g.::

    import logging
    logging.basicConfig(level=logging.INFO)            # every library's INFO
    logging.getLogger("gssgd").setLevel(logging.INFO)  # or gssgd's alone
"""

from __future__ import annotations

import logging

__all__ = ["logger"]

#: The logger of every gssgd module (one name, so one setting controls all of it).
logger = logging.getLogger("gssgd")
logger.addHandler(logging.NullHandler())
