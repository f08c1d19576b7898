"""The rig's network-namespace helpers (``rig.netns``), where the tests have imported them from."""

from rig.netns import (
    HOST as HOST,
)
from rig.netns import (
    Network as Network,
)
from rig.netns import (
    _ip as _ip,
)
from rig.netns import (
    available as available,
)
from rig.netns import (
    network as network,
)
