"""``podsrl.trl`` is :mod:`podsrl.integrations.trl` (the path users' scripts import): this
module replaces itself with that one, so both names are the same module object."""

import sys

from podsrl.integrations import trl as _integration

sys.modules[__name__] = _integration
