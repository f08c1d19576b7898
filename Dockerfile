# Lazaretto image: the console (gunicorn) by default; the same image runs the
# Celery worker/beat and the broker nodes (see docker-compose.yml).

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DUMP_DIR=/app/var/dumps \
    ARCHIVE_DIR=/app/var/archive

RUN groupadd --system --gid 10001 app \
    && useradd --system --uid 10001 --gid app --home-dir /app --shell /usr/sbin/nologin app

WORKDIR /app

# The Spark jobs: a Java runtime for PySpark and PostgreSQL's JDBC driver
# (SPARK_JDBC_JAR defaults to this package's jar).
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless libpostgresql-jdbc-java \
    && rm -rf /var/lib/apt/lists/*

COPY requirements.txt /app/requirements.txt
RUN pip install -r /app/requirements.txt

# .dockerignore keeps local state (.venv, var, caches) out of the image.
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

CMD ["gunicorn", "-c", "python:console.gunicorn_conf", "console.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "3"]
