"""Two packages whose classes both have an __init__, and module-level code (issue #21 item 2).

Usage: app.py SITE_PACKAGES SECONDS

SITE_PACKAGES holds the packages alpha and beta (copied there from lib/ by the test). The
program spends 2 x SECONDS in alpha.Model.__init__, 1 x SECONDS in beta.Model.__init__ and
1 x SECONDS in tools.util.burn() called at module level, and 1 x SECONDS in this module's own
code, at module level.
"""

import sys
import time

sys.path.insert(0, sys.argv[1])
SECONDS = float(sys.argv[2])

from alpha import Model as AlphaModel  # noqa: E402
from beta import Model as BetaModel  # noqa: E402
from tools.util import burn  # noqa: E402

AlphaModel(2 * SECONDS)
BetaModel(SECONDS)
burn(SECONDS)  # module-level code: a call made by <module>

end = time.thread_time() + SECONDS
while time.thread_time() < end:  # the module's own time
    sum(range(2000))
