# Lazaretto images, from three stages:
#   build    requirements.txt's packages in a virtualenv (none of the development
#            and test requirements);
#   runtime  the application without Java: the console (gunicorn) by default, the
#            Celery workers and the broker node; its pipeline worker runs the Spark
#            jobs as clients of a Spark Connect server (SPARK_REMOTE);
#   spark    runtime plus Java and PostgreSQL's JDBC driver: the Spark Connect
#            server (python -m workers.spark.connect_server serve), or a pipeline
#            worker whose jobs run a driver of their own (SPARK_MASTER, no
#            SPARK_REMOTE). `docker build .` builds this last stage.
# docker-compose.yml builds runtime for the application and spark for the server.

# Debian 12 (bookworm): its openjdk-17-jre-headless runs Spark 4 (Java 17 or
# later); Debian 13 ships no Java 17.
FROM python:3.11-slim-bookworm AS build

ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
COPY requirements.txt /tmp/requirements.txt
RUN /opt/venv/bin/pip install -r /tmp/requirements.txt


FROM python:3.11-slim-bookworm AS runtime

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH \
    DUMP_DIR=/app/var/dumps \
    ARCHIVE_DIR=/app/var/archive

RUN groupadd --system --gid 10001 app \
    && useradd --system --uid 10001 --gid app --home-dir /app --shell /usr/sbin/nologin app

COPY --from=build /opt/venv /opt/venv
WORKDIR /app
# .dockerignore keeps the tests, the benches, the docs and local state out.
COPY --chown=app:app . /app

# Static files are collected at build time (whitenoise serves them). Settings
# need some values to import; these are build-only placeholders, never used at run time.
RUN SECRET_KEY=build-only-placeholder \
    DEBUG=false \
    ALLOWED_HOSTS=localhost \
    DATABASE_URL=postgres://build:build@localhost:5432/build \
    CELERY_BROKER_URL=redis://localhost:6379/0 \
    python manage.py collectstatic --noinput \
    && mkdir -p /app/var/dumps /app/var/archive \
    && chown -R app:app /app

USER app

EXPOSE 8000

# The console is healthy once /readyz answers 200 (the store and the broker
# reachable, no migration pending). The other services set their own check.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request as u; sys.exit(0 if u.urlopen('http://127.0.0.1:8000/readyz', timeout=4).status == 200 else 1)"]

# Gunicorn's processes: WEB_WORKERS (console/gunicorn_conf.py).
CMD ["gunicorn", "-c", "python:console.gunicorn_conf", "console.wsgi:application", "--bind", "0.0.0.0:8000"]


FROM runtime AS spark

# Spark's JVM: a Java runtime for PySpark and PostgreSQL's JDBC driver
# (SPARK_JDBC_JAR defaults to this package's jar), which the jobs' JDBC reads
# and writes load on the server that runs them.
USER root
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless libpostgresql-jdbc-java \
    && rm -rf /var/lib/apt/lists/*
USER app

# Spark Connect's port (workers.spark.connect_server serve --port).
EXPOSE 15002
