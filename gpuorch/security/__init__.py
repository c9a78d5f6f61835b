"""Trust on the bus: identities, their permissions, credentials on disk (docs/security.md)."""

from .bundle import Bundle, Tls, generate, load_identities, public_key_of, read_seed
from .model import EVENT_PUBLISHERS, ROLES, SERVICES, durables, inbox_prefix, permissions

__all__ = [
    "EVENT_PUBLISHERS", "ROLES", "SERVICES", "Bundle", "Tls", "durables", "generate", "inbox_prefix",
    "load_identities", "permissions", "public_key_of", "read_seed",
]
