"""Lazaretto settings. Every deployment-specific value comes from the
environment (see .env.example); a bad value stops start-up naming the
variable."""

import socket
from datetime import timedelta
from pathlib import Path

import environ
from celery.schedules import crontab

from console.env import (
    env_address,
    env_bool,
    env_choice,
    env_database,
    env_file,
    env_float,
    env_int,
    env_list,
    env_networks,
    env_optional_database,
    env_path,
    env_rate,
    env_redis_url,
    env_secret,
    env_spark_master,
    env_spark_remote,
    env_str,
    next_redis_database,
)
from console.logs import LOG_FORMATS, configure_structlog, logging_config

BASE_DIR = Path(__file__).resolve().parent.parent

# A .env file (see .env.example) fills in what the real environment leaves unset.
if (BASE_DIR / ".env").is_file():
    environ.Env.read_env(BASE_DIR / ".env")

DEBUG = env_bool("DEBUG", default=False)
# A fixed key is acceptable only for a local DEBUG run; anywhere else the key
# must come from the environment.
SECRET_KEY = env_str("SECRET_KEY", "insecure-local-debug-key" if DEBUG else None)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])

# HTTPS only, unless told otherwise: with DEBUG off every one of these
# defaults to what production needs (`manage.py check --deploy` is clean);
# a local plain-http run turns them off explicitly (scripts/run.sh does so
# for `make run`).
_PRODUCTION = not DEBUG
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", _PRODUCTION)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", _PRODUCTION)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", _PRODUCTION)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31_536_000 if _PRODUCTION else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", _PRODUCTION)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", _PRODUCTION)
# Behind a proxy that terminates TLS and sets X-Forwarded-Proto (and strips
# it from clients): without this, every request looks like plain http and
# SECURE_SSL_REDIRECT redirects forever.
if env_bool("TRUST_X_FORWARDED_PROTO", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# Load balancers and Prometheus probe over plain http, from inside.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]

DATABASES = {"default": env_database("DATABASE_URL")}
DATABASES["default"]["CONN_MAX_AGE"] = 60
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# Django's own queries bind parameters on the client and are never prepared,
# whatever this says; it lets the delivery path prepare its claim and ack
# (broker.services.transitions.in_flight), which Django's default (None)
# forbids on the whole connection. A connection pooler in transaction mode
# between workers and PostgreSQL must support prepared statements (PgBouncer
# 1.21 or later).
DATABASES["default"].setdefault("OPTIONS", {}).setdefault("prepare_threshold", 5)

CELERY_BROKER_URL = env_redis_url("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0")
DUMP_DIR = env_path("DUMP_DIR", BASE_DIR / "var" / "dumps", base=BASE_DIR)
SPARK_MASTER = env_spark_master("SPARK_MASTER", "local[*]")
# A Spark Connect server (sc://host:port) that runs the Spark jobs instead: the
# driver process is then a thin client, with no JVM of its own, and SPARK_MASTER
# is the server's business (workers.spark.connect_server starts one).
SPARK_REMOTE = env_spark_remote("SPARK_REMOTE")
# PostgreSQL's JDBC driver, which Spark jobs read and write the database with
# (Debian's libpostgresql-jdbc-java; scripts/spark.sh installs it).
SPARK_JDBC_JAR = env_file("SPARK_JDBC_JAR", Path("/usr/share/java/postgresql.jar"), base=BASE_DIR)
# Where the archive keeps delivered and failed messages, as Parquet files
# partitioned by queue and day.
ARCHIVE_DIR = env_path("ARCHIVE_DIR", BASE_DIR / "var" / "archive", base=BASE_DIR)

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "axes",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "template_partials",
    "django_celery_beat",
    "broker",
    "workers",
    "console",
]

MIDDLEWARE = [
    "console.middleware.StoreDeadlineMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "console.middleware.TimeZoneMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "console.middleware.RefusalMiddleware",
    "console.middleware.EmptyQueryParameterMiddleware",
    # Last, as django-axes asks: it answers a locked-out sign-in.
    "axes.middleware.AxesMiddleware",
]

