"""The tests' toolkit: one model builder (models.py), the suites' repositories (repositories.py),
one server in a thread (server.py) and client helpers (clients.py)."""
