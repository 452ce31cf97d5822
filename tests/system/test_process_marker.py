"""The integ-marker rule itself (support/process_check.py), run on a small test module of its own."""
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

INNER = '''
import subprocess, sys
import pytest

def test_unmarked_starts_a_process():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

@pytest.mark.integ
def test_marked_starts_a_process():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

def test_unmarked_starts_nothing():
    assert 1 + 1 == 2

def test_unmarked_looks_up_a_library():  # what CUDA's first load does through ctypes
    import ctypes.util
    ctypes.util.find_library("c")
'''


@pytest.mark.integ  # its inner tests start processes
def test_an_unmarked_test_that_starts_a_process_fails_naming_it(pytester):
    pytester.syspathinsert(Path(__file__).parents[1] / "support")
    pytester.makeconftest("import pytest, process_check\n"
                          "_rule = pytest.fixture(autouse=True)(process_check.needs_integ_marker)\n")
    pytester.makeini("[pytest]\nmarkers =\n    integ: starts processes\n")
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest("-q", "-p", "no:cacheprovider")
    # the rule is checked as the test ends: the unmarked one errors at its teardown, the run fails
    result.assert_outcomes(passed=4, errors=1)
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*test_unmarked_starts_a_process*starts processes*not marked integ*"])
