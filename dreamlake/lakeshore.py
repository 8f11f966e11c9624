"""``import dreamlake.lakeshore as dls`` is ``import lakeshore as dls``: the same module object."""

import sys

import lakeshore

sys.modules[__name__] = lakeshore
