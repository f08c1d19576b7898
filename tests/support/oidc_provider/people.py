"""The provider's users and the console's client, made and changed by the
tests: ``python -m tests.support.oidc_provider.people COMMAND ...`` with the
provider's settings.

    client CLIENT_ID SECRET REDIRECT_URI
    user NAME PASSWORD [GROUP ...]     (its groups: exactly these)
"""

from __future__ import annotations

import sys

import django


def main(argv: list[str]) -> None:
    django.setup()
    from django.contrib.auth.models import Group, User
    from oauth2_provider.models import Application

    command, *args = argv
    if command == "client":
        client_id, secret, redirect_uri = args
        Application.objects.update_or_create(
            client_id=client_id,
            defaults={
                "name": "Lazaretto",
                "client_secret": secret,
                "client_type": Application.CLIENT_CONFIDENTIAL,
                "authorization_grant_type": Application.GRANT_AUTHORIZATION_CODE,
                "redirect_uris": redirect_uri,
                "algorithm": Application.RS256_ALGORITHM,
                "skip_authorization": True,
            },
        )
    elif command == "user":
        name, password, *groups = args
        user, _ = User.objects.get_or_create(
            username=name, defaults={"email": f"{name}@acme.example"}
        )
        user.set_password(password)
        user.save()
        user.groups.set(Group.objects.get_or_create(name=group)[0] for group in groups)
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
