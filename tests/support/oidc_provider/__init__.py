"""An OpenID Connect provider for the single sign-on tests: a Django project
of its own (django-oauth-toolkit with OpenID Connect on), run in its own
process with its own PostgreSQL database (tests/test_sso_provider.py).

Its users sign in on its own login page; the ID tokens and userinfo carry
``preferred_username``, ``email`` and ``groups`` (their Django groups'
names), signed RS256 with the key in ``IDP_RSA_KEY``."""
