"""What ``tickwheel audit --json`` and the chaos audit print is the JSON alone: Spark's JVM,
a child process, inherits the command's stdout, and HotSpot writes its warnings there (CI saw
"CodeCache is full" before the summary). `jvm_output_to_stderr` sends a child's stdout to
stderr while the command's own prints still reach stdout."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tickwheel.audit import jvm_output_to_stderr

pytestmark = pytest.mark.cluster  # starts a child process, as Spark does


def test_a_child_process_writes_to_stderr_and_the_command_to_stdout(
        capfd: pytest.CaptureFixture[str]) -> None:
    with jvm_output_to_stderr():
        subprocess.run([sys.executable, "-c", "print('[warning][codecache] full')"], check=True)
        print('{"verdict": "clean"}')
    print("after")
    out, err = capfd.readouterr()
    assert out == '{"verdict": "clean"}\nafter\n'
    assert err == "[warning][codecache] full\n"


def test_stdout_is_restored_when_the_command_fails(
        capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RuntimeError), jvm_output_to_stderr():
        raise RuntimeError("spark failed")
    subprocess.run([sys.executable, "-c", "print('child')"], check=True)
    assert capfd.readouterr().out == "child\n"