# Failed sign-ins are counted per user name and per address (django-axes):
# past LAZARETTO_LOGIN_FAILURE_LIMIT failures either is refused, the right
# password too, for LAZARETTO_LOGIN_LOCKOUT_MINUTES after the last failure;
# each lockout is an audit event (console.logins).
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("LAZARETTO_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("LAZARETTO_LOGIN_LOCKOUT_MINUTES", 15))
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_RESET_ON_SUCCESS = True
AXES_CLIENT_IP_CALLABLE = "console.client.client_ip"
AXES_LOCKOUT_CALLABLE = "console.logins.locked_out"
AXES_VERBOSE = False

ROOT_URLCONF = "console.urls"
WSGI_APPLICATION = "console.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.roles.role_context",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"

# Single sign-on with OpenID Connect (console.oidc), on when an issuer is
# set: a "Sign in with LAZARETTO_OIDC_NAME" button beside the password form,
# which LAZARETTO_LOCAL_LOGIN=false takes away. The provider's endpoints are
# those of its /.well-known/openid-configuration.
LAZARETTO_LOCAL_LOGIN = env_bool("LAZARETTO_LOCAL_LOGIN", True)
LAZARETTO_OIDC_ISSUER = env_str("LAZARETTO_OIDC_ISSUER", "")
LAZARETTO_OIDC_NAME = env_str("LAZARETTO_OIDC_NAME", "single sign-on")
# The claim naming the user (their Lazaretto user name), and the one listing
# their groups: those naming a Lazaretto group (a team, or a role) are theirs.
LAZARETTO_OIDC_USERNAME_CLAIM = env_str("LAZARETTO_OIDC_USERNAME_CLAIM", "preferred_username")
LAZARETTO_OIDC_GROUPS_CLAIM = env_str("LAZARETTO_OIDC_GROUPS_CLAIM", "groups")
if LAZARETTO_OIDC_ISSUER:
    AUTHENTICATION_BACKENDS.append("console.oidc.OidcBackend")
    OIDC_RP_CLIENT_ID = env_str("LAZARETTO_OIDC_CLIENT_ID")
    OIDC_RP_CLIENT_SECRET = env_str("LAZARETTO_OIDC_CLIENT_SECRET")
    OIDC_RP_SIGN_ALGO = env_str("LAZARETTO_OIDC_SIGN_ALGO", "RS256")
    OIDC_RP_SCOPES = env_str("LAZARETTO_OIDC_SCOPES", "openid profile email")
    OIDC_OP_AUTHORIZATION_ENDPOINT = env_str("LAZARETTO_OIDC_AUTHORIZATION_ENDPOINT")
    OIDC_OP_TOKEN_ENDPOINT = env_str("LAZARETTO_OIDC_TOKEN_ENDPOINT")
    OIDC_OP_USER_ENDPOINT = env_str("LAZARETTO_OIDC_USERINFO_ENDPOINT")
    OIDC_OP_JWKS_ENDPOINT = env_str("LAZARETTO_OIDC_JWKS_ENDPOINT")
    OIDC_USE_PKCE = True
    OIDC_TIMEOUT = env_float("LAZARETTO_OIDC_TIMEOUT_SECONDS", 5.0)
    LOGIN_REDIRECT_URL_FAILURE = "/login/?sso=failed"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
# Served by whitenoise from STATIC_ROOT, which `collectstatic` fills (run.sh
# and the Dockerfile run it before serving): compressed copies made once,
# nothing looked up per request. Only a DEBUG run serves straight from the
# source directories, so an edit shows without collecting again.
WHITENOISE_USE_FINDERS = DEBUG
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # htmx reads the token from <body hx-headers>, not the cookie
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True

# The largest request body Django reads into memory. A publish batch of up to
# 1000 messages must fit; anything bigger is answered 413 by the API.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("API_MAX_BODY_BYTES", 64 * 1024 * 1024)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # Token first: an anonymous API call is answered 401 with a
        # WWW-Authenticate header rather than 403.
        "console.api.auth.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["console.roles.HasRole"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["console.api.parsers.JSONParser"],
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "console.api.errors.exception_handler",
    "DEFAULT_THROTTLE_CLASSES": ["console.api.throttles.ClientRateThrottle"],
}

# Each API token (or console user) may make this many requests per second,
# minute, hour or day ("N/s", "N/min", "N/hour", "N/day"); more are answered
# 429 with Retry-After. The count lives in the cache below, shared by every
# web process.
LAZARETTO_API_RATE = env_rate("LAZARETTO_API_RATE", "6000/min")

CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        # By default the broker's Redis, one database up: a cache may be
        # cleared, the broker's queues never.
        "LOCATION": env_redis_url("CACHE_URL", next_redis_database(CELERY_BROKER_URL)),
        "KEY_PREFIX": "lazaretto",
        "OPTIONS": {"socket_connect_timeout": 2, "socket_timeout": 2},
    }
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Lazaretto API",
    "DESCRIPTION": "Queues, messages and their quarantine.",
    "VERSION": "1",
    # 3.1 (JSON Schema 2020-12): an object's keys can be constrained too
    # (propertyNames), so the schema states what a message header's name may be.
    "OAS_VERSION": "3.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["console.roles.HasRole"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Requests and responses as separate components: what a client sends
    # (no read-only fields, nothing blank) is not what it reads back.
    "COMPONENT_SPLIT_REQUEST": True,
    # A replay job's status, in the job and in a schedule's last job: one enum.
    "ENUM_NAME_OVERRIDES": {
        "ReplayJobStatusEnum": "broker.models.ReplayJobStatus",
        # A grant's role, and the most a narrowed token may hold.
        "QueueRoleEnum": ["viewer", "operator", "admin"],
    },
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "console.api.schema.add_error_responses",
        "console.api.schema.close_request_bodies",
        "console.api.schema.split_request_shapes",
        "console.api.schema.nonempty_query_strings",
        "console.api.schema.nulls_as_openapi_31",
    ],
}

# LOG_FORMAT=json: every line of every process (web, workers, beat) one JSON
# object; text (the default) stays human-readable (console.logs).
LOG_FORMAT = env_choice("LOG_FORMAT", "text", LOG_FORMATS)
LOGGING = logging_config(log_format=LOG_FORMAT)
configure_structlog()

# /metrics (Prometheus): answered to a request bearing this token
# ("Authorization: Bearer …"; blank: no token accepted) or coming from one
# of these networks (the client's address: see LAZARETTO_TRUSTED_PROXIES).
METRICS_TOKEN = env_str("METRICS_TOKEN", "")
METRICS_ALLOWED_NETWORKS = env_networks("METRICS_ALLOWED_NETWORKS", ["127.0.0.0/8", "::1/128"])
# Reverse proxies in front of the web (console.client): a request connecting
# from one of these networks is taken to come from the address its
# X-Forwarded-For names (the last hop not itself a trusted proxy). /metrics,
# the login throttle and the audit log see that address. Empty (the
# default): X-Forwarded-For, which any client may send, is never read.
LAZARETTO_TRUSTED_PROXIES = env_networks("LAZARETTO_TRUSTED_PROXIES", [])
# Where webhooks (a queue's consumer URL, the alarm webhook) may post besides
# public addresses (broker.outbound): loopback, link-local, private,
# multicast and unspecified addresses are refused unless their network is
# listed here (CIDR, comma-separated; make run lists what its demo needs).
LAZARETTO_WEBHOOK_ALLOWED_NETWORKS = env_networks("LAZARETTO_WEBHOOK_ALLOWED_NETWORKS", [])

# Lazaretto's own defaults.
LAZARETTO_DEFAULT_DEAD_LETTER_QUEUE = "SYSTEM.DEAD.LETTER.QUEUE"
# This instance's name in dead-letter rules (DESTQM, INPUTQM, FWDQM), as a
# queue manager's name is in IBM MQ.
LAZARETTO_INSTANCE_NAME = env_str("LAZARETTO_INSTANCE_NAME", socket.gethostname())
LAZARETTO_MAX_PUBLISH_BATCH = 1000
# The largest JSON Lines file an import accepts (console upload, API body).
LAZARETTO_MAX_IMPORT_BYTES = env_int("LAZARETTO_MAX_IMPORT_BYTES", 64 * 1024 * 1024, minimum=1)
# Modules imported at start-up by every process (web and workers) whose
# @broker.consumers.register handlers queues may then name; a module that
# cannot be imported or a handler name registered twice stops start-up.
# Set and empty means none, as unset does.
LAZARETTO_CONSUMER_MODULES = (
    env_list("LAZARETTO_CONSUMER_MODULES", []) if env_str("LAZARETTO_CONSUMER_MODULES", "") else []
)

# Celery: tasks are acknowledged after they run so a killed worker's task is
# redelivered; one task at a time per process so a crash affects one batch.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_DEFAULT_QUEUE = "deliveries"
CELERY_TASK_ROUTES = {
    "lazaretto.replay_job": {"queue": "pipeline"},
    "lazaretto.archive": {"queue": "pipeline"},
    "lazaretto.sweep": {"queue": "control"},
    "lazaretto.dispatch": {"queue": "control"},
    "lazaretto.notify_alarms": {"queue": "control"},
    "lazaretto.check_alerts": {"queue": "control"},
    "lazaretto.start_jobs": {"queue": "control"},
    "lazaretto.replay_schedule_fire": {"queue": "control"},
}
# Wake-ups are hints: a publish must never wait for Redis. ``max_retries``
# 0: a send finding the connection gone tries to connect once, where kombu
# would retry for the connect timeout (4 s) on every send while Redis is
# down. (A worker's own connection is retried by Celery, unchanged.)
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "socket_connect_timeout": 1,
    "socket_timeout": 2,
    "max_retries": 0,
}

