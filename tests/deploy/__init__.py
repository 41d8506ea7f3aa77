"""A package, so that the tests import the renderer beside them (pytest runs them with
``--import-mode=importlib``, which puts no test folder on ``sys.path``)."""
