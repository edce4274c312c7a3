"""A process that imported torch ends with ``leave_now`` (parallel/process_exit.py): its
printed and logged output arrive whole, with its exit code, without torch's teardown."""
import subprocess
import sys

_SCRIPT = """
import logging, sys, time
import torch.distributed.pipelining
from meshscope.parallel.process_exit import leave_now

log = logging.getLogger("job")
log.addHandler(logging.FileHandler(sys.argv[1]))
log.warning("the last log line")
print("no newline at the end", end="")
print("on stderr", file=sys.stderr, end="")
if sys.argv[2] == "fast":
    leave_now(3)
sys.exit(3)
"""


def _run(tmp_path, how):
    log = tmp_path / f"{how}.log"
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(log), how],
                          capture_output=True, text=True, timeout=120)
    return proc, log.read_text()


def test_leave_now_keeps_the_output_and_the_exit_code(tmp_path):
    """The same script ending through ``sys.exit`` is the control."""
    fast, fast_log = _run(tmp_path, "fast")
    slow, slow_log = _run(tmp_path, "slow")
    for proc, log in ((fast, fast_log), (slow, slow_log)):
        assert proc.returncode == 3
        assert proc.stdout == "no newline at the end"
        assert proc.stderr == "on stderr"
        assert log == "the last log line\n"
