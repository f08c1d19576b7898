"""A bad setting stops start-up with a message naming the variable."""

import os

import pytest

from tests.support.processes import manage, refused_at_start_up


@pytest.mark.slow
@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("DEBUG", "maybe"),
        ("DATABASE_URL", "mysql://user@host/db"),
        ("DATABASE_URL", "not a url"),
        ("CELERY_BROKER_URL", "amqp://guest@localhost//"),
        ("CELERY_BROKER_URL", "redis://host:port/0"),
        ("SPARK_MASTER", "everywhere"),
        ("SPARK_REMOTE", "http://127.0.0.1:15002"),
        ("SPARK_REMOTE", "sc://127.0.0.1:port"),
        ("ALLOWED_HOSTS", "a,,b"),
        ("API_MAX_BODY_BYTES", "lots"),
        ("LAZARETTO_API_RATE", "fast"),
        ("LAZARETTO_API_RATE", "0/min"),
        ("LAZARETTO_API_RATE", "10/fortnight"),
        ("CACHE_URL", "memcached://cache:11211"),
        ("LAZARETTO_SPARK_NICENESS", "20"),
    ],
)
def test_a_bad_value_stops_start_up_naming_the_variable(variable, value):
    error = refused_at_start_up("check", **{variable: value})

    assert f"{variable}: " in error
    assert repr(value) in error


@pytest.mark.slow
def test_a_short_alarm_webhook_secret_stops_start_up_without_saying_it():
    error = refused_at_start_up("check", LAZARETTO_ALARM_WEBHOOK_SECRET="short-secret")

    assert "LAZARETTO_ALARM_WEBHOOK_SECRET: a secret of 12 characters is too short" in error
    assert "short-secret" not in error


@pytest.mark.slow
def test_a_file_as_dump_dir_is_refused(tmp_path):
    a_file = tmp_path / "dumps"
    a_file.write_text("not a directory")

    error = refused_at_start_up("check", DUMP_DIR=str(a_file))

    assert "DUMP_DIR: " in error


@pytest.mark.slow
def test_without_debug_a_secret_key_is_required():
    env = {key: value for key, value in os.environ.items() if key != "SECRET_KEY"}
    error = refused_at_start_up("check", environ={**env, "DEBUG": "0"})

    assert "SECRET_KEY: not set" in error


@pytest.mark.slow
def test_good_values_start(tmp_path):
    result = manage(
        "check",
        SPARK_MASTER="local[2]",
        DUMP_DIR=str(tmp_path),
        ALLOWED_HOSTS="lazaretto.example.com,localhost",
    )

    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        ("sc://127.0.0.1:15002", True),
        ("sc://spark-connect", True),
        ("sc://spark.example.com:443/;use_ssl=true;token=abc", True),
        ("sc://[::1]:15002", True),
        ("http://127.0.0.1:15002", False),
        ("sc://:15002", False),
        ("sc://host:0", False),
        ("sc://host:99999", False),
        ("sc://host:15002/path", False),
        ("sc://host name:15002", False),
        ("local[*]", False),
    ],
)
def test_spark_remote_is_a_spark_connect_url(monkeypatch, value, valid):
    from django.core.exceptions import ImproperlyConfigured

    from console.env import env_spark_remote

    monkeypatch.setenv("SPARK_REMOTE", value)
    if valid:
        assert env_spark_remote("SPARK_REMOTE") == value
    else:
        with pytest.raises(
            ImproperlyConfigured, match=r"^SPARK_REMOTE: .* expected sc://host:port"
        ):
            env_spark_remote("SPARK_REMOTE")


def test_an_unset_or_empty_spark_remote_is_none(monkeypatch):
    from console.env import env_spark_remote

    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    assert env_spark_remote("SPARK_REMOTE") == ""
    monkeypatch.setenv("SPARK_REMOTE", " ")
    assert env_spark_remote("SPARK_REMOTE") == ""


@pytest.mark.parametrize(
    ("broker", "cache"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/1"),
        ("redis://:secret@redis:6380/4", "redis://:secret@redis:6380/5"),
        ("redis://redis:6379", "redis://redis:6379/1"),
        ("redis://redis:6379/15", "redis://redis:6379/0"),
    ],
)
def test_the_cache_defaults_to_the_brokers_redis_one_database_up(broker, cache):
    from console.env import next_redis_database

    assert next_redis_database(broker) == cache


def test_a_node_connects_with_the_libpq_options_of_the_database_setting_only(settings):
    from psycopg.conninfo import conninfo_to_dict

    from broker.ha.postgres import conninfo_of

    database = {
        **settings.DATABASES["default"],
        "OPTIONS": {"prepare_threshold": 5, "pool": {"min_size": 2}, "sslmode": "disable"},
    }

    params = conninfo_to_dict(conninfo_of(database, application_name="node"))

    assert params["sslmode"] == "disable"
    assert params["application_name"] == "node"
    assert "prepare_threshold" not in params
    assert "pool" not in params


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("-1", "from 0 to 19"),
        ("20", "from 0 to 19"),
        ("ten", "a whole number"),
        ("1.5", "a whole number"),
    ],
)
def test_a_bounded_number_is_refused_outside_its_bounds(monkeypatch, value, problem):
    from django.core.exceptions import ImproperlyConfigured

    from console.env import env_int

    monkeypatch.setenv("LAZARETTO_SPARK_NICENESS", value)
    with pytest.raises(ImproperlyConfigured) as refused:
        env_int("LAZARETTO_SPARK_NICENESS", 10, minimum=0, maximum=19)
    assert str(refused.value).startswith(f"LAZARETTO_SPARK_NICENESS: '{value}' is not valid")
    assert problem in str(refused.value)


@pytest.mark.parametrize("value", ["0", "19", ""])
def test_a_bounded_number_takes_its_bounds_and_its_default_when_unset(monkeypatch, value):
    from console.env import env_int

    monkeypatch.setenv("LAZARETTO_SPARK_NICENESS", value)
    assert env_int("LAZARETTO_SPARK_NICENESS", 10, minimum=0, maximum=19) == int(value or 10)
