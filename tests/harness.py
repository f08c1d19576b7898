"""The rig's processes helpers (``rig.processes``), where the tests have imported them from."""

from rig.processes import (
    ROOT as ROOT,
)
from rig.processes import (
    RedisServer as RedisServer,
)
from rig.processes import (
    Workers as Workers,
)
from rig.processes import (
    _alive as _alive,
)
from rig.processes import (
    _stop as _stop,
)
from rig.processes import (
    database_url_for_workers as database_url_for_workers,
)
from rig.processes import (
    free_port as free_port,
)
from rig.processes import (
    point_celery_at as point_celery_at,
)
from rig.processes import (
    wait_until as wait_until,
)
