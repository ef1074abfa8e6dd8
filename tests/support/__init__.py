"""Helpers shared by the tests (models, simulators, proxies, oracles), kept apart from the
test files so pytest's collection and a reader both see which modules are tests.

Import them as ``from support.gradcheck import ...``: pytest puts tests/ on sys.path (the
folder above the first one without an ``__init__.py``), and subprocesses the tests start put
it there themselves.
"""