LAZARETTO_SWEEP_INTERVAL_SECONDS = env_float("LAZARETTO_SWEEP_INTERVAL_SECONDS", 1.0)
LAZARETTO_DISPATCH_INTERVAL_SECONDS = env_float("LAZARETTO_DISPATCH_INTERVAL_SECONDS", 1.0)
LAZARETTO_DEAD_LETTER_SCAN_SECONDS = env_float("LAZARETTO_DEAD_LETTER_SCAN_SECONDS", 5.0)
# How often the start of a queued bulk or replay job that Redis refused is
# sent again; one sent but not yet started is sent again after
# LAZARETTO_JOB_RESEND_SECONDS (Redis may have lost it in a restart, or it
# waits behind a long job: a start that arrives twice runs the job once).
LAZARETTO_JOB_START_INTERVAL_SECONDS = env_float("LAZARETTO_JOB_START_INTERVAL_SECONDS", 5.0)
LAZARETTO_JOB_RESEND_SECONDS = env_float("LAZARETTO_JOB_RESEND_SECONDS", 600.0)
# Where poison alarms (messages quarantined or purged automatically) are
# posted as JSON, unless a queue names its own alarm webhook; blank: nowhere.
LAZARETTO_ALARM_WEBHOOK_URL = env_str("LAZARETTO_ALARM_WEBHOOK_URL", "")
# Signs every alarm POST as a queue's webhook secret signs its deliveries
# (Lazaretto-Timestamp and Lazaretto-Signature); blank: unsigned. At least
# 16 characters, as a queue's.
LAZARETTO_ALARM_WEBHOOK_SECRET = env_secret("LAZARETTO_ALARM_WEBHOOK_SECRET", 16)
# An alarm (or alert) whose webhook failed this many times is given up on
# (failed; the alarm itself stays). Tries are 2, 4, 8, … seconds apart, at
# most LAZARETTO_ALARM_RETRY_MAX_SECONDS.
LAZARETTO_ALARM_NOTIFY_ATTEMPTS = env_int("LAZARETTO_ALARM_NOTIFY_ATTEMPTS", 10)
LAZARETTO_ALARM_RETRY_MAX_SECONDS = env_float("LAZARETTO_ALARM_RETRY_MAX_SECONDS", 300.0)
# An alarm webhook has this long to accept the connection, and again to answer.
LAZARETTO_ALARM_WEBHOOK_TIMEOUT_SECONDS = env_float("LAZARETTO_ALARM_WEBHOOK_TIMEOUT_SECONDS", 5.0)
# How often beat has due alarms posted (the sweeper also asks at once after
# setting a message aside).
LAZARETTO_ALARM_NOTIFY_INTERVAL_SECONDS = env_float("LAZARETTO_ALARM_NOTIFY_INTERVAL_SECONDS", 2.0)
# How often the control worker checks the queues' alert thresholds
# (broker.services.alerts): an alert fires or resolves within this of the
# reading crossing its threshold, plus the counters' own delay.
LAZARETTO_ALERT_CHECK_INTERVAL_SECONDS = env_float("LAZARETTO_ALERT_CHECK_INTERVAL_SECONDS", 1.0)
# Up to this many delivery tasks work on one queue at once while it has a backlog.
LAZARETTO_DELIVERY_FANOUT = env_int("LAZARETTO_DELIVERY_FANOUT", 4)
# A delivery task keeps claiming batches of its queue for up to this long,
# then hands over to a fresh task (Celery's per-task cost is paid per second,
# not per batch).
LAZARETTO_DELIVERY_TASK_SECONDS = env_float("LAZARETTO_DELIVERY_TASK_SECONDS", 1.0)
# A delivery task is killed (Celery's hard time limit) once it runs its loop
# budget plus the queue's lease_seconds, which the sweeper counts as a
# timeout. A delivery whose worker is still alive this much later than that
# is taken back too (broker.services.sweeper.overdue_seconds).
LAZARETTO_LEASE_GRACE_SECONDS = 2
# The data pipeline (workers.spark). Delivered and failed messages older than
# this many days (a queue's archive_retention_days wins) go to the archive.
LAZARETTO_ARCHIVE_RETENTION_DAYS = env_int("LAZARETTO_ARCHIVE_RETENTION_DAYS", 7)
# Rows one archive step writes, verifies and deletes before the next.
LAZARETTO_ARCHIVE_CHUNK_ROWS = env_int("LAZARETTO_ARCHIVE_CHUNK_ROWS", 200_000)
# A replay job reads, routes and writes its source in id ranges of about this
# many messages; progress is stored after each.
LAZARETTO_REPLAY_SLICE_ROWS = env_int("LAZARETTO_REPLAY_SLICE_ROWS", 250_000)
# JDBC partitions (parallel connections) a Spark job reads one range with.
LAZARETTO_SPARK_PARTITIONS = env_int("LAZARETTO_SPARK_PARTITIONS", 4)
LAZARETTO_SPARK_DRIVER_MEMORY = env_str("LAZARETTO_SPARK_DRIVER_MEMORY", "2g")
# Keep a driver process started ahead of the next Spark job (Python, Django
# and the Spark client loaded), which the job's launch takes instead of
# starting one: about a second sooner to its first row, for one idle process.
LAZARETTO_SPARK_STANDBY = env_bool("LAZARETTO_SPARK_STANDBY", True)
# Extra JVM options for the Spark driver (in local mode, the executors too);
# the test suite uses -XX:TieredStopAtLevel=1, which halves a small job's start-up.
LAZARETTO_SPARK_JAVA_OPTIONS = env_str("LAZARETTO_SPARK_JAVA_OPTIONS", "")
# The niceness the Spark drivers and the Spark Connect server run at (0 to
# 19; their JVMs inherit it): on a host they share with delivery workers,
# deliveries get the processor first (workers.spark.session.yield_to_deliveries).
LAZARETTO_SPARK_NICENESS = env_int("LAZARETTO_SPARK_NICENESS", 10, minimum=0, maximum=19)
# The HA pair (broker.ha; `python manage.py broker_node --name NAME`). A
# node's DATABASE_URL is its own PostgreSQL server; applications list both
# servers: postgres://u:p@a:5432,b:5432/db?target_session_attrs=read-write.
# Where this node answers heartbeats and commands, and where its peer does
# (empty: no peer, one node alone).
HA_LISTEN = env_address("HA_LISTEN", "127.0.0.1:7401")
HA_PEER = env_address("HA_PEER", "")
# The peer's PostgreSQL server (a superuser or a role with REPLICATION and
# pg_rewind's grants): streaming, rewinding and cloning read from it.
HA_PEER_DATABASE_URL = env_optional_database("HA_PEER_DATABASE_URL")
# The node's own server: with HA_PGDATA the node starts, stops, rewinds and
# clones it (PostgreSQL's tools in HA_PG_BINDIR, run as HA_PG_OS_USER when
# the node runs as root, with HA_PG_OPTIONS added to `postgres`'s command
# line and its log in HA_PG_LOG); without, it can only promote it.
HA_PGDATA = env_path("HA_PGDATA", Path(), base=BASE_DIR) if env_str("HA_PGDATA", "") else None
HA_PG_BINDIR = (
    env_path("HA_PG_BINDIR", Path(), base=BASE_DIR) if env_str("HA_PG_BINDIR", "") else None
)
HA_PG_OS_USER = env_str("HA_PG_OS_USER", "")
HA_PG_OPTIONS = env_str("HA_PG_OPTIONS", "")
HA_PG_LOG = env_file("HA_PG_LOG", Path(), base=BASE_DIR) if env_str("HA_PG_LOG", "") else None
HA_HEARTBEAT_INTERVAL = env_float("HA_HEARTBEAT_INTERVAL", 1.0)
# A standby that has not heard from its primary for this long (and cannot
# reach its PostgreSQL, or has fenced it) takes over.
HA_HEARTBEAT_TIMEOUT = env_float("HA_HEARTBEAT_TIMEOUT", 10.0)
# How long a starting node waits for its peer before it starts as primary.
HA_DISCOVERY_TIMEOUT = env_float("HA_DISCOVERY_TIMEOUT", 30.0)
# standalone: start as primary at once, without waiting for the peer.
HA_STARTUP_MODE = env_choice("HA_STARTUP_MODE", "auto", ("auto", "standalone"))
# Signs the nodes' heartbeats and commands; blank: derived from SECRET_KEY.
HA_SECRET = env_str("HA_SECRET", "")
# The pair's witness (broker.ha.witness): a Redis both nodes reach, where the
# primary holds a lease and every change of primary is granted. By default
# the Redis the workers use, which the applications see too.
HA_WITNESS_URL = env_redis_url("HA_WITNESS_URL", CELERY_BROKER_URL)

