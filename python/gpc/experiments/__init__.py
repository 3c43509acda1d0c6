"""Reproductions of the papers' experiments (callable functions; slow ones are not run by the tests)."""
