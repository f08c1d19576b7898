"""The rig's ha helpers (``rig.ha``), where the tests have imported them from."""

from rig.ha import (
    _MIGRATED as _MIGRATED,
)
from rig.ha import (
    DATABASE as DATABASE,
)
from rig.ha import (
    DISCOVERY as DISCOVERY,
)
from rig.ha import (
    INTERVAL as INTERVAL,
)
from rig.ha import (
    MAKE_ADMIN_TOKEN as MAKE_ADMIN_TOKEN,
)
from rig.ha import (
    PASSWORD as PASSWORD,
)
from rig.ha import (
    PG_OS_USER as PG_OS_USER,
)
from rig.ha import (
    QUEUE as QUEUE,
)
from rig.ha import (
    ROLE as ROLE,
)
from rig.ha import (
    SECRET as SECRET,
)
from rig.ha import (
    TIMEOUT as TIMEOUT,
)
from rig.ha import (
    Cluster as Cluster,
)
from rig.ha import (
    NodeProcess as NodeProcess,
)
from rig.ha import (
    Pair as Pair,
)
from rig.ha import (
    Publisher as Publisher,
)
from rig.ha import (
    WebServer as WebServer,
)
from rig.ha import (
    WritableProbe as WritableProbe,
)
from rig.ha import (
    as_owner as as_owner,
)
from rig.ha import (
    ha_pair as ha_pair,
)
from rig.ha import (
    make_queue as make_queue,
)
from rig.ha import (
    migrated_cluster as migrated_cluster,
)
from rig.ha import (
    payloads_in as payloads_in,
)
from rig.ha import (
    pg_bindir as pg_bindir,
)
from rig.ha import (
    process_env as process_env,
)
from rig.ha import (
    serve_the_pair as serve_the_pair,
)
from rig.ha import (
    shell as shell,
)
from rig.ha import (
    start_pair as start_pair,
)
