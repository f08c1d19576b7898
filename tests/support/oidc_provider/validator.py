"""The claims the provider gives: who the user is, and their groups."""

from __future__ import annotations

from typing import Any

from oauth2_provider.oauth2_validators import OAuth2Validator


class GroupsValidator(OAuth2Validator):
    oidc_claim_scope = {
        **OAuth2Validator.oidc_claim_scope,
        "preferred_username": "profile",
        "groups": "profile",
    }

    def get_additional_claims(self, request: Any) -> dict[str, Any]:
        user = request.user
        return {
            "preferred_username": user.username,
            "email": user.email,
            "groups": sorted(group.name for group in user.groups.all()),
        }
