"""The worked example in the package docstring runs, so it cannot go stale."""

import doctest

import tickwheel.wheel


def test_package_docstring_example_runs() -> None:
    results = doctest.testmod(tickwheel.wheel, raise_on_error=False, verbose=False)
    assert results.attempted >= 10
    assert results.failed == 0
