"""A mutation campaign for the security protections (docs/security.md, "Proven by"): each
protection removed on its own (`mutants`), the attack tests that must then fail (`__main__`)."""