# No caller waits on a dead or frozen server (broker.store.deadline): a web
# request's waits on the store end after this many seconds together, and each
# of a worker's waits after this many seconds, with `store_unavailable`; the
# server stops the abandoned statement within a second. The TCP settings find
# a dead peer or a cut link within the same time, and a server that does not
# let a session in within `connect_timeout` is passed over for the next host
# of a multi-host DATABASE_URL.
LAZARETTO_STORE_TIMEOUT_SECONDS = env_float(
    "LAZARETTO_STORE_TIMEOUT_SECONDS", HA_HEARTBEAT_TIMEOUT, minimum=1.0
)
DATABASES["default"]["OPTIONS"] = {
    "connect_timeout": 2,
    "keepalives": 1,
    "keepalives_idle": max(1, int(LAZARETTO_STORE_TIMEOUT_SECONDS / 3)),
    "keepalives_interval": 1,
    "keepalives_count": 3,
    "tcp_user_timeout": int(LAZARETTO_STORE_TIMEOUT_SECONDS * 1000),
    "options": "-c client_connection_check_interval=1000",
    # What DATABASE_URL says wins.
    **DATABASES["default"]["OPTIONS"],
}

# The primary's duties: the node that is primary sends these as Celery tasks,
# each carrying the pair's epoch (`celery beat` can send the same schedule
# where no broker node runs; its tasks carry no epoch).
LAZARETTO_PRIMARY_DUTIES = {
    "sweep": {
        "task": "lazaretto.sweep",
        "schedule": LAZARETTO_SWEEP_INTERVAL_SECONDS,
        "options": {"expires": 5 * LAZARETTO_SWEEP_INTERVAL_SECONDS},
    },
    "dispatch": {
        "task": "lazaretto.dispatch",
        "schedule": LAZARETTO_DISPATCH_INTERVAL_SECONDS,
        "options": {"expires": 5 * LAZARETTO_DISPATCH_INTERVAL_SECONDS},
    },
    "heartbeat": {
        "task": "lazaretto.heartbeat",
        "schedule": 10.0,
        "options": {"expires": 10.0},
    },
    # Dead-letter queues with an active rules table; a scan only looks at
    # messages whose RETRYINT has passed.
    "dead-letter-scan": {
        "task": "lazaretto.dead_letter_scan",
        "schedule": LAZARETTO_DEAD_LETTER_SCAN_SECONDS,
        "options": {"expires": 2 * LAZARETTO_DEAD_LETTER_SCAN_SECONDS},
    },
    # Queued bulk and replay jobs whose start Redis refused or lost.
    "start-jobs": {
        "task": "lazaretto.start_jobs",
        "schedule": LAZARETTO_JOB_START_INTERVAL_SECONDS,
        "options": {"expires": 2 * LAZARETTO_JOB_START_INTERVAL_SECONDS},
    },
    # The archive, once a day (python manage.py archive run does the same).
    "archive": {
        "task": "lazaretto.archive",
        "schedule": crontab(hour=3, minute=17),
        "options": {"expires": 3600},
    },
    # Queues past an alert threshold, and back (one check at a time).
    "check-alerts": {
        "task": "lazaretto.check_alerts",
        "schedule": LAZARETTO_ALERT_CHECK_INTERVAL_SECONDS,
        "options": {"expires": 2 * LAZARETTO_ALERT_CHECK_INTERVAL_SECONDS},
    },
    # Poison alarms and alerts due to be posted to their webhook (one runner
    # at a time).
    "notify-alarms": {
        "task": "lazaretto.notify_alarms",
        "schedule": LAZARETTO_ALARM_NOTIFY_INTERVAL_SECONDS,
        "options": {"expires": 2 * LAZARETTO_ALARM_NOTIFY_INTERVAL_SECONDS},
    },
}
CELERY_BEAT_SCHEDULE = LAZARETTO_PRIMARY_DUTIES
# `celery beat` spreads the duties over the second as a broker node does.
CELERY_BEAT_SCHEDULER = "workers.duties:PhasedScheduler"
