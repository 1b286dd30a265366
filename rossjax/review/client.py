"""The reviewer's client: rossjax.openai_api's ChatClient under the names review has always
exported (`ReviewerClient`, `ReviewerError`), so imports from here keep working. The client
itself, and what it guarantees against a hostile endpoint, is rossjax/openai_api/client.py.
"""

from __future__ import annotations

from rossjax.openai_api.client import (
    DEFAULT_BASE_URL,
    REASK,
    ChatClient,
    ChatError,
    Reply,
    parse_extra_body,
)

__all__ = ["DEFAULT_BASE_URL", "REASK", "Reply", "ReviewerClient", "ReviewerError",
           "parse_extra_body"]

ReviewerError = ChatError


class ReviewerClient(ChatClient):
    """A ChatClient whose messages name the reviewer ("reviewer endpoint URL failed ...")."""

    def __init__(self, *args, name: str = "reviewer", **kwargs):
        super().__init__(*args, name=name, **kwargs)
