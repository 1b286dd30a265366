"""Moved to rossjax/openai_api/transport.py; this name stays importable."""

from rossjax.openai_api.transport import (
                                          Connection,
                                          Secrets,
                                          Timeout,
                                          TooLarge,
                                          basic_auth,
                                          display_url,
)

__all__ = ["Connection", "Secrets", "Timeout", "TooLarge", "basic_auth", "display_url"]
