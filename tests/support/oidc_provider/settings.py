"""The provider's settings, from the environment its test sets:
IDP_DATABASE_URL, IDP_ISSUER (http://127.0.0.1:PORT/o), IDP_RSA_KEY (PEM)."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

_database = urlsplit(os.environ["IDP_DATABASE_URL"])

SECRET_KEY = "the-test-provider-only"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "oauth2_provider",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.support.oidc_provider.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [Path(__file__).parent / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
            ]
        },
    }
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _database.path.lstrip("/"),
        "USER": _database.username or "",
        "PASSWORD": _database.password or "",
        "HOST": _database.hostname or "",
        "PORT": _database.port or "",
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
LOGIN_URL = "/accounts/login/"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # a test's users
OAUTH2_PROVIDER = {
    "OIDC_ENABLED": True,
    "OIDC_ISS_ENDPOINT": os.environ["IDP_ISSUER"],
    "OIDC_RSA_PRIVATE_KEY": os.environ["IDP_RSA_KEY"],
    "PKCE_REQUIRED": True,
    "SCOPES": {
        "openid": "OpenID Connect",
        "profile": "Your name",
        "email": "Your e-mail address",
    },
    "OAUTH2_VALIDATOR_CLASS": "tests.support.oidc_provider.validator.GroupsValidator",
}
